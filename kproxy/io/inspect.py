"""The slow path: everything the proxy does beyond reading headers.

A request comes here when its API needs it: the transactional APIs (for the
tracker), a transactional Produce, or an API some fault rule wants. A
response comes here when it names brokers, caps versions, or answers a
request that came here. Tracing at either level leaves the fast path alone:
the connection's pumps call `trace_fast_request`/`trace_fast_response` for
what they forward untouched, and at level `records` hand Produce and Fetch
frames to the trace writer, which scans their batches on its own thread
(kproxy.obs.trace_records).

Order of work for a request: decode (only if something needs the body) ->
number it on the client side -> ask the fault engine -> carry out the
decision -> on delivery, number it on the broker side, check for a hazard
(guard mode refuses hazardous deliveries) -> send.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

import trio

from kproxy.faults import decisions as d
from kproxy.faults.actions.rewrite import apply_rewrite
from kproxy.faults.view import RequestView
from kproxy.io.exchange import Exchange
from kproxy.obs import metrics
from kproxy.obs.trace_records import FetchResponseRecords, ProduceRequestRecords, ProduceResponseRecords, RawPartitions
from kproxy.obs.trace_schema import FIELD_NAMES
from kproxy.protocol import apis
from kproxy.protocol.codec import (
    DecodeError,
    decode_request,
    decode_response,
    encode_response,
    error_codes,
    response_correlation_id,
)
from kproxy.protocol.error_responses import error_response, replace_error_codes
from kproxy.protocol.error_scan import FetchErrorScan, produce_error_codes, produce_scannable, scannable
from kproxy.protocol.produce_peek import body_start, produce_acks, produce_transactional_id
from kproxy.protocol.rewrite import ADDRESS_APIS, LEADER_HINT_MIN_VERSION, cap_api_versions, rewrite_addresses
from kproxy.txn.extract import response_update, txn_requests

if TYPE_CHECKING:
    from kproxy.io.connection import ClientConnection
    from kproxy.io.proxy import Proxy

log = logging.getLogger("kproxy.inspect")

# Kafka error a guard-mode refusal answers with: the transaction is not in a
# state where this request belongs (the client sees a definite failure).
INVALID_TXN_STATE = 48



class HeldRequest:
    __slots__ = ("conn", "ex", "decision", "released", "copy")

    def __init__(self, conn: ClientConnection, ex: Exchange, decision: Any, copy: int) -> None:
        self.conn = conn
        self.ex = ex
        self.decision = decision
        self.released = trio.Event()
        self.copy = copy


class Inspector:
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.slow_request_apis: Any = frozenset()
        # api key -> lowest version whose responses must be looked at
        self.inspect_responses_from: dict[int, int] = {}
        # APIs whose responses are looked at only for leader hints: one that
        # names no upstream host cannot carry any and may pass untouched.
        self.leader_hints_only: frozenset[int] = frozenset()
        self.holds: list[HeldRequest] = []
        self.refresh()

    def refresh(self) -> None:
        """Recompute which APIs leave the fast path (rules or tracing changed)."""
        engine = self.proxy.engine
        responses = {key: 0 for key in ADDRESS_APIS}
        responses[apis.API_VERSIONS] = 0
        responses.update(LEADER_HINT_MIN_VERSION)
        # Tracing at `records` keeps the fast path: the trace writer scans the
        # forwarded frames' batch headers on its own thread (kproxy.obs.trace_records).
        slow = set(apis.TRANSACTIONAL_APIS)
        # A response rule acts on the decoded response, so its exchanges
        # must carry their header through the slow path too.
        slow.update(k for k in apis.API_NAMES if engine.wants(k, "request") or engine.wants(k, "response"))
        self.slow_request_apis = frozenset(slow)
        for key in apis.API_NAMES:
            if engine.wants(key, "response"):
                responses[key] = 0
        self.inspect_responses_from = responses
        self.leader_hints_only = frozenset(
            key for key, version in LEADER_HINT_MIN_VERSION.items() if responses.get(key) == version
        )

    # ------------------------------------------------------------------ requests

    def produce_is_plain(self, payload: bytes, start: int, header: Any, ex: Exchange) -> bool:
        """Fast-path check for Produce: non-transactional (and note acks=0)."""
        try:
            if produce_transactional_id(payload, start, header) is not None:
                return False
            if produce_acks(payload, start, header) == 0:
                ex.expects_response = False
        except DecodeError:
            return False  # the slow path decodes it and reports the error
        return True

    def _undecodable(self, what: str, exc: Exception) -> Exception:
        from kproxy.io.connection import ConnectionClosed

        metrics.protocol_errors.labels("undecodable").inc()
        return ConnectionClosed("undecodable", f"undecodable {what}: {exc}")

    def _decode(self, ex: Exchange) -> Any:
        if ex.request is None and ex.header.body_offset >= 0:
            try:
                ex.request = decode_request(ex.header, ex.frame, 4)
            except DecodeError as exc:
                raise self._undecodable(f"{apis.api_name(ex.api_key)} v{ex.api_version} request", exc) from None
        return ex.request

    async def on_request(self, conn: ClientConnection, ex: Exchange) -> None:
        proxy = self.proxy
        engine = proxy.engine
        api_key = ex.api_key
        txn_id = None
        if api_key == apis.PRODUCE:
            try:
                txn_id = produce_transactional_id(ex.frame, 4, ex.header)
                if produce_acks(ex.frame, 4, ex.header) == 0:
                    ex.expects_response = False
            except DecodeError as exc:
                raise self._undecodable("Produce request", exc) from None
        wants = engine.wants(api_key, "request")
        if (
            api_key in apis.TRANSACTIONAL_APIS
            or txn_id is not None
            or (wants and engine.needs_body(api_key, "request"))
        ):
            request = self._decode(ex)
            if request is not None:
                ex.txn = txn_requests(api_key, request)
                # A batched AddPartitionsToTxn carries several producers, each with its own number.
                ex.txn_numbers = tuple(proxy.tracker.on_request(txn) for txn in ex.txn)
                if ex.txn_numbers:
                    ex.txn_client = ex.txn_numbers[0]
        if proxy.trace_records and api_key == apis.PRODUCE:
            ex.request_partitions = ProduceRequestRecords(
                ex.api_version, ex.frame, body_start(ex.frame, 4, ex.header), proxy.topic_names, proxy.trace.raw_ledger
            )
        decision = d.FORWARD
        if wants:
            decision = engine.decide(self._view(ex, "request"), proxy.clock())
        if decision.rule_id:
            ex.decision = decision
            metrics.faults_applied.labels(decision.rule_id, decision.action).inc()
        await self._carry_out(conn, ex, decision)
        self._release_retries(ex)

    def _view(self, ex: Exchange, direction: str) -> RequestView:
        request = ex.request
        topics = None
        committed = None
        txn_id = ex.txn[0].transactional_id if ex.txn else getattr(request, "transactional_id", None)
        if request is not None:
            topics = _topics_of(request)
            if ex.api_key == apis.END_TXN:
                committed = bool(request.committed)
        return RequestView(
            api_key=ex.api_key,
            api_version=ex.api_version,
            direction=direction,  # type: ignore[arg-type]
            client_id=ex.client_id,
            transactional_id=txn_id,
            topics=topics,
            committed=committed,
            txn_number=ex.txn_client,
        )

    async def _carry_out(self, conn: ClientConnection, ex: Exchange, decision: Any) -> None:
        proxy = self.proxy
        if isinstance(decision, (d.Forward, d.ReplaceError, d.DropResponse, d.Rewrite)):
            await self.deliver(conn, ex)
        elif isinstance(decision, d.Delay):
            conn.track(ex)
            ex.outcome = "delayed"
            proxy.nursery_for(conn).start_soon(self._deliver_later, conn, ex, decision.seconds)
        elif isinstance(decision, d.Duplicate):
            await self.deliver(conn, ex)
            ex.outcome = "duplicated"
            held = HeldRequest(conn, ex, decision, copy=1)
            if decision.hold_until is not None:
                self.holds.append(held)
            proxy.nursery.start_soon(self._duplicate_task, held)
        elif isinstance(decision, d.Drop):
            conn.track(ex)  # never answered: later responses wait behind it, as on a stuck broker
            ex.outcome = "dropped"
            await self._trace_request(conn, ex)
        elif isinstance(decision, d.Respond):
            conn.track(ex)
            ex.outcome = "answered"
            await self._answer_with_error(conn, ex, decision.error_code)
        elif isinstance(decision, d.Disconnect):
            if decision.when == "after":
                await self.deliver(conn, ex)
                if ex.expects_response:
                    # Cut when the broker's answer is in (on_response): the request
                    # has then surely been applied, and the answer surely lost.
                    return
                self._disconnect(conn, decision, "after forwarding")
            else:
                ex.outcome = "dropped"
                await self._trace_request(conn, ex)
                self._disconnect(conn, decision, "before forwarding")
        elif isinstance(decision, d.Hold):
            conn.track(ex)
            ex.outcome = "held"
            held = HeldRequest(conn, ex, decision, copy=0)
            self.holds.append(held)
            proxy.nursery.start_soon(self._hold_task, held)
        else:  # pragma: no cover - the engine only returns the decisions above
            raise AssertionError(f"unknown decision {decision!r}")

    @staticmethod
    def _disconnect(conn: ClientConnection, decision: Any, moment: str) -> None:
        reason = f"fault rule {decision.rule_id!r} disconnected the {decision.side} side {moment}"
        if not conn.closed_on_purpose:
            conn.close_rule = decision.rule_id  # the close event names the rule that cut the connection
        if decision.side == "upstream":
            conn.drop_upstream(reason)
        else:
            conn.close("fault_disconnect", reason)

    async def _answer_with_error(self, conn: ClientConnection, ex: Exchange, error_code: int) -> None:
        if not ex.expects_response:  # acks=0: a broker would not answer either
            await self._trace_request(conn, ex)
            return
        request = self._decode(ex)
        if request is None:
            log.warning("cannot answer %s v%d with an error: no decoder; forwarding", apis.api_name(ex.api_key), ex.api_version)
            ex.outcome = "delivered"
            conn.order.remove(ex)
            await self.deliver(conn, ex)
            return
        response = error_response(ex.api_key, ex.api_version, request, error_code)
        ex.response = encode_response(response, ex.correlation_id)
        metrics.frames.labels(apis.api_name(ex.api_key), "response", "proxy").inc()
        await self._trace_request(conn, ex)
        await self._trace_response(conn, ex, len(ex.response) - 4, [error_code], None)
        await conn.flush_responses()

    def _guard_refuses(self, ex: Exchange) -> Any:
        """The hazard guard mode refuses this delivery for, if any."""
        tracker = self.proxy.tracker
        for txn, number in zip(ex.txn, ex.txn_numbers):
            hazard = tracker.check_delivery(txn, number)
            if hazard is not None and hazard.kind in ("stale_end_txn", "late_produce"):
                return hazard
        return None

    def _number_delivery(self, ex: Exchange) -> None:
        tracker = self.proxy.tracker
        for txn, number in zip(ex.txn, ex.txn_numbers):
            delivery = tracker.on_delivery(txn, number)
            if ex.txn_broker is None:
                ex.txn_broker = delivery.broker_number
            if delivery.hazard is not None and ex.hazard is None:
                ex.hazard = delivery.hazard
                metrics.txn_hazards.labels(delivery.hazard.kind).inc()
                log.warning(
                    "hazard %s: %s %s (client txn %d delivered into broker txn %d)%s",
                    delivery.hazard.kind, apis.api_name(ex.api_key), txn.transactional_id,
                    delivery.hazard.client_number, delivery.hazard.broker_number,
                    f" under rule {ex.decision.rule_id!r}" if ex.decision is not None else "",
                )
            if txn.kind == "end_txn":
                metrics.txn_ended.labels("commit" if txn.committed else "abort").inc()
        if ex.txn:
            self.proxy.publish_txn_stats()

    async def deliver(self, conn: ClientConnection, ex: Exchange, *, tracked: bool = False) -> None:
        """Send a request to the broker on the client's own connection."""
        if self.proxy.config.guard and ex.txn:
            hazard = self._guard_refuses(ex)
            if hazard is not None:
                await self._refuse(conn, ex, hazard, tracked)
                return
        self._number_delivery(ex)
        if not tracked:
            conn.track(ex)
        conn.expect_upstream_response(ex)
        ex.sent = self.proxy.clock()
        await self._trace_request(conn, ex)
        await conn.send_upstream(ex.frame)

    async def _refuse(self, conn: ClientConnection | None, ex: Exchange, hazard: Any, tracked: bool) -> None:
        metrics.guard_refusals.labels(hazard.kind).inc()
        ex.outcome = "refused"
        ex.hazard = hazard
        log.warning(
            "guard refused %s for %s: client txn %d would land in broker txn %d",
            apis.api_name(ex.api_key), ex.txn[0].transactional_id, hazard.client_number, hazard.broker_number,
        )
        await self._trace_request(conn, ex)
        if conn is not None and not conn.closed.is_set() and ex.copy == 0:
            if not tracked:
                conn.track(ex)
            await self._answer_with_error(conn, ex, INVALID_TXN_STATE)

    async def _deliver_later(self, conn: ClientConnection, ex: Exchange, seconds: float) -> None:
        metrics.pending_requests.labels("delayed").inc()
        try:
            await trio.sleep(seconds)
        finally:
            metrics.pending_requests.labels("delayed").dec()
        await self.deliver(conn, ex, tracked=True)

    # ------------------------------------------------------------------ holds, duplicates, ghosts

    async def _hold_task(self, held: HeldRequest) -> None:
        try:
            await self._hold(held)
        except Exception:
            log.exception("held %s could not be delivered", apis.api_name(held.ex.api_key))

    async def _hold(self, held: HeldRequest) -> None:
        decision = held.decision
        metrics.pending_requests.labels("held").inc()
        try:
            if decision.timeout_s is None:
                await held.released.wait()
            else:
                with trio.move_on_after(decision.timeout_s):
                    await held.released.wait()
        finally:
            metrics.pending_requests.labels("held").dec()
            if held in self.holds:
                self.holds.remove(held)
        conn, ex = held.conn, held.ex
        if decision.ghost or conn.closed.is_set():
            await self.ghost_deliver(conn, ex, copy=0)
        else:
            try:
                await self.deliver(conn, ex, tracked=True)
            except Exception as exc:  # the client's connection died meanwhile
                log.info("held request could not use the client connection (%s); delivering as ghost", exc)
                await self.ghost_deliver(conn, ex, copy=0)

    async def _duplicate_task(self, held: HeldRequest) -> None:
        try:
            await self._duplicate(held)
        except Exception:
            log.exception("duplicate of %s could not be delivered", apis.api_name(held.ex.api_key))

    async def _duplicate(self, held: HeldRequest) -> None:
        decision = held.decision
        if decision.hold_until is not None:
            metrics.pending_requests.labels("held").inc()
            try:
                with trio.move_on_after(self.proxy.config.hold_timeout):
                    await held.released.wait()
            finally:
                metrics.pending_requests.labels("held").dec()
                if held in self.holds:
                    self.holds.remove(held)
        for copy in range(1, decision.copies + 1):
            await trio.sleep(decision.spacing_s)
            await self.ghost_deliver(held.conn, held.ex, copy=copy)

    async def ghost_deliver(self, conn: ClientConnection, ex: Exchange, copy: int) -> None:
        """Deliver over the proxy's own connection; the response is traced and dropped."""
        ghost = _ghost_copy(ex, copy)
        if copy:  # a copy is a frame of the proxy's own; a held request (copy 0) was counted on arrival
            metrics.frames.labels(apis.api_name(ex.api_key), "request", "ghost").inc()
        if self.proxy.config.guard and ghost.txn:
            hazard = self._guard_refuses(ghost)
            if hazard is not None:
                await self._refuse(None, ghost, hazard, True)
                return
        self._number_delivery(ghost)
        ghost.sent = self.proxy.clock()
        ghost.outcome = "ghost"
        await self._trace_request(conn, ghost)
        link = self.proxy.ghost_link(conn.node_id)
        metrics.pending_requests.labels("ghost").inc()
        try:
            await link.send(self.proxy.nursery, ghost.frame, (conn, ghost), ghost.expects_response)
        except (OSError, trio.TooSlowError) as exc:
            if not ghost.expects_response:  # else the link reported it lost (on_ghost_link_closed)
                metrics.pending_requests.labels("ghost").dec()
            log.warning("ghost delivery of %s failed: %s", apis.api_name(ex.api_key), exc)
            return
        if not ghost.expects_response:
            metrics.pending_requests.labels("ghost").dec()

    async def on_ghost_link_closed(self, node_id: int, tokens: list[Any], reason: str) -> None:
        """A ghost link closed with deliveries unanswered: account for them (gauge, trace)."""
        metrics.pending_requests.labels("ghost").dec(len(tokens))
        if self.proxy.trace is None:
            return
        entries = [_in_flight_entry(conn.conn_id, ghost, "awaiting_broker") for conn, ghost in tokens]
        await self.proxy.emit_trace(self._close_event(None, node_id, reason, None, entries))

    async def on_ghost_response(self, token: Any, frame: bytes) -> None:
        conn, ghost = token
        metrics.pending_requests.labels("ghost").dec()
        metrics.frames.labels(apis.api_name(ghost.api_key), "response", "ghost").inc()
        now = self.proxy.clock()
        decoded, codes = self._decode_response_for_facts(ghost, frame)
        self._learn_from_response(ghost, decoded)
        await self._trace_response(conn, ghost, len(frame) - 4, codes, decoded, now=now)

    def _release_next_txn(self, delivered: Exchange) -> None:
        """Release holds waiting for their producer's next transaction to send records."""
        if not self.holds or delivered.api_key != apis.PRODUCE:
            return
        txn_id = delivered.txn[0].transactional_id
        for held in list(self.holds):
            until = getattr(held.decision, "hold_until", None) or getattr(held.decision, "until", None)
            if (
                until == "next_txn_records"
                and held.ex.txn
                and held.ex.txn[0].transactional_id == txn_id
                and (delivered.txn_client or 0) > (held.ex.txn_client or 0)
            ):
                self.holds.remove(held)
                held.released.set()

    def _release_retries(self, arrived: Exchange) -> None:
        """Release holds waiting for the client to retry the same request."""
        if not self.holds:
            return
        txn_id = arrived.txn[0].transactional_id if arrived.txn else None
        for held in list(self.holds):
            until = getattr(held.decision, "hold_until", None) or getattr(held.decision, "until", None)
            ex = held.ex
            if (
                until == "client_retry"
                and ex is not arrived
                and ex.api_key == arrived.api_key
                and ex.client_id == arrived.client_id
                and (not ex.txn or ex.txn[0].transactional_id == txn_id)
            ):
                self.holds.remove(held)
                held.released.set()

    def connection_closed(self, conn: ClientConnection) -> None:
        for held in list(self.holds):
            until = getattr(held.decision, "hold_until", None) or getattr(held.decision, "until", None)
            if held.conn is conn and until == "client_disconnect":
                self.holds.remove(held)
                held.released.set()

    # ------------------------------------------------------------------ responses

    async def on_response(self, conn: ClientConnection, ex: Exchange, frame: bytes, now: float) -> None:
        proxy = self.proxy
        api_key = ex.api_key
        decision = ex.decision
        if proxy.engine.wants(api_key, "response"):
            response_decision = proxy.engine.decide(self._view(ex, "response"), now)
            if response_decision.rule_id:
                metrics.faults_applied.labels(response_decision.rule_id, response_decision.action).inc()
                if isinstance(response_decision, d.Delay):
                    await trio.sleep(response_decision.seconds)
                decision = response_decision
                ex.decision = decision
        response = frame
        decoded = None
        codes: list[int] = []
        needs_rewrite = api_key in ADDRESS_APIS or api_key == apis.API_VERSIONS or (
            api_key in LEADER_HINT_MIN_VERSION
            and ex.api_version >= LEADER_HINT_MIN_VERSION[api_key]
            and proxy.addresses.may_name_brokers(frame)
        )
        if needs_rewrite:
            response, decoded = await self._rewrite(ex, frame)
            if api_key == apis.METADATA and ex.header is None:
                # Fetch v13+ names topics by id: the trace (any level) maps them back.
                self._learn_topic_names(decoded)
        if ex.header is not None:
            if decoded is None:
                decoded, codes = self._decode_response_for_facts(ex, frame)
            else:
                codes = error_codes(decoded)
            self._learn_from_response(ex, decoded)
            # Release copies held for "the next transaction's first records"
            # only once the broker has written them: releasing on send races
            # the copy (own connection) against the records.
            if ex.txn and api_key == apis.PRODUCE:
                self._release_next_txn(ex)
            changed = None
            if isinstance(decision, d.ReplaceError) and decoded is not None:
                changed = replace_error_codes(decoded, decision.error_code)
                ex.outcome = "rewritten"
            elif isinstance(decision, d.Rewrite) and decoded is not None:
                changed = apply_rewrite(decision, decoded, proxy.topic_names)
                ex.outcome = "rewritten"
            if changed is not None:
                response = encode_response(changed, ex.correlation_id)
                codes = error_codes(changed)
            elif isinstance(decision, (d.DropResponse, d.Drop, d.Disconnect)):
                # A request-side Drop never reaches here (it was not forwarded):
                # here all three mean the response is lost on its way to the
                # client (a Disconnect then also cuts the connection, below).
                ex.suppress_response = True
                ex.outcome = "dropped"
            # Trace what the client gets; when a rule changed it, what the
            # broker sent as well, so the analysis can tell what the rule did.
            await self._trace_response(conn, ex, len(response) - 4, codes, changed or decoded, now=now,
                                       upstream=decoded if changed is not None else None)
        elif proxy.trace is not None:  # a fast-path exchange whose response needed rewriting
            await self.trace_fast_response(
                conn, ex, response, now, codes=error_codes(decoded) if decoded is not None else None
            )
        ex.response = response
        if isinstance(decision, d.Disconnect) and ex.header is not None:
            self._disconnect(conn, decision, "instead of passing on the broker's answer")
        proxy.latency_histogram(api_key).observe(now - ex.arrived)
        if ex.sent:
            metrics.upstream_latency.labels(apis.api_name(api_key)).observe(now - ex.sent)
        for code in codes:
            proxy.count_error(api_key, code)

    def _decode_response_for_facts(self, ex: Exchange, frame: bytes) -> tuple[Any, list[int]]:
        """Decode a response the tracker, a rule or the trace needs; never fatal."""
        try:
            decoded = decode_response(ex.api_key, ex.api_version, frame[4:])
        except DecodeError as exc:
            log.debug("response to %s v%d not decodable: %s", apis.api_name(ex.api_key), ex.api_version, exc)
            return None, []
        return decoded, error_codes(decoded)

    def _learn_from_response(self, ex: Exchange, decoded: Any) -> None:
        if decoded is None:
            return
        tracker = self.proxy.tracker
        for txn in ex.txn:
            update = response_update(ex.api_key, txn, decoded)
            if update is not None:
                tracker.on_response(txn, update)
        if ex.txn:
            self.proxy.publish_txn_stats()
        if ex.api_key == apis.METADATA:
            self._learn_topic_names(decoded)

    def _learn_topic_names(self, decoded: Any) -> None:
        for topic in getattr(decoded, "topics", ()):
            topic_id = getattr(topic, "topic_id", None)
            if topic_id is not None and topic.name:
                self.proxy.topic_names[topic_id] = topic.name

    async def _rewrite(self, ex: Exchange, frame: bytes) -> tuple[bytes, Any]:
        payload = frame[4:]
        try:
            decoded = decode_response(ex.api_key, ex.api_version, payload)
        except DecodeError as exc:
            if ex.api_key == apis.API_VERSIONS and ex.api_version > 0:
                # A broker that does not support the client's ApiVersions
                # version answers in v0 format (KIP-511).
                try:
                    decoded = decode_response(ex.api_key, 0, payload)
                except DecodeError:
                    decoded = None
                if decoded is not None:
                    return encode_response(cap_api_versions(decoded, self.proxy.version_caps), response_correlation_id(payload)), None
            if ex.api_key in ADDRESS_APIS:
                raise self._undecodable(
                    f"{apis.api_name(ex.api_key)} v{ex.api_version} response (its addresses must be rewritten)", exc
                ) from None
            return frame, None  # leader hints are best effort: pass the response through
        if ex.api_key == apis.API_VERSIONS:
            new = cap_api_versions(decoded, self.proxy.version_caps)
        else:
            new, learnt = rewrite_addresses(decoded, self.proxy.addresses)
            for node_id in learnt:
                await self.proxy.ensure_listener(node_id)
        if new is decoded:
            return frame, decoded
        return encode_response(new, ex.correlation_id), new

    # ------------------------------------------------------------------ traces

    async def _trace_request(self, conn: ClientConnection | None, ex: Exchange) -> None:
        trace = self.proxy.trace
        if trace is None:
            return
        event = self._event(conn, ex, "request", len(ex.frame) - 4 if ex.frame else 0)
        event["partitions"] = ex.request_partitions
        await self.proxy.emit_trace(event)

    async def _trace_response(
        self, conn: ClientConnection | None, ex: Exchange, size: int, codes: list[int], decoded: Any,
        now: float | None = None, upstream: Any = None,
    ) -> None:
        proxy = self.proxy
        if proxy.trace is None:
            return
        now = proxy.clock() if now is None else now
        event = self._event(conn, ex, "response", size)
        event["latency_ms"] = (now - ex.arrived) * 1000.0
        event["upstream_latency_ms"] = (now - ex.sent) * 1000.0 if ex.sent else None
        event["error_code"] = codes[0] if codes else 0
        event["error_codes"] = codes
        if proxy.trace_records and decoded is not None:
            views = proxy.record_views
            if ex.api_key == apis.PRODUCE and ex.request_partitions is not None:
                event["partitions"] = ProduceResponseRecords(
                    ex.request_partitions, ex.api_version, parts=views.produce_response_partitions(decoded, None, proxy.topic_names)
                )
            elif ex.api_key == apis.FETCH:
                event["partitions"] = views.fetch_response_partitions(decoded, proxy.topic_names)
                if upstream is not None:
                    event["upstream_partitions"] = views.fetch_response_partitions(upstream, proxy.topic_names)
        await proxy.emit_trace(event)

    async def trace_close(self, conn: ClientConnection, unsent: list[Exchange]) -> None:
        """The connection-close event: why it closed, and every request the client had no answer to.

        `unsent` are requests read from the client but never forwarded (the
        broker could not be reached). Every other one is in `conn.order`.
        """
        in_flight = conn.in_flight
        entries = [_in_flight_entry(conn.conn_id, ex, "not_sent") for ex in unsent]
        for ex in conn.order:
            entries.append(_in_flight_entry(conn.conn_id, ex, _in_flight_state(ex, in_flight)))
        rule = conn.close_rule if conn.close_reason == "fault_disconnect" else None
        await self.proxy.emit_trace(self._close_event(conn, conn.node_id, conn.close_reason, rule, entries))

    def _close_event(
        self, conn: ClientConnection | None, node_id: int, reason: str, rule: str | None, entries: list[dict[str, Any]]
    ) -> dict[str, Any]:
        proxy = self.proxy
        event = dict.fromkeys(_EVENT_FIELDS)
        event.update(
            wall_time=proxy.wall_clock(),
            mono_ns=proxy.mono_ns(),
            proxy_id=proxy.config.proxy_id,
            conn_id=conn.conn_id if conn is not None else -1,
            client_addr=conn.client_addr if conn is not None else None,
            broker_id=node_id,
            direction="close",
            rule=rule,
            action="disconnect" if rule is not None else None,
            close_reason=reason,
            in_flight=entries,
        )
        return event

    # Events for the fast path are handed to the trace writer as a tuple
    # (builder, args...) and built on its thread: the data path pays for a
    # tuple, not for a 30-field dict and an error-code walk. Everything the
    # builder reads is fixed by then (a fast-path exchange never changes).
    # Small frames travel along for their error codes; a Fetch frame is
    # scanned here, so no large frame waits in the trace queue.
    _DEFER_FRAME_BYTES = 4096

    async def trace_fast_request(
        self, conn: ClientConnection, ex: Exchange, size: int, frame: bytes | None = None, header: Any = None
    ) -> None:
        """Trace a request the fast path forwards untouched; at `records` a Produce comes with its frame and header."""
        proxy = self.proxy
        if frame is not None and proxy.trace_records:
            ex.request_partitions = ProduceRequestRecords(
                ex.api_version, frame, body_start(frame, 4, header), proxy.topic_names, proxy.trace.raw_ledger
            )
        await proxy.emit_trace(
            (self._fast_event, conn, ex, "request", size, ex.request_partitions, None, 0.0, proxy.wall_clock(),
             proxy.mono_ns())
        )

    async def trace_fast_response(
        self,
        conn: ClientConnection,
        ex: Exchange,
        frame: bytes | None,
        now: float,
        *,
        size: int | None = None,
        codes: list[int] | None = None,
        chunks: list[bytes] | None = None,
    ) -> None:
        """Trace a response the fast path forwards untouched, with its error codes.

        A cut-through response comes with the codes its scan found on the
        way, or at level `records` with the chunks it forwarded; for the
        others see `_response_error_codes`. At level `records` a Fetch or
        Produce frame travels to the writer, which scans it there.
        """
        proxy = self.proxy
        if size is None:
            size = len(frame) - 4 if frame is not None else 0
        if proxy.trace_records:
            raw: Any = None
            if ex.api_key == apis.FETCH and (chunks is not None or frame is not None):
                raw = FetchResponseRecords(
                    ex.api_version, chunks if chunks is not None else frame, proxy.topic_names, proxy.trace.raw_ledger
                )
            elif ex.api_key == apis.PRODUCE and frame is not None:
                raw = ProduceResponseRecords(ex.request_partitions, ex.api_version, frame, ledger=proxy.trace.raw_ledger)
            if raw is not None:
                await proxy.emit_trace(
                    (self._fast_event, conn, ex, "response", size, raw, codes, now, proxy.wall_clock(), proxy.mono_ns())
                )
                return
        if codes is None and frame is not None and (ex.api_key == apis.FETCH or len(frame) > self._DEFER_FRAME_BYTES):
            codes = self._response_error_codes(ex, frame)
            frame = None
        await proxy.emit_trace(
            (self._fast_event, conn, ex, "response", size, frame, codes, now, proxy.wall_clock(), proxy.mono_ns())
        )

    def _fast_event(
        self, conn: ClientConnection, ex: Exchange, direction: str, size: int,
        frame: bytes | None, codes: list[int] | None, now: float, wall: float, mono: int,
    ) -> list[Any]:
        """Build a fast-path trace event as a row in `trace_schema.EVENT` order (by the trace writer, later).

        A row, not a dict: the segment format packs rows column by column
        (kproxy/obs/trace_segments.py), and a list costs a fraction of a
        33-key dict to build.
        """
        partitions = None
        if isinstance(frame, RawPartitions):
            partitions = frame
            if codes is None:
                # The records' walk reads the error codes too: no second walk of the frame.
                codes = frame.error_codes()
                if codes is None and isinstance(frame, (FetchResponseRecords, ProduceResponseRecords)):
                    raw = frame.frame
                    if isinstance(raw, bytes) and raw:
                        codes = self._response_error_codes(ex, raw)
            frame = None
        if direction == "response":
            if codes is None:
                codes = self._response_error_codes(ex, frame) if frame is not None else []
            latency = (now - ex.arrived) * 1000.0
            upstream = (now - ex.sent) * 1000.0 if ex.sent else None
            error_code = codes[0] if codes else 0
        else:
            latency = upstream = error_code = codes = None
        txn = ex.txn[0] if ex.txn else None
        decision = ex.decision
        hazard = ex.hazard
        return [
            None,  # schema_version: the writer's
            wall,
            mono,
            self.proxy.config.proxy_id,
            conn.conn_id,
            conn.client_addr,
            conn.node_id,
            direction,
            apis.api_name(ex.api_key),
            ex.api_key,
            ex.api_version,
            ex.correlation_id,
            ex.client_id,
            size,
            latency,
            upstream,
            error_code,
            codes,
            txn.transactional_id if txn else None,
            txn.producer_id if txn else None,
            txn.producer_epoch if txn else None,
            ex.txn_client,
            ex.txn_broker,
            hazard.kind if hazard is not None else None,
            txn.committed if txn is not None and txn.kind == "end_txn" else None,
            decision.rule_id if decision is not None else None,
            decision.action if decision is not None else None,
            ex.outcome,
            ex.copy,
            partitions,
            None,  # close_reason
            None,  # in_flight
            None,  # upstream_partitions
        ]

    def _response_error_codes(self, ex: Exchange, frame: bytes) -> list[int]:
        """Error codes without a kio decode where a scan knows the API (Fetch records are skipped, not copied)."""
        codes = None
        if ex.api_key == apis.FETCH and scannable(ex.api_version):
            scan = FetchErrorScan(ex.api_version)
            scan.feed(frame)
            codes = scan.codes
        elif ex.api_key == apis.PRODUCE and produce_scannable(ex.api_version):
            codes = produce_error_codes(ex.api_version, frame)
        if codes is None:
            codes = self._decode_response_for_facts(ex, frame)[1]
        return codes

    def _event(
        self, conn: ClientConnection | None, ex: Exchange, direction: str, size: int,
        wall: float | None = None, mono: int | None = None,
    ) -> dict[str, Any]:
        proxy = self.proxy
        txn = ex.txn[0] if ex.txn else None
        decision = ex.decision
        hazard = ex.hazard
        return {
            "wall_time": proxy.wall_clock() if wall is None else wall,
            "mono_ns": proxy.mono_ns() if mono is None else mono,
            "proxy_id": proxy.config.proxy_id,
            "conn_id": conn.conn_id if conn is not None else -1,
            "client_addr": conn.client_addr if conn is not None else None,
            "broker_id": conn.node_id if conn is not None else -1,
            "direction": direction,
            "api": apis.api_name(ex.api_key),
            "api_key": ex.api_key,
            "api_version": ex.api_version,
            "correlation_id": ex.correlation_id,
            "client_id": ex.client_id,
            "size": size,
            "latency_ms": None,
            "upstream_latency_ms": None,
            "error_code": None,
            "error_codes": None,
            "transactional_id": txn.transactional_id if txn else None,
            "producer_id": txn.producer_id if txn else None,
            "producer_epoch": txn.producer_epoch if txn else None,
            "txn_client": ex.txn_client,
            "txn_broker": ex.txn_broker,
            "hazard": hazard.kind if hazard is not None else None,
            "end_txn_commit": txn.committed if txn is not None and txn.kind == "end_txn" else None,
            "rule": decision.rule_id if decision is not None else None,
            "action": decision.action if decision is not None else None,
            "outcome": ex.outcome,
            "copy": ex.copy,
            "partitions": None,
            "upstream_partitions": None,
        }


_EVENT_FIELDS = tuple(f for f in FIELD_NAMES if f not in ("schema_version",))
# _fast_event lists its cells in this order.
assert FIELD_NAMES == (
    "schema_version", "wall_time", "mono_ns", "proxy_id", "conn_id", "client_addr", "broker_id", "direction", "api",
    "api_key", "api_version", "correlation_id", "client_id", "size", "latency_ms", "upstream_latency_ms", "error_code",
    "error_codes", "transactional_id", "producer_id", "producer_epoch", "txn_client", "txn_broker", "hazard",
    "end_txn_commit", "rule", "action", "outcome", "copy", "partitions", "close_reason", "in_flight",
    "upstream_partitions",
), "trace_schema.EVENT changed: update Inspector._fast_event"


def _in_flight_state(ex: Exchange, in_flight: dict[int, Exchange]) -> str:
    """Where an unanswered request was when its connection closed (docs/traces.md, close events)."""
    if ex.response is not None:
        return "response_dropped" if ex.suppress_response else "response_unsent"
    if in_flight.get(ex.correlation_id) is ex:
        return "awaiting_broker"
    if ex.outcome in ("delayed", "held", "dropped") and not ex.sent:
        return ex.outcome
    # Sent, and no longer awaited from the broker: its response was on its way to the client
    # (cut-through, or a response rule's delay) when the connection closed.
    return "responding" if ex.sent else "not_sent"


def _in_flight_entry(conn_id: int, ex: Exchange, state: str) -> dict[str, Any]:
    return {
        "conn_id": conn_id,
        "correlation_id": ex.correlation_id,
        "copy": ex.copy,
        "api": apis.api_name(ex.api_key),
        "api_key": ex.api_key,
        "api_version": ex.api_version,
        "state": state,
    }


def _ghost_copy(ex: Exchange, copy: int) -> Exchange:
    ghost = Exchange(ex.api_key, ex.api_version, ex.correlation_id, ex.client_id, ex.arrived)
    ghost.frame = ex.frame
    ghost.header = ex.header
    ghost.request = ex.request
    ghost.txn = ex.txn
    ghost.txn_client = ex.txn_client
    ghost.txn_numbers = ex.txn_numbers
    ghost.decision = ex.decision
    ghost.copy = copy
    ghost.expects_response = ex.expects_response
    ghost.request_partitions = ex.request_partitions
    return ghost


def _topics_of(request: Any) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """(topic, partitions) named by a decoded request, for topic/partition rules."""
    topics = getattr(request, "topics", None) or getattr(request, "topic_data", None)
    if not topics:
        return None
    out = []
    for topic in topics:
        name = getattr(topic, "name", None) or getattr(topic, "topic", None)
        if name is None:
            continue
        parts = getattr(topic, "partitions", None) or getattr(topic, "partition_data", None) or ()
        indexes = tuple(
            int(getattr(p, "partition_index", getattr(p, "index", getattr(p, "partition", p)))) for p in parts
        )
        out.append((name, indexes))
    return tuple(out) or None
