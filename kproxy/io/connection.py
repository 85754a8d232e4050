"""One client connection: two pumps, in-order responses.

Data path. The request pump cuts the client's byte stream into frames, reads
each request header (api, version, correlation id, client id) and, unless
something needs more, forwards the frames exactly as they arrived, several
per send. The response pump does the same upstream; responses go back in the
order the requests arrived, whatever order they were delivered in. A large
response that nothing needs whole (a Fetch of several MiB) goes cut-through
(kproxy.io.cut_through), and a large request likewise (kproxy.io.streaming).

Everything beyond headers (address rewriting, the transaction tracker, fault
rules) is decided by the pipeline (kproxy.pipeline) and carried out by
kproxy.io.delivery, only for the frames that need it; trace events come from
kproxy.obs.trace_events. Malformed input closes this connection with a log
line and a metric; it never reaches the rest of the proxy.
"""

from __future__ import annotations

import logging
import socket
import ssl
import struct
from collections import deque
from typing import Any

import trio

from kproxy.io import backpressure, cut_through, net, streaming, tls
from kproxy.io.errors import ConnectionClosed
from kproxy.io.streaming import STREAM_REQUEST_HEAD_BYTES
from kproxy.obs import metrics
from kproxy.obs.logs import LogEvery
from kproxy.pipeline.decode import Undecodable
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis
from kproxy.protocol.broker_addresses import Endpoint
from kproxy.protocol.codec import ClientIds, DecodeError, parse_request_header
from kproxy.protocol.framing import FrameBuffer, FrameError

log = logging.getLogger("kproxy.conn")
# Per broker endpoint: how often "broker ... is unreachable" may be logged.
UNREACHABLE_REPORTS = LogEvery()

_I32 = struct.Struct(">i")
# Looked up once: labels() costs a lock and a dict lookup on every read.
_REQUEST_BYTES = metrics.bytes_.labels("request")
_RESPONSE_BYTES = metrics.bytes_.labels("response")
# How long a half-closed client waits for its outstanding responses.
DRAIN_TIMEOUT = 30.0
# Longest a closing connection waits for room in a full trace queue for its close event.
CLOSE_TRACE_TIMEOUT = 5.0
# Responses at least this large (length prefix included) go cut-through when they may.
CUT_THROUGH_BYTES = 64 * 1024
# First read after a cut-through response: the next response on such a
# connection is likely large too, and only its head needs to pass through
# Python (a full-size read would copy up to RECV_BYTES of it in user space).
AFTER_CUT_RECV_BYTES = 16 * 1024


def _feed(frames: FrameBuffer, data: bytes, sender: str) -> tuple[bytes, list[int]]:
    """The frames `data` completes; a malformed one counts as a protocol error and ends the connection."""
    try:
        return frames.feed(data)
    except FrameError as exc:
        metrics.protocol_errors.labels(exc.reason).inc()
        if sender == "client" and tls.looks_like_tls(data):
            raise ConnectionClosed(
                exc.reason,
                "client sent a TLS handshake to a plaintext listener (start kproxy with --tls-cert and --tls-key "
                "for TLS clients, or connect in plaintext)",
            ) from None
        raise ConnectionClosed(exc.reason, f"{sender} sent a bad frame: {exc}") from None


class ClientConnection:
    def __init__(
        self,
        proxy: Any,  # the kproxy.io.proxy.Proxy that accepted it (which imports this module)
        client: trio.socket.SocketType,
        client_addr: str,
        node_id: int,
        upstream: Endpoint,
    ) -> None:
        self.proxy = proxy
        self.client = client
        self.client_addr = client_addr
        self.node_id = node_id  # -1 for the bootstrap listener
        self.upstream_endpoint = upstream
        self.upstream: trio.socket.SocketType | None = None
        self.conn_id = proxy.next_conn_id()
        self.order: deque[Exchange] = deque()
        self.in_flight: dict[int, Exchange] = {}
        self.client_lock = trio.Lock()
        self.upstream_lock = trio.Lock()
        self.nursery: trio.Nursery | None = None
        self.close_reason = "client_closed"
        self.close_rule: str | None = None  # the fault rule that cut the connection (close reason fault_disconnect)
        self.closed_on_purpose = False  # close() ran: what the pumps raise after it is its consequence
        self.drained = trio.Event()
        self.closed = trio.Event()
        # For the proxy's timeout sweep (Proxy.sweep_connections): when the client last
        # sent bytes, when the frame it is sending began (None between frames), and
        # when the connection was last seen waiting for answers.
        self.last_read = trio.current_time()
        self.frame_started: float | None = None
        self.busy_at = self.last_read
        self._first_frame_scope: trio.CancelScope | None = None
        # With this many requests in `order` the request pump reads no further (kproxy.io.backpressure).
        self.max_outstanding = backpressure.limit(proxy.config.max_outstanding_requests)
        self.paused = False
        self.room: trio.Event | None = None  # set when a paused pump may read on
        self.hung_up = False  # seen while paused: what the client sent before goes on unbounded
        # A client sends the same client id in every request: decoded once, not once per request.
        self.client_ids = ClientIds()

    # ------------------------------------------------------------------ lifecycle

    async def serve(self) -> None:
        ep = self.upstream_endpoint
        metrics.connections_opened.labels("client").inc()
        metrics.connections_open.labels("client").inc()
        config = self.proxy.config
        unsent: list[Exchange] = []
        try:
            if config.client_tls is not None and not await self._client_handshake(config.client_tls):
                return
            # The broker connection opens only once the client has sent a frame:
            # sockets that never speak cost the broker nothing.
            opening = await self._first_frames()
            if opening is None:
                return
            try:
                self.upstream = await net.connect(ep.host, ep.port, config.connect_timeout, config.upstream_tls)
            except tls.TlsHandshakeError as exc:
                self.close_reason = "tls_handshake"
                metrics.tls_handshake_failures.labels("upstream", exc.reason).inc()
                log.warning(
                    "conn %d from %s: TLS handshake with broker %s (node %d) failed: %s; disconnecting the client",
                    self.conn_id, self.client_addr, ep, self.node_id, exc,
                )
                unsent = self._unsent(opening[2], opening[3])
                return
            except (OSError, trio.TooSlowError) as exc:
                self.close_reason = "upstream_unreachable"
                # While a broker is down every client that comes is refused: one line
                # per broker per interval, with the count, not one per client.
                quiet = UNREACHABLE_REPORTS.due(str(ep))
                if quiet is not None:
                    log.warning(
                        "broker %s (node %d) is unreachable (%s); disconnecting its clients (conn %d from %s)%s",
                        ep, self.node_id, exc or "timed out", self.conn_id, self.client_addr,
                        UNREACHABLE_REPORTS.suffix(quiet),
                    )
                unsent = self._unsent(opening[2], opening[3])
                return
            metrics.connections_opened.labels("upstream").inc()
            metrics.connections_open.labels("upstream").inc()
            try:
                async with trio.open_nursery() as nursery:
                    self.nursery = nursery
                    nursery.start_soon(self._pump_requests, *opening)
                    nursery.start_soon(self._pump_responses)
            except* (ConnectionClosed, Undecodable) as group:
                first = group.exceptions[0]
                if self.closed_on_purpose:
                    log.debug("conn %d from %s: after the close: %s", self.conn_id, self.client_addr, first)
                else:
                    self._note_close(first.reason, str(first))
            except* Exception as group:
                # A bug must cost one connection, never the proxy.
                self.close_reason = "error"
                log.error(
                    "conn %d from %s: internal error, closing the connection",
                    self.conn_id, self.client_addr, exc_info=group.exceptions[0],
                )
            finally:
                metrics.connections_open.labels("upstream").dec()
                metrics.connections_closed.labels("upstream", self._upstream_reason()).inc()
        finally:
            self.closed.set()
            net.close_quietly(self.upstream)
            net.close_quietly(self.client)
            metrics.connections_open.labels("client").dec()
            metrics.connections_closed.labels("client", self.close_reason).inc()
            if self.proxy.trace is not None:
                with trio.CancelScope(shield=True), trio.move_on_after(CLOSE_TRACE_TIMEOUT):
                    await self.proxy.delivery.trace_close(self, unsent)
            self.proxy.connection_closed(self)

    async def _client_handshake(self, context: ssl.SSLContext) -> bool:
        """TLS with the client on a TLS listener; False (logged, counted, closed) when it fails."""
        try:
            self.client = await tls.accept(self.client, context, self.proxy.config.connect_timeout)
        except tls.TlsHandshakeError as exc:
            self.close_reason = "tls_handshake"
            metrics.tls_handshake_failures.labels("client", exc.reason).inc()
            hint = " (a plaintext client on a TLS listener?)" if exc.reason == "not_tls" else ""
            # A connection closed before any handshake is a port check or a client giving up, not a fault.
            level = logging.INFO if exc.reason == "closed" else logging.WARNING
            log.log(level, "conn %d from %s: TLS handshake with the client failed: %s%s", self.conn_id, self.client_addr, exc, hint)
            return False
        return True

    async def _first_frames(self) -> tuple[FrameBuffer, net.Reader | tls.TlsSocket, bytes, list[int]] | None:
        """Wait for the client's first frame (or the start of one to stream); None if it never came.

        The idle timeout bounds the wait for a first byte, the read timeout the
        wait for the rest of the frame.
        """
        config = self.proxy.config
        frames = FrameBuffer(config.max_frame_bytes)
        client = net.reader(self.client)
        with trio.CancelScope() as scope:
            self._first_frame_scope = scope
            if config.idle_timeout:
                scope.deadline = trio.current_time() + config.idle_timeout
            while True:
                try:
                    data = await client.recv(net.RECV_BYTES)
                except OSError as exc:
                    self._note_close("client_closed", f"client read failed: {exc}")
                    return None
                if not data:
                    try:
                        frames.check_eof()
                    except FrameError as exc:
                        metrics.protocol_errors.labels(exc.reason).inc()
                        self._note_close(exc.reason, f"client sent a truncated frame: {exc}")
                    else:
                        self._note_close("client_closed", "client closed the connection before its first request")
                    return None
                now = trio.current_time()
                self.last_read = now
                _REQUEST_BYTES.inc(len(data))
                try:
                    block, offsets = _feed(frames, data, "client")
                except ConnectionClosed as exc:
                    self._note_close(exc.reason, str(exc))
                    return None
                if offsets or (
                    frames.pending_frame_size >= CUT_THROUGH_BYTES and frames.pending >= STREAM_REQUEST_HEAD_BYTES
                ):
                    self._first_frame_scope = None
                    return frames, client, block, offsets
                if self.frame_started is None:
                    self.frame_started = now
                    if config.read_timeout:
                        scope.deadline = now + config.read_timeout
        self._first_frame_scope = None
        if not self.closed_on_purpose:
            if frames.pending:
                self._note_close("read_timeout", f"client sent {frames.pending} bytes of a frame and stalled "
                                                 f"for {config.read_timeout:g}s")
            else:
                self._note_close("idle_timeout", f"client sent nothing for {config.idle_timeout:g}s")
        return None

    def _unsent(self, block: bytes, offsets: list[int]) -> list[Exchange]:
        """The complete requests of the first read, never forwarded (for the close event)."""
        out = []
        for start in offsets:
            try:
                header = parse_request_header(block, start + 4)
            except DecodeError:
                break
            proxy = self.proxy
            (proxy.request_frame_counters.get(header.api_key) or proxy.request_counter(header.api_key)).inc()
            out.append(Exchange(header.api_key, header.api_version, header.correlation_id, header.client_id, 0.0))
        return out

    def _note_close(self, reason: str, message: str) -> None:
        self.close_reason = reason
        if reason in ("client_closed", "proxy_shutdown", "idle_timeout"):
            log.debug("conn %d from %s closed: %s", self.conn_id, self.client_addr, message)
        elif reason == "upstream_closed":
            log.info("conn %d from %s: %s", self.conn_id, self.client_addr, message)
        else:
            log.warning("conn %d from %s closed: %s", self.conn_id, self.client_addr, message)

    def _upstream_reason(self) -> str:
        return self.close_reason if self.close_reason in ("upstream_closed", "fault_disconnect") else "client_closed"

    def drop_upstream(self, message: str) -> None:
        """Cut the broker side; the client then sees a disconnect, as from a dead broker."""
        net.close_quietly(self.upstream)
        self.close("fault_disconnect", message)

    def close(self, reason: str, message: str) -> None:
        """Close from outside the pumps (a fault rule, a timeout, proxy shutdown)."""
        if self.closed_on_purpose:
            return
        scope = self.nursery.cancel_scope if self.nursery is not None else self._first_frame_scope
        if scope is not None:
            self.closed_on_purpose = True
            self._note_close(reason, message)
            scope.cancel()

    # ------------------------------------------------------------------ client -> broker

    async def _pump_requests(self, frames: FrameBuffer, client: net.Reader | tls.TlsSocket, block: bytes, offsets: list[int]) -> None:
        """Forward the first read's frames (from _first_frames), then every read after it."""
        stream_refused = False  # the incomplete frame must arrive whole (it is inspected)
        now = self.last_read
        while True:
            if offsets:
                stream_refused = False
                if await self._forward_requests(block, offsets):
                    now = trio.current_time()  # paused: a frame left incomplete is waited for from now
            if (
                not stream_refused
                and frames.pending_frame_size >= CUT_THROUGH_BYTES
                and frames.pending >= STREAM_REQUEST_HEAD_BYTES
            ):
                # Streamed whole: the timeout sweep sees the frame as started until it is through.
                self.frame_started = self.frame_started or now
                stream_refused = not await streaming.stream_request(self, frames)
                if not stream_refused:
                    self.frame_started = None
            # A frame completed in this read: what is left began in this read.
            if offsets or self.frame_started is None:
                self.frame_started = now if frames.pending else None
            try:
                data = await client.recv(net.RECV_BYTES)
            except OSError as exc:
                raise ConnectionClosed("client_closed", f"client read failed: {exc}") from None
            if not data:
                try:
                    frames.check_eof()
                except FrameError as exc:
                    metrics.protocol_errors.labels(exc.reason).inc()
                    raise ConnectionClosed(exc.reason, f"client sent a truncated frame: {exc}") from None
                await self._client_eof()
                return
            self.last_read = now = trio.current_time()
            _REQUEST_BYTES.inc(len(data))
            block, offsets = _feed(frames, data, "client")

    async def _forward_requests(self, block: bytes, offsets: list[int]) -> bool:
        """Forward the complete request frames of one read, inspecting those that need it.

        Returns whether it paused for room (the connection's bound of requests held).
        """
        proxy = self.proxy
        routing = proxy.pipeline.routing
        delivery = proxy.delivery
        events = proxy.events
        # Read per block, not once per connection: a rule added at run time
        # must reach connections that are already open.
        slow_apis = routing.slow_request_apis
        order = self.order
        in_flight = self.in_flight
        frames_counter = self.proxy.request_frame_counters
        tracing = self.proxy.trace is not None
        framed = events.framed_requests if tracing else ()
        client_ids = self.client_ids
        limit = self.max_outstanding
        paused = False
        now = trio.current_time()
        run_start = offsets[0]  # start of the run of frames forwarded untouched
        ends = offsets[1:]
        ends.append(len(block))
        for start, end in zip(offsets, ends):
            if len(order) >= limit and backpressure.may_pause(self):
                if run_start < start:
                    await self.send_upstream(block[run_start:start])
                    run_start = start
                await backpressure.wait_for_room(self)
                paused = True
                now = trio.current_time()
            try:
                header = parse_request_header(block, start + 4, client_ids)
            except DecodeError as exc:
                metrics.protocol_errors.labels("undecodable").inc()
                raise ConnectionClosed("undecodable", f"client sent an undecodable request header: {exc}") from None
            api_key = header.api_key
            counter = frames_counter.get(api_key)
            if counter is None:
                counter = self.proxy.request_counter(api_key)
            counter.inc()
            ex = Exchange(api_key, header.api_version, header.correlation_id, header.client_id, now)
            if api_key not in slow_apis and (
                api_key != apis.PRODUCE or routing.produce_is_plain(block, start + 4, header, ex)
            ):
                if ex.expects_response:
                    order.append(ex)
                    in_flight[header.correlation_id] = ex
                ex.sent = now
                if tracing:
                    if api_key in framed:
                        row = events.fast_request(self, ex, end - start - 4, block[start:end], header)
                    else:
                        row = events.fast_request(self, ex, end - start - 4)
                    await proxy.emit_trace(row)
                continue
            # Off the fast path: forward what came before untouched, then
            # let the pipeline decide what happens to this frame.
            if run_start < start:
                await self.send_upstream(block[run_start:start])
            run_start = end
            ex.header = header
            ex.request_frame = block[start:end]
            await delivery.on_request(self, ex)
        if run_start < len(block):
            await self.send_upstream(block[run_start:] if run_start else block)
        return paused

    def order_shrank(self) -> None:
        """A held request left `order`: a paused request pump may read on."""
        room = self.room
        if room is not None and len(self.order) < self.max_outstanding:
            room.set()

    async def _client_eof(self) -> None:
        """The client closed its side: finish answering, then close (half-close)."""
        if self.upstream is not None:
            try:
                self.upstream.shutdown(socket.SHUT_WR)
            except OSError:
                pass
        if self.order:
            with trio.move_on_after(DRAIN_TIMEOUT):
                await self.drained.wait()
        raise ConnectionClosed("client_closed", "client closed the connection")

    def track(self, ex: Exchange) -> None:
        """Register an exchange whose response must go back in arrival order."""
        if ex.expects_response:
            self.order.append(ex)

    def expect_upstream_response(self, ex: Exchange) -> None:
        if ex.expects_response:
            self.in_flight[ex.correlation_id] = ex

    async def send_upstream(self, data: bytes) -> None:
        lock = self.upstream_lock
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            await self.send_upstream_locked(data)
        finally:
            lock.release()

    async def send_upstream_locked(self, data: bytes) -> None:
        sock = self.upstream
        if sock is None:
            return
        try:
            await net.send_all(sock, data)
        except OSError as exc:
            raise ConnectionClosed(
                "upstream_closed", f"broker {self.upstream_endpoint} connection failed while sending: {exc}"
            ) from None

    # ------------------------------------------------------------------ broker -> client

    async def _pump_responses(self) -> None:
        assert self.upstream is not None
        frames = FrameBuffer(self.proxy.config.max_frame_bytes)
        upstream = net.reader(self.upstream)
        cut: cut_through.CutThrough | None = None
        recv_size = net.RECV_BYTES
        while True:
            if cut is not None:
                n = cut.relayable()
                if n:
                    await cut_through.relay_part(self, cut, n)
                    if not cut.remaining:
                        await cut_through.finish(self, cut)
                        cut = None
                        recv_size = AFTER_CUT_RECV_BYTES
                    continue
                recv_size = cut.recv_size()
            cut, recv_size = await self._pump_one_read(frames, upstream, cut, recv_size)

    async def _pump_one_read(
        self, frames: FrameBuffer, upstream: net.Reader, cut: cut_through.CutThrough | None, recv_size: int
    ) -> tuple[cut_through.CutThrough | None, int]:
        """One recv from the broker, forwarded; returns the frame now cut-through (if any) and the next recv size."""
        try:
            data = await upstream.recv(recv_size)
        except OSError as exc:
            raise ConnectionClosed(
                "upstream_closed", f"broker {self.upstream_endpoint} connection failed: {exc}"
            ) from None
        if not data:
            raise ConnectionClosed("upstream_closed", f"broker {self.upstream_endpoint} closed the connection")
        _RESPONSE_BYTES.inc(len(data))
        if cut is not None:
            remaining = cut.remaining
            if len(data) <= remaining:
                await cut_through.forward(self, cut, data)
                if cut.remaining:
                    return cut, recv_size
                data = b""
            else:
                await cut_through.forward(self, cut, memoryview(data)[:remaining])
                data = data[remaining:]
            await cut_through.finish(self, cut)
            if not data:
                return None, AFTER_CUT_RECV_BYTES
        block, offsets = _feed(frames, data, "broker")
        if offsets:
            await self._answer_frames(block, offsets)
        if frames.pending_frame_size >= CUT_THROUGH_BYTES and frames.pending >= 8:
            return await cut_through.start(self, frames), net.RECV_BYTES
        return None, net.RECV_BYTES

    async def _answer_frames(self, block: bytes, offsets: list[int]) -> None:
        """Route the complete response frames of one read back to the client."""
        proxy = self.proxy
        routing = proxy.pipeline.routing
        in_flight = self.in_flight
        order = self.order
        latency = proxy.client_latency_histograms
        response_counters = proxy.response_frame_counters
        inspect_from = routing.inspect_responses_from
        hints_only = routing.leader_hints_only
        addresses = proxy.addresses
        tracing = proxy.trace is not None
        now = trio.current_time()
        untouched = True  # every frame passes through, in order: send the block as is
        ends = offsets[1:]
        ends.append(len(block))
        for i, (start, end) in enumerate(zip(offsets, ends)):
            corr = _I32.unpack_from(block, start + 4)[0]
            ex = in_flight.pop(corr, None)
            if ex is None:
                raise ConnectionClosed(
                    "upstream_closed", f"broker answered correlation id {corr}, which was never asked"
                )
            counter = response_counters.get(ex.api_key)
            if counter is None:
                counter = proxy.response_counter(ex.api_key)
            counter.inc()
            if untouched and (i >= len(order) or order[i] is not ex):
                untouched = False
            min_version = inspect_from.get(ex.api_key)
            if ex.header is None and (
                min_version is None
                or ex.api_version < min_version
                or (ex.api_key in hints_only and not addresses.may_name_brokers_in(block, start, end))
            ):
                ex.response_frame = block[start:end]
                hist = latency.get(ex.api_key)
                if hist is None:
                    hist = proxy.latency_histogram(ex.api_key)
                hist.observe(now - ex.arrived)
                if tracing:
                    await proxy.emit_trace(proxy.events.fast_response(self, ex, ex.response_frame, now))
            else:
                untouched = False
                await proxy.delivery.on_response(self, ex, block[start:end], now)
        if untouched:
            for _ in offsets:
                order.popleft()
            if self.room is not None:
                self.order_shrank()
            await self.send_client(block)
            if not order:
                self.drained.set()
        else:
            await self.flush_responses()

    async def flush_responses(self) -> None:
        """Send every response that is ready, in request order."""
        order = self.order
        out = []
        while order:
            head = order[0]
            if head.response_frame is None:
                break
            order.popleft()
            if not head.suppress_response:
                out.append(head.response_frame)
        if self.room is not None:
            self.order_shrank()
        if out:
            await self.send_client(b"".join(out) if len(out) > 1 else out[0])
        if not order:
            self.drained.set()

    async def send_client(self, data: bytes) -> None:
        lock = self.client_lock
        if lock.locked():
            await lock.acquire()
        else:
            lock.acquire_nowait()
        try:
            await net.send_all(self.client, data)
        except OSError as exc:
            raise ConnectionClosed("client_closed", f"client connection failed while sending: {exc}") from None
        finally:
            lock.release()
