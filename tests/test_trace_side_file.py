"""The side file's block-aligned writes: direct for large flushes, page cache for small ones, same bytes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kproxy.obs import trace_side_file
from kproxy.obs.trace_side_file import ALIGN, DIRECT_MIN_BYTES, DirectSideFile, SideFile


def _flushes() -> list[list[bytes]]:
    sizes = [[100], [DIRECT_MIN_BYTES + 7], [3, 5], [ALIGN], [1024 * 1024 * 2 + 11, 9], [1], [DIRECT_MIN_BYTES * 3]]
    return [[os.urandom(n) for n in flush] for flush in sizes]


def _write(side: SideFile, flushes: list[list[bytes]]) -> bytes:
    expected = b""
    for flush in flushes:
        side.write([memoryview(b) for b in flush], sum(map(len, flush)))
        expected += b"".join(flush)
        assert side.written == len(expected)
    return expected


def test_direct_side_file_holds_exactly_the_bytes_written(tmp_path: Path) -> None:
    """Small and large flushes alternate (page cache and direct), across the copy buffer's size: the
    file reads back as their concatenation, at its logical size once closed."""
    side = SideFile.open(tmp_path / "t.records")
    if not side.direct:
        pytest.skip("this file system has no direct I/O")
    expected = _write(side, _flushes())
    side.close()
    assert (tmp_path / "t.records").read_bytes() == expected


def test_a_killed_writer_leaves_every_written_byte_readable(tmp_path: Path) -> None:
    """Without close (a killed proxy) the file holds every byte written, then fewer than ALIGN zeros."""
    path = tmp_path / "k.records"
    side = SideFile.open(path)
    if not side.direct:
        pytest.skip("this file system has no direct I/O")
    expected = _write(side, _flushes()[:3])
    data = path.read_bytes()
    assert data[: len(expected)] == expected
    assert len(data) - len(expected) < ALIGN and not data[len(expected):].strip(b"\0")


def test_without_direct_io_the_page_cache_writes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A platform or file system refusing O_DIRECT gets the page-cache side file, same bytes."""
    monkeypatch.setattr(trace_side_file.os, "O_DIRECT", 0, raising=False)
    side = SideFile.open(tmp_path / "p.records")
    assert type(side) is SideFile
    expected = _write(side, _flushes())
    side.close()
    assert (tmp_path / "p.records").read_bytes() == expected


def test_a_refused_direct_write_goes_on_through_the_page_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A file system that opens with O_DIRECT but refuses its writes (EINVAL): written through the page cache."""
    side = SideFile.open(tmp_path / "r.records")
    if not side.direct:
        pytest.skip("this file system has no direct I/O")
    assert isinstance(side, DirectSideFile)
    real = os.pwrite

    def pwrite(fd: int, data: object, offset: int) -> int:
        if fd == side._direct_fd:  # noqa: SLF001
            raise OSError(22, "Invalid argument")
        return real(fd, data, offset)

    monkeypatch.setattr(trace_side_file.os, "pwrite", pwrite)
    expected = _write(side, _flushes())
    side.close()
    assert (tmp_path / "r.records").read_bytes() == expected
