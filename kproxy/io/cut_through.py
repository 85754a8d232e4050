"""Cut-through: a large response on the fast path goes to the client as its bytes arrive.

A multi-MiB Fetch response is then never copied whole, and the client reads
it while the broker is still sending (store-and-forward would add a full
transfer time). With tracing its error codes are scanned on the way, or at
level `records` the chunks are kept for the trace writer.
"""

from __future__ import annotations

import struct
from typing import Any

import trio

from kproxy.io import net, relay
from kproxy.io.errors import ConnectionClosed
from kproxy.obs import metrics
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis, error_scan
from kproxy.protocol.framing import FrameBuffer

# kproxy.io.connection.ClientConnection, which imports this module.
ClientConnection = Any

_I32 = struct.Struct(">i")
_RESPONSE_BYTES = metrics.bytes_.labels("response")
# Skipped record bytes at least this many are relayed rather than read into a frame buffer.
RELAY_MIN_BYTES = 16 * 1024


class CutThrough:
    """A response frame being forwarded as its bytes arrive."""

    __slots__ = ("ex", "size", "remaining", "scan", "chunks")

    def __init__(
        self, ex: Exchange, size: int, scan: error_scan.FetchErrorScan | None, chunks: list[bytes] | None = None
    ) -> None:
        self.ex = ex
        self.size = size  # whole frame, prefix included
        self.remaining = size
        self.scan = scan  # error codes for the trace, read on the way through
        # Tracing at `records`: every chunk forwarded, kept for the trace
        # writer, which scans the batches and copies them to its side file.
        self.chunks = chunks

    def relayable(self) -> int:
        """Bytes that may be relayed broker -> client unseen now: all the rest,
        or with a scan, the records it skips (if worth a relay); none when every byte is kept."""
        if self.chunks is not None:
            return 0
        if self.scan is None:
            return self.remaining
        skip = min(self.scan.pending_skip, self.remaining)
        return skip if skip >= RELAY_MIN_BYTES else 0

    def relayed(self, n: int) -> None:
        self.remaining -= n
        if self.scan is not None:
            self.scan.skip(n)

    def recv_size(self) -> int:
        """With a scan, read a little past what it wants next (a field, a short skip),
        not up to a full read: the records after it can then be relayed, and the
        few bytes that end a frame come in one read, not one per field."""
        scan = self.scan
        if self.chunks is not None:
            return min(self.remaining, net.RECV_BYTES)
        want = (scan.pending_read or scan.pending_skip) if scan is not None else 0
        return min(self.remaining, max(want, RELAY_MIN_BYTES) if want else net.RECV_BYTES)


async def start(conn: ClientConnection, frames: FrameBuffer) -> CutThrough | None:
    """Start forwarding the incomplete frame cut-through, if nothing needs it whole."""
    order = conn.order
    corr = _I32.unpack(frames.peek_pending(8)[4:])[0]
    ex = conn.in_flight.get(corr)
    if ex is None or ex.header is not None or not order or order[0] is not ex:
        return None  # inspected, unknown, or behind an unanswered request: wait for it whole
    proxy = conn.proxy
    min_version = proxy.pipeline.routing.inspect_responses_from.get(ex.api_key)
    if min_version is not None and ex.api_version >= min_version:
        return None
    scan = None
    chunks = None
    if proxy.trace is not None:
        if ex.api_key != apis.FETCH or not error_scan.scannable(ex.api_version):
            return None  # the trace needs its error codes from the whole frame
        if proxy.trace_records:
            chunks = []  # still streamed; the writer scans the kept chunks
        else:
            scan = error_scan.FetchErrorScan(ex.api_version)
    del conn.in_flight[corr]
    counter = proxy.response_frame_counters.get(ex.api_key) or proxy.response_counter(ex.api_key)
    counter.inc()
    cut = CutThrough(ex, frames.pending_frame_size, scan, chunks)
    await forward(conn, cut, frames.take_pending())
    return cut


async def relay_part(conn: ClientConnection, cut: CutThrough, n: int) -> None:
    """Move n bytes of the frame broker -> client without looking at them."""
    assert conn.upstream is not None
    try:
        await relay.forward(conn.upstream, conn.client, n, conn.client_lock)
    except EOFError:
        raise ConnectionClosed(
            "upstream_closed", f"broker {conn.upstream_endpoint} closed the connection inside a response"
        ) from None
    except relay.SourceFailed as exc:
        raise ConnectionClosed(
            "upstream_closed", f"broker {conn.upstream_endpoint} connection failed: {exc}"
        ) from None
    except relay.SinkFailed as exc:
        raise ConnectionClosed("client_closed", f"client connection failed while sending: {exc}") from None
    _RESPONSE_BYTES.inc(n)
    cut.relayed(n)


async def forward(conn: ClientConnection, cut: CutThrough, data: bytes | memoryview) -> None:
    cut.remaining -= len(data)
    if cut.scan is not None:
        cut.scan.feed(data)
    elif cut.chunks is not None:
        cut.chunks.append(data if type(data) is bytes else bytes(data))
    await conn.send_client(data)


async def finish(conn: ClientConnection, cut: CutThrough) -> None:
    ex = cut.ex
    now = trio.current_time()
    proxy = conn.proxy
    ex.response_frame = b""  # already with the client
    order = conn.order
    if order and order[0] is ex:
        order.popleft()
        conn.order_shrank()
    hist = proxy.client_latency_histograms.get(ex.api_key) or proxy.latency_histogram(ex.api_key)
    hist.observe(now - ex.arrived)
    if cut.scan is not None:
        await proxy.emit_trace(proxy.events.fast_response(conn, ex, None, now, size=cut.size - 4, codes=cut.scan.codes))
    elif cut.chunks is not None:
        await proxy.emit_trace(proxy.events.fast_response(conn, ex, None, now, size=cut.size - 4, chunks=cut.chunks))
    if order:
        if order[0].response_frame is not None:
            await conn.flush_responses()
    else:
        conn.drained.set()
