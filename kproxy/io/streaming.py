"""Request streaming: a large request that nothing needs whole goes to the broker as it arrives.

A batched Produce of a plain producer is relayed client -> broker unseen,
instead of being gathered into a frame and copied.
"""

from __future__ import annotations

from typing import Any

import trio

from kproxy.io import relay, tls
from kproxy.io.errors import ConnectionClosed
from kproxy.obs import metrics
from kproxy.obs.trace_frame_pool import PooledBuffer
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis
from kproxy.protocol.codec import DecodeError, parse_request_header
from kproxy.protocol.framing import FrameBuffer

# kproxy.io.connection.ClientConnection, which imports this module.
ClientConnection = Any

_REQUEST_BYTES = metrics.bytes_.labels("request")
# A request streamed to the broker is decided on this many of its first bytes
# (the header, and for Produce the transactional id and acks behind it).
STREAM_REQUEST_HEAD_BYTES = 1024


async def stream_request(conn: ClientConnection, frames: FrameBuffer) -> bool:
    """Stream the incomplete request frame if it may pass untouched; False if it must arrive whole."""
    head = frames.peek_pending(STREAM_REQUEST_HEAD_BYTES)
    try:
        header = parse_request_header(head, 4)
    except DecodeError:
        return False  # a header longer than the peek: the whole-frame path reads (or refuses) it
    routing = conn.proxy.pipeline.routing
    api_key = header.api_key
    ex = Exchange(api_key, header.api_version, header.correlation_id, header.client_id, trio.current_time())
    if api_key in routing.slow_request_apis or (
        api_key == apis.PRODUCE and not routing.produce_is_plain(head, 4, header, ex)
    ):
        return False
    proxy = conn.proxy
    # At level `records` a Produce's batches are traced: it streams all the
    # same, read into one buffer of its own size that then goes to the
    # trace writer whole (no gathering and copying first). Over TLS it
    # arrives whole instead.
    keep = proxy.trace_records and api_key == apis.PRODUCE
    if keep and (type(conn.client) is tls.TlsSocket or type(conn.upstream) is tls.TlsSocket or conn.upstream is None):
        return False
    counter = proxy.request_frame_counters.get(api_key) or proxy.request_counter(api_key)
    counter.inc()
    size = frames.pending_frame_size
    if ex.expects_response:
        conn.order.append(ex)
        conn.in_flight[header.correlation_id] = ex
    ex.sent = ex.arrived
    if proxy.trace is not None and not keep:
        await proxy.emit_trace(proxy.events.fast_request(conn, ex, size - 4))
    head_bytes = frames.take_pending()
    # The upstream lock is held from the first byte to the last: nothing
    # else (a delayed or duplicated request) may land inside this frame.
    lock = conn.upstream_lock
    await lock.acquire()
    try:
        await conn.send_upstream_locked(head_bytes)
        rest = size - len(head_bytes)
        try:
            if keep:
                # Never zeroed: the stream fills it. Two holders: the writer may write the side file, and
                # give its hold back, before the last bytes below are sent from the same buffer.
                pool = proxy.events.frame_pool
                frame = pool.take(size, holders=2)
                frame[: len(head_bytes)] = head_bytes

                async def traced() -> None:
                    await proxy.emit_trace(proxy.events.fast_request(conn, ex, size - 4, frame, header))

                try:
                    await relay.forward_into_locked(conn.client, conn.upstream, frame[len(head_bytes) :], traced)
                finally:
                    if type(frame.obj) is PooledBuffer:
                        pool.give(frame.obj)
            else:
                await relay.forward_locked(conn.client, conn.upstream, rest)
        except EOFError:
            metrics.protocol_errors.labels("truncated_frame").inc()
            raise ConnectionClosed(
                "truncated_frame", f"client closed the connection inside a {size}-byte request"
            ) from None
        except relay.SourceFailed as exc:
            raise ConnectionClosed("client_closed", f"client read failed: {exc}") from None
        except relay.SinkFailed as exc:
            raise ConnectionClosed(
                "upstream_closed", f"broker {conn.upstream_endpoint} connection failed while sending: {exc}"
            ) from None
        _REQUEST_BYTES.inc(rest)
    finally:
        lock.release()
    return True
