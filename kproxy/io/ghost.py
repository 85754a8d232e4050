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
from kproxy.io.tls import TlsSocket, UpstreamTls
from kproxy.obs import metrics
from kproxy.protocol.framing import FrameBuffer, FrameError
from kproxy.protocol.broker_addresses import Endpoint

log = logging.getLogger("kproxy.ghost")

_I32 = struct.Struct(">i")
ResponseCallback = Callable[[object, bytes], Awaitable[None]]
# Told the tokens of deliveries a closed link leaves unanswered, and why it closed.
CloseCallback = Callable[[list[object], str], Awaitable[None]]
# Longest a closing link waits to report its unanswered deliveries (the trace queue may be full).
CLOSE_REPORT_TIMEOUT = 5.0


class GhostLink:
    def __init__(
        self, endpoint: Endpoint, connect_timeout: float, on_response: ResponseCallback, on_close: CloseCallback,
        tls: UpstreamTls | None = None,
    ) -> None:
        self.endpoint = endpoint
        self.tls = tls
        self.connect_timeout = connect_timeout
        self.on_response = on_response
        self.on_close = on_close
        self.sock: trio.socket.SocketType | TlsSocket | None = None
        self.lock = trio.Lock()
        self.pending: dict[int, object] = {}
        self._ids = itertools.count(1_000_000_000)

    async def send(self, nursery: trio.Nursery, frame: bytes, token: object, expects_response: bool = True) -> int:
        """Send a request frame under a fresh correlation id; returns that id.

        A delivery that expects a response ends in exactly one call: on_response
        with its answer, or on_close when the link fails first (this call then raises).
        """
        registered = False
        try:
            async with self.lock:
                if self.sock is None:
                    self.sock = await net.connect(self.endpoint.host, self.endpoint.port, self.connect_timeout, self.tls)
                    metrics.connections_opened.labels("upstream").inc()
                    metrics.connections_open.labels("upstream").inc()
                    nursery.start_soon(self._read, self.sock)
                sock = self.sock
                corr = next(self._ids)
                data = bytearray(frame)
                _I32.pack_into(data, 8, corr)  # after length (4), api key (2), version (2)
                if expects_response:
                    self.pending[corr] = token
                    registered = True
                try:
                    await net.send_all(sock, bytes(data))
                except OSError as exc:
                    # This delivery and every one still awaiting an answer on the
                    # link are lost with it (reported by _close).
                    await self._close(sock, "upstream_closed")
                    raise OSError(f"ghost delivery to {self.endpoint} failed: {exc}") from exc
                metrics.ghost_deliveries.inc()
                return corr
        except BaseException as exc:
            # Lost before the link knew of it: unreachable, or cancelled (shutdown) while
            # waiting for the link. Reported here, as the link reports what it loses.
            if expects_response and not registered:
                reason = "proxy_shutdown" if isinstance(exc, trio.Cancelled) else "upstream_unreachable"
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_REPORT_TIMEOUT):
                    await self.on_close([token], reason)
            raise

    async def _close(self, sock: trio.socket.SocketType, reason: str) -> None:
        """Close the link's socket (once) and report the deliveries it leaves unanswered."""
        if self.sock is not sock:
            return  # already closed, and a newer socket may have taken its place
        self.sock = None
        net.close_quietly(sock)
        metrics.connections_open.labels("upstream").dec()
        metrics.connections_closed.labels("upstream", reason).inc()
        lost = list(self.pending.values())
        self.pending.clear()
        if lost:
            with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_REPORT_TIMEOUT):
                await self.on_close(lost, reason)

    async def _read(self, sock: trio.socket.SocketType | TlsSocket) -> None:
        frames = FrameBuffer()
        reason = "upstream_closed"
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
        # ClosedResourceError: a failed send closed the socket under this read.
        except (OSError, FrameError, trio.ClosedResourceError) as exc:
            log.info("ghost connection to %s ended: %s", self.endpoint, exc)
        except trio.Cancelled:
            reason = "proxy_shutdown"
            raise
        finally:
            await self._close(sock, reason)
