"""The trace's output formats: where each batch goes (file, offset, rotation) and its bytes.

A sink lives on the proxy's event loop: it names and rotates the files,
lays out the side file of raw record batches, and encodes each batch of
events, in steps (`encode_steps`) the writer runs in the loop's idle time.
Every system call goes through `ops` (kproxy.obs.trace_io.FileOps), which
runs them in order on a thread of its own. The methods named `_io_*` run
there and touch only the file handles; everything else runs on the loop.
"""

from __future__ import annotations

import logging
import math
import os
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any, Literal

import orjson

from kproxy.obs.trace_files import TRACE_NAME
from kproxy.obs.trace_io import FileOps
from kproxy.obs.trace_segments import SUFFIX as SEGMENT_SUFFIX
from kproxy.obs.trace_segments import encode_rows_checked_steps, file_header, json_default
from kproxy.obs.trace_side_file import DIRECT_MIN_BYTES, SideFile

log = logging.getLogger(__name__)

Format = Literal["segments", "jsonl", "parquet"]
MiB = 1024 * 1024

# Side bytes written back and dropped from the page cache at a time (_Sink._io_recycle_side_pages).
SIDE_RECYCLE_BYTES = 8 * MiB
# Lines serialised between two steps of a JSONL batch.
_LINES_PER_STEP = 32


def trace_file_name(proxy_id: str, started_wall: float, seq: int, fmt: Format) -> str:
    """`trace-<proxy_id>-<UTC yyyymmddThhmmss>-<seq>.<fmt>`; seq is zero-padded so names sort."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started_wall))
    suffix = SEGMENT_SUFFIX if fmt == "segments" else f".{fmt}"
    return f"trace-{proxy_id}-{stamp}-{seq:06d}{suffix}"


class Sink:
    """One output format: names files, rotates them, lays out side bytes, encodes batches.

    `rows`: whether batches are rows (lists in trace_schema.EVENT order) rather than dicts.
    """

    rows = False

    def __init__(self, directory: Path, proxy_id: str, fmt: Format, rotate_bytes: int, rotate_seconds: float,
                 ops: FileOps) -> None:
        self.directory = directory
        self.proxy_id = proxy_id
        self.fmt = fmt
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.ops = ops
        self.path: Path | None = None
        self.size = 0
        self.opened_mono = 0.0
        self.next_seq = self._first_free_seq()
        self.files: list[Path] = []
        self.side_files: list[Path] = []
        # The side file of the open trace file: raw record batches (level
        # `records`), appended and referenced by (name, offset, length) from
        # the events. Its bytes are always submitted before the segment that
        # references them, so a killed writer never leaves a dangling reference.
        self._side_open = False  # the open trace file's side file exists (from its first raw bytes)
        self._side_path: Path | None = None  # where that side file goes (set with each trace file)
        self._side_name = ""  # its name, made once (pathlib is slow per event)
        self.side_size = 0
        self._side_pending: list[memoryview] = []
        self._side_pending_size = 0
        # Frame buffers (kproxy.obs.trace_frame_pool) to give back once the side bytes queued so far are written.
        self._side_give_back: list[Any] = []
        # Regions already in the open side file, by (topic, partition, base offset, length, hash).
        self._side_index: dict[tuple, tuple[str, int]] = {}
        # File handles: the ops thread's alone.
        self._file: Any = None
        self._side: SideFile | None = None
        self._side_dropped = 0  # side bytes up to here are on disk and out of the page cache
        self._side_recycle = hasattr(os, "posix_fadvise")
        self._side_recycled = 0  # the loop's count: side bytes handed to a recycle so far

    def _first_free_seq(self) -> int:
        # A restarted proxy with the same id continues the sequence, so its
        # files never collide with (or sort before) the previous run's, its
        # rotated files compressed since (`.jsonl.gz`) included.
        seqs = [int(m["seq"]) for p in self.directory.iterdir()
                if (m := TRACE_NAME.match(p.name)) and m["proxy"] == self.proxy_id]
        return max(seqs, default=-1) + 1

    def _open(self) -> None:
        name = trace_file_name(self.proxy_id, time.time(), self.next_seq, self.fmt)
        self.next_seq += 1
        self.path = self.directory / name
        # The side file beside it, opened with its first raw bytes; named once here (pathlib is slow per event).
        self._side_path = self.path.with_suffix(".records")
        self._side_name = self._side_path.name
        self.size = 0
        self.opened_mono = time.monotonic()
        self.files.append(self.path)
        self._open_file(self.path)

    def seconds_to_rotation(self) -> float:
        """How long until the open file is due for time rotation (infinite with none open)."""
        if self.path is None:
            return math.inf
        return max(0.0, self.rotate_seconds - (time.monotonic() - self.opened_mono))

    def rotate_if_old(self) -> None:
        """Time rotation, checked on every wake so an idle file still gets closed (Parquet gets its footer)."""
        if self.path is not None and time.monotonic() - self.opened_mono >= self.rotate_seconds:
            self.close()

    def ensure_open(self) -> None:
        """A file to write into: the open one, or a new one.

        Files rotate only between batches (`commit`): a batch's events and the
        side bytes they point at always share one file, so each trace file is
        read (or moved, or deleted) with its own side file alone.
        """
        if self.path is None:
            self._open()

    def commit(self, payload: Any) -> None:
        """Write an encoded batch after the side bytes its events point at; then rotate a full or old file."""
        self.ensure_open()
        self.flush_side()
        self._write(payload)
        if (self.size + self.side_size >= self.rotate_bytes
                or time.monotonic() - self.opened_mono >= self.rotate_seconds):
            self.close()

    def close(self) -> None:
        if self.path is not None:
            self.flush_side()
            if self._side_open:
                self.ops.submit(self._io_close_side, on_loop=False)
                self._side_open = False
            self.side_size = 0
            self._side_recycled = 0
            self._side_index = {}
            self.ops.submit(self._io_close_file, on_loop=False)
            self.path = None

    def side_file_now(self) -> str:
        """The name of the side file bytes stored now go to (kproxy.obs.trace_records.Store)."""
        self.ensure_open()
        return self._side_name

    def store_raw(self, data: memoryview, key: tuple | None = None) -> tuple[str, int]:
        """Queue raw record batches for the side file; returns (file name, offset) they will have.

        With a key, bytes the open side file already holds under it are not written again.
        """
        self.ensure_open()
        if key is not None:
            known = self._side_index.get(key)
            if known is not None:
                return known
        if not self._side_open:
            side = self._side_path
            assert side is not None  # ensure_open named it
            self._side_open = True
            self.side_files.append(side)
            self.ops.submit(self._io_open_side, side, on_loop=False)
        offset = self.side_size + self._side_pending_size
        self._side_pending.append(data)
        self._side_pending_size += len(data)
        if key is not None:
            self._side_index[key] = (self._side_name, offset)
        return self._side_name, offset

    def give_back_after_write(self, buffer: Any) -> None:
        """Return a frame's buffer to its pool once every side byte queued so far (its batches) is written."""
        self._side_give_back.append(buffer)

    def flush_side(self) -> None:
        """Submit the queued side bytes (before any segment or line that references them)."""
        pending = self._side_pending
        give_back, self._side_give_back = self._side_give_back, []
        if not pending:
            if give_back:  # after earlier writes that may still hold its bytes
                self.ops.submit(self._io_give_back, give_back)
            return
        size = self._side_pending_size
        self._side_pending = []
        self._side_pending_size = 0
        self.side_size += size
        # A direct write waits for the disk: never on the event loop.
        self.ops.submit(self._io_write_side, pending, size, give_back, nbytes=size, on_loop=size < DIRECT_MIN_BYTES)
        if self._side_recycle and self.side_size - self._side_recycled >= SIDE_RECYCLE_BYTES:
            # Waits for the disk: never run on the event loop.
            self.ops.submit(self._io_recycle_side_pages, on_loop=False)
            self._side_recycled = self.side_size

    def encode_steps(self, events: list) -> Generator[None, None, tuple[Any, int]]:
        """Encode a batch in steps; returns (payload for `commit`, events kept)."""
        raise NotImplementedError

    def _write(self, payload: Any) -> None:
        """Hand an encoded batch to the file thread (commit has opened the file and written its side bytes)."""
        raise NotImplementedError

    def _open_file(self, path: Path) -> None:
        raise NotImplementedError

    # ---- the ops thread ------------------------------------------------------

    def _io_open_side(self, path: Path) -> None:
        self._side = SideFile.open(path)
        self._side_dropped = 0

    def _io_close_side(self) -> None:
        self._side.close()
        self._side = None

    def _io_close_file(self) -> None:
        self._file.close()
        self._file = None

    def _io_write(self, data: bytes) -> None:
        view = memoryview(data)
        while view:  # a regular file takes it in one go; loop for the odd short write
            n = self._file.write(view)
            view = view[n:]

    def _io_write_side(self, pending: list[memoryview], nbytes: int, give_back: list[Any]) -> None:
        self._side.write(pending, nbytes)
        self._io_give_back(give_back)

    @staticmethod
    def _io_give_back(buffers: list[Any]) -> None:
        for buffer in buffers:
            buffer.pool.give(buffer)

    def _io_recycle_side_pages(self) -> None:
        """Drop side bytes already on disk from the page cache, so new ones reuse its pages.

        Each side byte is written once and read only by the analysis, later.
        Left in the page cache, a run's side files take fresh pages for every
        byte, and a fresh page costs the writing thread far more than the copy
        into it: on this project's VMs 2 ms of CPU per MiB (0.5 GB/s), against
        0.2-0.3 ms per MiB through pages freed a moment ago. Writing back and
        dropping every SIDE_RECYCLE_BYTES keeps that working set to one
        window, and the trace no longer pushes other files (a broker's log on
        the same machine) out of the cache. The write-back waits for the disk
        on this thread, never on the event loop.
        """
        if not self._side_recycle or self._side is None:
            return
        fd = self._side.fileno()
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, self._side_dropped, self._side.written - self._side_dropped, os.POSIX_FADV_DONTNEED)
        except OSError as exc:  # a file system without either: keep writing, stop recycling
            log.debug("side file pages not recycled: %s", exc)
            self._side_recycle = False
        self._side_dropped = self._side.written


class JsonlSink(Sink):
    def _open_file(self, path: Path) -> None:
        self.ops.submit(self._io_open, path, on_loop=False)

    def _io_open(self, path: Path) -> None:
        # Unbuffered: a write() hands whole lines to the kernel, so the process
        # holds no half-written line of its own when it is killed. "x": never
        # overwrite an existing trace.
        self._file = open(path, "xb", buffering=0)  # noqa: SIM115 - lives until rotation

    def encode_steps(self, events: list) -> Generator[None, None, tuple[list[bytes], int]]:
        lines = []
        for i, event in enumerate(events, 1):
            try:
                lines.append(orjson.dumps(event, default=json_default) + b"\n")
            except TypeError as exc:
                log.error("trace event dropped, not serialisable: %s", exc)
            if i % _LINES_PER_STEP == 0:
                yield
        return lines, len(lines)

    def _write(self, payload: list[bytes]) -> None:
        data = b"".join(payload)
        self.ops.submit(self._io_write, data, nbytes=len(data))
        self.size += len(data)


class SegmentSink(Sink):
    """Fixed-layout columnar segments (kproxy/obs/trace_segments.py): one segment per batch."""

    rows = True

    def _open_file(self, path: Path) -> None:
        header = file_header()
        self.size = len(header)
        self.ops.submit(self._io_open, path, header, on_loop=False)

    def _io_open(self, path: Path, header: bytes) -> None:
        # Unbuffered, like JSONL: each segment reaches the kernel in one write().
        self._file = open(path, "xb", buffering=0)  # noqa: SIM115 - lives until rotation
        self._io_write(header)

    def encode_steps(self, events: list[list]) -> Generator[None, None, tuple[bytes, int]]:
        return encode_rows_checked_steps(events)

    def _write(self, payload: bytes) -> None:
        # One segment per batch (up to the writer's batch bound).
        self.ops.submit(self._io_write, payload, nbytes=len(payload))
        self.size += len(payload)


class ParquetSink(Sink):
    """A row group per batch; the file is readable once closed (its footer written)."""

    def __init__(self, *args: Any) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from kproxy.obs.trace_schema import arrow_schema

        self._pa, self._pq = pa, pq
        self._schema = arrow_schema()
        self._writer: Any = None
        super().__init__(*args)

    def _open_file(self, path: Path) -> None:
        self.ops.submit(self._io_open, path, on_loop=False)

    def _io_open(self, path: Path) -> None:
        self._file = open(path, "xb")  # noqa: SIM115 - lives until rotation
        self._writer = self._pq.ParquetWriter(self._file, self._schema)

    def _io_close_file(self) -> None:
        self._writer.close()  # writes the footer: only now is the file readable
        super()._io_close_file()

    def encode_steps(self, events: list[dict]) -> Generator[None, None, tuple[Any, int]]:
        table = self._to_table(events)
        yield
        return table, 0 if table is None else table.num_rows

    def _write(self, payload: Any) -> None:
        self.ops.submit(self._io_write_table, payload, nbytes=payload.nbytes, on_loop=False)  # encodes: not on the loop

    def _io_write_table(self, table: Any) -> None:
        # One row group per batch.
        self._writer.write_table(table, row_group_size=max(table.num_rows, 1))
        self._file.flush()
        # Known only once encoded: rotation by size reads it a batch late.
        self.size = self._file.tell()

    def _to_table(self, events: list[dict]):  # noqa: ANN202 - pyarrow imported lazily
        try:
            return self._pa.Table.from_pylist(events, schema=self._schema)
        except (self._pa.ArrowException, TypeError, ValueError):
            # Find the culprits one by one rather than losing the whole batch.
            good = []
            for event in events:
                try:
                    self._pa.Table.from_pylist([event], schema=self._schema)
                except (self._pa.ArrowException, TypeError, ValueError) as exc:
                    log.error("trace event dropped, does not fit the schema: %s", exc)
                else:
                    good.append(event)
            return self._pa.Table.from_pylist(good, schema=self._schema) if good else None


SINKS: dict[str, type[Sink]] = {"segments": SegmentSink, "jsonl": JsonlSink, "parquet": ParquetSink}
