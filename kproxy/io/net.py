"""Small socket helpers for the trio shell.

The proxy uses trio's socket layer directly rather than SocketStream: one
fewer layer on the per-frame path, and recv sizes we choose.

On the data path it goes one step lower. A trio socket's recv or send that
succeeds at once still passes through the scheduler (a full run-loop turn,
with an epoll call, so that every socket call is a checkpoint). A proxy
makes four such calls per request and response, on the path whose added
latency is the product's measure; `Reader` and `send_all` call the kernel
directly and wait through trio only when the socket would block. A reader
that never blocks yields every few reads, so a busy connection cannot
starve the others and cancellation still gets through.

Over TLS (kproxy/io/tls.py) the bytes must pass through `ssl` anyway: a
TLS connection reads and writes through trio's SSLStream, and `reader`,
`send_all` and `connect` hand it to that path.
"""

from __future__ import annotations

import errno
import os
import socket

import trio

from kproxy.io.reads import read_exact_size
from kproxy.io.tls import TlsSocket, UpstreamTls
from kproxy.io.tls import connect as tls_connect

RECV_BYTES = 256 * 1024
# Reads that found data waiting, in a row, before the reader lets other tasks run.
YIELD_EVERY_READS = 16


async def connect(
    host: str, port: int, timeout: float, tls: UpstreamTls | None = None
) -> trio.socket.SocketType | TlsSocket:
    """Open a TCP connection with TCP_NODELAY (Kafka traffic is request/response),
    with TLS if `tls` (host is then the name the broker's certificate must carry);
    a failed handshake raises kproxy.io.tls.TlsHandshakeError."""
    sock = await _connect_tcp(host, port, timeout)
    if tls is None:
        return sock
    return await tls_connect(sock, tls, host, timeout)


async def _connect_tcp(host: str, port: int, timeout: float) -> trio.socket.SocketType:
    with trio.fail_after(timeout):
        infos = await trio.socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        last: OSError | None = None
        for family, type_, proto, _, addr in infos:
            sock = trio.socket.socket(family, type_, proto)
            try:
                await sock.connect(addr)
            except OSError as exc:
                sock.close()
                last = exc
                continue
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            return sock
    raise last or OSError(f"no address for {host}:{port}")


def reader(sock: trio.socket.SocketType | TlsSocket) -> Reader | TlsSocket:
    """What a pump reads `sock` with: a Reader, or the TLS connection itself (it decrypts as it reads)."""
    return sock if type(sock) is TlsSocket else Reader(sock)


class Reader:
    """Reads one socket for one task (a pump).

    The descriptor is asked of the socket at every read, never kept: once
    another task closes the socket it reads as -1 (EBADF), where a kept
    number could meanwhile belong to a newly accepted connection.
    """

    __slots__ = ("sock", "streak")

    def __init__(self, sock: trio.socket.SocketType) -> None:
        self.sock = sock
        self.streak = 0  # reads in a row that did not wait

    async def recv(self, size: int) -> bytes:
        """Up to `size` bytes (b"" at end of stream); OSError as the socket's."""
        sock = self.sock
        try:
            data = read_exact_size(sock.fileno(), size)
        except BlockingIOError:
            self.streak = 0
            while True:
                await wait_readable(sock)
                try:
                    return read_exact_size(sock.fileno(), size)
                except BlockingIOError:
                    continue
        self.streak += 1
        if self.streak >= YIELD_EVERY_READS:
            self.streak = 0
            await trio.lowlevel.checkpoint()
        return data


async def send_all(sock: trio.socket.SocketType | TlsSocket, data: bytes | memoryview) -> None:
    """Write all of data; waits through trio only while the socket's buffer is full."""
    if type(sock) is TlsSocket:
        return await sock.send_all(data)
    view = memoryview(data)
    while view:
        try:
            sent = os.write(sock.fileno(), view)
        except BlockingIOError:
            await wait_writable(sock)
            continue
        view = view[sent:]


async def wait_readable(sock: trio.socket.SocketType) -> None:
    """trio's wait, failing as a socket call would (OSError) if another task closes the socket meanwhile."""
    try:
        await trio.lowlevel.wait_readable(sock)
    except trio.ClosedResourceError:
        raise OSError(errno.EBADF, "the socket was closed while waiting to read") from None


async def wait_writable(sock: trio.socket.SocketType) -> None:
    try:
        await trio.lowlevel.wait_writable(sock)
    except trio.ClosedResourceError:
        raise OSError(errno.EBADF, "the socket was closed while waiting to write") from None


def close_quietly(sock: trio.socket.SocketType | TlsSocket | None) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass
