"""Move bytes from one socket to another inside the kernel (Linux `splice`).

The body of a large response forwarded cut-through needs no look from the
proxy, so it goes broker socket -> pipe -> client socket with `os.splice`:
the bytes never enter Python, which is what lets a Python proxy keep up
with a direct consumer. Where `os.splice` does not exist the proxy copies
through user space as before (`available()` says which).
"""

from __future__ import annotations

import fcntl
import os

import trio

from kproxy.io import net

_FLAGS = getattr(os, "SPLICE_F_MOVE", 1) | getattr(os, "SPLICE_F_NONBLOCK", 2)
# A bigger pipe moves more per system call; the kernel may refuse (then 64 KiB).
PIPE_BYTES = 1024 * 1024
_F_SETPIPE_SZ = getattr(fcntl, "F_SETPIPE_SZ", 1031)
# Chunks (up to a pipe's worth each) moved without blocking before yielding to other tasks.
YIELD_EVERY_CHUNKS = 4


class SourceFailed(OSError):
    """Reading the source socket failed."""


class SinkFailed(OSError):
    """Writing the destination socket failed."""


def available() -> bool:
    return hasattr(os, "splice")


class SplicePipe:
    """One pipe per connection, reused for every spliced frame."""

    __slots__ = ("_read", "_write", "capacity")

    def __init__(self) -> None:
        self._read, self._write = os.pipe2(os.O_NONBLOCK | os.O_CLOEXEC)
        try:
            self.capacity = fcntl.fcntl(self._write, _F_SETPIPE_SZ, PIPE_BYTES)
        except OSError:
            self.capacity = 64 * 1024

    def close(self) -> None:
        for fd in (self._read, self._write):
            try:
                os.close(fd)
            except OSError:
                pass

    async def forward(self, src: trio.socket.SocketType, dst: trio.socket.SocketType, n: int, dst_lock: trio.Lock) -> None:
        """Move exactly n bytes from src to dst.

        Raises EOFError if src closes first, SourceFailed or SinkFailed if a side fails.
        dst_lock is held for the whole move, so nothing else writes to dst in
        between (the caller's frame stays whole on the wire); taken without a
        scheduler pass when it is free, as it nearly always is.
        """
        if dst_lock.locked():
            await dst_lock.acquire()
        else:
            dst_lock.acquire_nowait()
        try:
            await self._move(src, dst, n)
        finally:
            dst_lock.release()

    async def forward_locked(self, src: trio.socket.SocketType, dst: trio.socket.SocketType, n: int) -> None:
        """As forward, for a caller that already holds dst's lock."""
        await self._move(src, dst, n)

    async def _move(self, src: trio.socket.SocketType, dst: trio.socket.SocketType, n: int) -> None:
        # Descriptors are asked of the sockets at each call, never kept across
        # a wait: a socket another task closed meanwhile then fails (EBADF)
        # instead of its number, reused by a new connection, being spliced.
        unblocked = 0  # chunks moved since this task last let others run
        while n:
            try:
                moved = os.splice(src.fileno(), self._write, min(n, self.capacity), flags=_FLAGS)
            except BlockingIOError:
                unblocked = 0
                try:
                    await net.wait_readable(src)
                except OSError as exc:
                    raise SourceFailed(exc.errno, exc.strerror) from None
                continue
            except OSError as exc:
                raise SourceFailed(exc.errno, exc.strerror) from None
            if moved == 0:
                raise EOFError("the peer closed the connection inside a frame")
            n -= moved
            while moved:
                try:
                    moved -= os.splice(self._read, dst.fileno(), moved, flags=_FLAGS)
                except BlockingIOError:
                    unblocked = 0
                    try:
                        await net.wait_writable(dst)
                    except OSError as exc:
                        raise SinkFailed(exc.errno, exc.strerror) from None
                except OSError as exc:
                    raise SinkFailed(exc.errno, exc.strerror) from None
            # A fast broker could keep this loop busy without ever blocking;
            # yield now and then, not after every chunk (a scheduler pass
            # costs about what moving a chunk does).
            unblocked += 1
            if unblocked >= YIELD_EVERY_CHUNKS:
                unblocked = 0
                await trio.lowlevel.checkpoint()
