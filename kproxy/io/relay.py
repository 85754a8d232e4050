"""Move a known number of bytes from one socket to another, untouched.

The body of a large frame forwarded cut-through (a Fetch response, a batched
Produce request) needs no look from the proxy. It is copied through a
reusable buffer in chunks of up to `CHUNK_BYTES`: one read and one write per
chunk, no Python object per chunk, and the buffer stays in cache from one
chunk to the next.

`splice` (socket -> pipe -> socket in the kernel) was used here before and
measured slower on the reference machine: per 6 MB Fetch response it spent
as much CPU as the copy and the client received the bytes about 1 ms later
(docs/performance.md).

A TLS side cannot be read or written by descriptor (its bytes are
encrypted on the wire): a move with one goes through its recv/send_all.
"""

from __future__ import annotations

import os
from collections.abc import Awaitable, Callable

import trio

from kproxy.io import net
from kproxy.io.tls import TlsSocket

CHUNK_BYTES = 1024 * 1024
# Buffers kept for reuse between frames; more are made while more frames
# move at once, and dropped after.
POOL_SIZE = 4
# Over TLS: bytes gathered from the source before one write (see _move_through).
GATHER_BYTES = 64 * 1024
# Chunks moved without blocking before yielding to other tasks.
YIELD_EVERY_CHUNKS = 4

_pool: list[memoryview] = []


class SourceFailed(OSError):
    """Reading the source socket failed."""


class SinkFailed(OSError):
    """Writing the destination socket failed."""


async def forward(src: trio.socket.SocketType, dst: trio.socket.SocketType, n: int, dst_lock: trio.Lock) -> None:
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
        await forward_locked(src, dst, n)
    finally:
        dst_lock.release()


async def forward_locked(src: trio.socket.SocketType, dst: trio.socket.SocketType, n: int) -> None:
    """As forward, for a caller that already holds dst's lock."""
    if type(src) is TlsSocket or type(dst) is TlsSocket:
        await _move_through(src, dst, n)
        return
    buf = _pool.pop() if _pool else memoryview(bytearray(CHUNK_BYTES))
    try:
        await _move(src, dst, n, buf)
    finally:
        if len(_pool) < POOL_SIZE:
            _pool.append(buf)


async def _move(src: trio.socket.SocketType, dst: trio.socket.SocketType, n: int, buf: memoryview) -> None:
    # Descriptors are asked of the sockets at each call, never kept across
    # a wait: a socket another task closed meanwhile then fails (EBADF)
    # instead of its number, reused by a new connection, being read.
    unblocked = 0  # chunks moved since this task last let others run
    while n:
        try:
            got = os.readv(src.fileno(), (buf[: min(n, CHUNK_BYTES)],))
        except BlockingIOError:
            unblocked = 0
            try:
                await net.wait_readable(src)
            except OSError as exc:
                raise SourceFailed(exc.errno, exc.strerror) from None
            continue
        except OSError as exc:
            raise SourceFailed(exc.errno, exc.strerror) from None
        if got == 0:
            raise EOFError("the peer closed the connection inside a frame")
        n -= got
        try:
            await net.send_all(dst, buf[:got])
        except OSError as exc:
            raise SinkFailed(exc.errno, exc.strerror) from None
        # A fast broker could keep this loop busy without ever blocking;
        # yield now and then, not after every chunk.
        unblocked += 1
        if unblocked >= YIELD_EVERY_CHUNKS:
            unblocked = 0
            await trio.lowlevel.checkpoint()


async def forward_into_locked(
    src: trio.socket.SocketType, dst: trio.socket.SocketType, into: memoryview,
    before_last: Callable[[], Awaitable[None]],
) -> None:
    """As forward_locked for plain sockets, reading into `into` (kept by the caller) rather than a pooled buffer.

    `before_last` runs once every byte has arrived, before the last of them
    is sent: a traced Produce is handed to the trace writer whole, and before
    the broker can answer it.
    """
    n = len(into)
    if not n:
        await before_last()
        return
    pos = 0
    unblocked = 0
    while pos < n:
        try:
            got = os.readv(src.fileno(), (into[pos : pos + min(n - pos, CHUNK_BYTES)],))
        except BlockingIOError:
            unblocked = 0
            try:
                await net.wait_readable(src)
            except OSError as exc:
                raise SourceFailed(exc.errno, exc.strerror) from None
            continue
        except OSError as exc:
            raise SourceFailed(exc.errno, exc.strerror) from None
        if got == 0:
            raise EOFError("the peer closed the connection inside a frame")
        chunk = into[pos : pos + got]
        pos += got
        if pos == n:
            await before_last()
        try:
            await net.send_all(dst, chunk)
        except OSError as exc:
            raise SinkFailed(exc.errno, exc.strerror) from None
        unblocked += 1
        if unblocked >= YIELD_EVERY_CHUNKS:
            unblocked = 0
            await trio.lowlevel.checkpoint()


async def _move_through(src: trio.socket.SocketType | TlsSocket, dst: trio.socket.SocketType | TlsSocket, n: int) -> None:
    """As _move, through the sides' own reads and writes (one of them speaks TLS).

    Reads come as the bytes arrive, often a TLS record or two of a few KiB;
    each write costs a TLS record and a system call, so reads are gathered
    up to GATHER_BYTES before one write. The frame's last bytes still go out
    the moment they arrive, and the peer cannot act on a frame before its
    last byte, so gathering delays nothing it can use.
    """
    reader = net.reader(src)
    gathered: list[bytes] = []
    size = 0
    while n:
        try:
            data = await reader.recv(min(n, CHUNK_BYTES))
        except OSError as exc:
            raise SourceFailed(str(exc)) from None
        if not data:
            raise EOFError("the peer closed the connection inside a frame")
        n -= len(data)
        gathered.append(data)
        size += len(data)
        if size >= GATHER_BYTES or not n:
            try:
                await net.send_all(dst, gathered[0] if len(gathered) == 1 else b"".join(gathered))
            except OSError as exc:
                raise SinkFailed(str(exc)) from None
            gathered = []
            size = 0
