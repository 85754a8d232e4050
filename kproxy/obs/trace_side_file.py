"""The side file's writes past the page cache: large ones with O_DIRECT, from one reused aligned buffer.

At level `records` every traced byte is written to the side file once and
read only by the analysis, later. Through the page cache that write was most
of a tracing proxy's extra CPU on batched produce (the kernel's copy into
page-cache pages, ext4's delayed allocation for each of them, and their
write-back): 0.35-0.4 ms of CPU per MiB with recycled pages, 1.8-2.1 ms with
fresh ones. A direct write from a buffer whose pages stay warm costs
0.1 ms per MiB, the copy into that buffer included (docs/performance.md).

Direct I/O needs the buffer, the file offset and the length aligned. Every
write, direct or not, therefore covers whole blocks: it starts at the block
holding the file's logical end, repeats the bytes already there (`_tail`),
and is padded with zeros to the next block. The next write overwrites the
padding, and closing truncates the file to its logical size, so a side file
closed normally holds exactly the bytes the events point at; one left by a
killed proxy may end in fewer than `ALIGN` zeros that no event points at.

Small writes (a flush of a lightly loaded proxy) go through the page cache,
on a second descriptor of the same file, so the writer may make them on the
event loop: a direct write waits for the disk. Whole blocks keep the kernel
from reading a partly overwritten block back first; its direct writes flush
and drop any cached page they overlap, so the two descriptors stay coherent.

Used on the trace's file thread alone (kproxy.obs.trace_io).
"""

from __future__ import annotations

import mmap
import os
from pathlib import Path

# Alignment of direct writes: the page size is a multiple of every block
# device's logical block size and of ext4's and xfs's usual block sizes.
ALIGN = mmap.PAGESIZE
# Flushes of at least this many side bytes are written directly.
DIRECT_MIN_BYTES = 64 * 1024
# The aligned buffer the bytes are copied into; large flushes go in pieces of
# its size. Each copy holds the interpreter lock (about 0.1 ms per MiB).
_CHUNK = 1024 * 1024
# Buffers per writev (the kernel's IOV_MAX).
IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024


class SideFile:
    """A side file written through the page cache: one writev of the frames' own bytes per flush."""

    direct = False

    def __init__(self, path: Path) -> None:
        self._file = open(path, "xb", buffering=0)  # noqa: SIM115 - lives until rotation
        self.written = 0  # the file's logical size

    @staticmethod
    def open(path: Path) -> SideFile:
        """A side file at `path` (which must not exist), written directly where the file system allows."""
        try:
            return DirectSideFile(path)
        except DirectUnsupported:
            return SideFile(path)

    def fileno(self) -> int:
        """The descriptor whose page-cache pages the writer may write back and drop."""
        return self._file.fileno()

    def write(self, pending: list[memoryview], nbytes: int) -> None:
        """Append `pending` (`nbytes` in all) at the logical end; `pending` is consumed."""
        fd = self._file.fileno()
        while pending:
            views = pending[:IOV_MAX]
            n = os.writev(fd, views)
            self.written += n
            # A regular file takes the whole vector; a short write leaves the rest for the next call.
            done = 0
            for view in views:
                if n < len(view):
                    break
                n -= len(view)
                done += 1
            if n:
                pending[done] = pending[done][n:]
            del pending[:done]

    def close(self) -> None:
        self._file.close()


class DirectUnsupported(OSError):
    """The file system refuses O_DIRECT (tmpfs before Linux 6.6, some FUSE and network ones)."""


class DirectSideFile(SideFile):
    """A side file whose large writes bypass the page cache (see the module docstring)."""

    direct = True

    def __init__(self, path: Path) -> None:
        flag = getattr(os, "O_DIRECT", 0)
        if not flag:
            raise DirectUnsupported("no O_DIRECT on this platform")
        # "x" as the buffered side file: never overwrite an existing trace.
        try:
            self._direct_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | flag, 0o644)
        except OSError as exc:
            if exc.errno == 22:  # EINVAL: this file system does not do direct I/O
                raise DirectUnsupported(str(exc)) from None
            raise
        try:
            self._file = open(path, "r+b", buffering=0)  # noqa: SIM115 - the small writes' descriptor
        except BaseException:
            os.close(self._direct_fd)
            raise
        self.written = 0
        self._tail = b""  # the logical end's partial block, rewritten by the next write
        self._buffer = mmap.mmap(-1, _CHUNK)  # page-aligned; reused, so its pages stay warm
        self._direct_ok: bool | None = None  # None until the first direct write says

    def write(self, pending: list[memoryview], nbytes: int) -> None:
        direct = nbytes >= DIRECT_MIN_BYTES and self._direct_ok is not False
        fd = self._direct_fd if direct else self._file.fileno()
        buffer = memoryview(self._buffer)
        try:
            start = self.written - len(self._tail)  # a block boundary
            fill = len(self._tail)
            buffer[:fill] = self._tail
            for view in pending:
                view = memoryview(view).cast("B")
                while view:
                    n = min(len(view), _CHUNK - fill)
                    buffer[fill : fill + n] = view[:n]
                    fill += n
                    view = view[n:]
                    if fill == _CHUNK:
                        fd = self._write_blocks(fd, buffer, _CHUNK, start)
                        start += _CHUNK
                        fill = 0
            self.written = start + fill
            keep = fill % ALIGN
            if fill:
                padded = fill + (ALIGN - keep) % ALIGN
                buffer[fill:padded] = bytes(padded - fill)
                self._write_blocks(fd, buffer, padded, start)
            self._tail = bytes(buffer[fill - keep : fill])
        finally:
            buffer.release()
        pending.clear()

    def _write_blocks(self, fd: int, buffer: memoryview, length: int, offset: int) -> int:
        """pwrite whole blocks; returns the descriptor to go on with (the buffered one if direct was refused)."""
        done = 0
        while done < length:
            try:
                done += os.pwrite(fd, buffer[done:length], offset + done)
            except OSError as exc:
                # A file system that opens with O_DIRECT but refuses the first write
                # (an alignment larger than a page): from then on through the page cache.
                if exc.errno != 22 or fd != self._direct_fd or self._direct_ok is not None:
                    raise
                self._direct_ok = False
                fd = self._file.fileno()
            else:
                if fd == self._direct_fd:
                    self._direct_ok = True
        return fd

    def close(self) -> None:
        try:
            os.ftruncate(self._file.fileno(), self.written)
        finally:
            os.close(self._direct_fd)
            self._file.close()
            self._buffer.close()
