"""Small socket helpers for the trio shell.

The proxy uses trio's socket layer directly rather than SocketStream: one
fewer layer on the per-frame path, and recv sizes we choose.
"""

from __future__ import annotations

import socket

import trio

RECV_BYTES = 256 * 1024


async def connect(host: str, port: int, timeout: float) -> trio.socket.SocketType:
    """Open a TCP connection with TCP_NODELAY (Kafka traffic is request/response)."""
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


async def send_all(sock: trio.socket.SocketType, data: bytes) -> None:
    view = memoryview(data)
    while view:
        sent = await sock.send(view)
        view = view[sent:]


def close_quietly(sock: trio.socket.SocketType | None) -> None:
    if sock is not None:
        try:
            sock.close()
        except OSError:
            pass
