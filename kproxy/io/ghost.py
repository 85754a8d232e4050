"""The proxy's own upstream connections, for traffic outside client order.

Late duplicates and deliveries after a client hung up cannot use the
client's connection: their responses would arrive out of the client's order
(or to nobody). They go over a connection per broker that the proxy owns,
with its own correlation ids; responses are handed to a callback (traced)
and discarded.
"""

from __future__ import annotations

import itertools
import logging
import struct
from collections.abc import Awaitable, Callable

import trio

from kproxy.io import net
from kproxy.obs import metrics
from kproxy.protocol.framing import FrameBuffer, FrameError
from kproxy.protocol.rewrite import Endpoint

log = logging.getLogger("kproxy.ghost")

_I32 = struct.Struct(">i")
ResponseCallback = Callable[[object, bytes], Awaitable[None]]


class GhostLink:
    def __init__(self, endpoint: Endpoint, connect_timeout: float, on_response: ResponseCallback) -> None:
        self.endpoint = endpoint
        self.connect_timeout = connect_timeout
        self.on_response = on_response
        self.sock: trio.socket.SocketType | None = None
        self.lock = trio.Lock()
        self.pending: dict[int, object] = {}
        self._ids = itertools.count(1_000_000_000)

    async def send(self, nursery: trio.Nursery, frame: bytes, token: object, expects_response: bool = True) -> int:
        """Send a request frame under a fresh correlation id; returns that id."""
        async with self.lock:
            if self.sock is None:
                self.sock = await net.connect(self.endpoint.host, self.endpoint.port, self.connect_timeout)
                metrics.connections_opened.labels("upstream").inc()
                metrics.connections_open.labels("upstream").inc()
                nursery.start_soon(self._read, self.sock)
            corr = next(self._ids)
            data = bytearray(frame)
            _I32.pack_into(data, 8, corr)  # after length (4), api key (2), version (2)
            if expects_response:
                self.pending[corr] = token
            try:
                await net.send_all(self.sock, bytes(data))
            except OSError as exc:
                self.pending.pop(corr, None)
                self._reset()
                raise OSError(f"ghost delivery to {self.endpoint} failed: {exc}") from exc
            metrics.ghost_deliveries.inc()
            return corr

    def _reset(self) -> None:
        if self.sock is not None:
            net.close_quietly(self.sock)
            self.sock = None
            metrics.connections_open.labels("upstream").dec()
            metrics.connections_closed.labels("upstream", "upstream_closed").inc()

    async def _read(self, sock: trio.socket.SocketType) -> None:
        frames = FrameBuffer()
        try:
            while True:
                data = await sock.recv(net.RECV_BYTES)
                if not data:
                    break
                block, offsets = frames.feed(data)
                ends = offsets[1:] + [len(block)]
                for start, end in zip(offsets, ends):
                    corr = _I32.unpack_from(block, start + 4)[0]
                    token = self.pending.pop(corr, None)
                    if token is not None:
                        await self.on_response(token, block[start:end])
        except (OSError, FrameError) as exc:
            log.info("ghost connection to %s ended: %s", self.endpoint, exc)
        finally:
            if self.sock is sock:
                self._reset()
            self.pending.clear()
