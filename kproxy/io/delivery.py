"""Carrying out the pipeline's plans: sends now or later, parked requests, copies, ghost deliveries.

The pipeline (kproxy.pipeline) decides; this module only moves bytes and
runs timers. A request off the fast path comes here from its connection's
request pump, goes through `Pipeline.on_request`, and its plan is carried out
here; its answer comes back from the response pump through `on_response`.

Traffic that must bypass a connection's order (a late copy, a request
delivered after the client hung up) goes over a link of the proxy's own per
broker (kproxy.io.ghost); its answer is traced and discarded.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import Any, Protocol

import trio

from kproxy.obs import metrics
from kproxy.obs.trace_events import TraceEvents, in_flight_entry
from kproxy.pipeline import plans
from kproxy.pipeline.answer_in_place import INVALID_TXN_STATE, error_answer
from kproxy.pipeline.decode import response_facts
from kproxy.pipeline.exchange import Exchange
from kproxy.pipeline.holds import Parked
from kproxy.pipeline.path import Pipeline
from kproxy.protocol import apis

log = logging.getLogger("kproxy.delivery")


class Connection(Protocol):
    """What delivery needs of a client connection (kproxy.io.connection.ClientConnection)."""

    conn_id: int
    client_addr: str
    node_id: int
    order: Any
    in_flight: dict[int, Exchange]
    nursery: trio.Nursery | None
    closed: trio.Event
    closed_on_purpose: bool
    close_rule: str | None
    close_reason: str

    def track(self, ex: Exchange) -> None: ...
    def expect_upstream_response(self, ex: Exchange) -> None: ...
    async def send_upstream(self, data: bytes) -> None: ...
    async def flush_responses(self) -> None: ...
    def close(self, reason: str, message: str) -> None: ...
    def drop_upstream(self, message: str) -> None: ...


class Delivery:
    def __init__(
        self,
        pipeline: Pipeline,
        events: TraceEvents | None,
        emit: Callable[[Any], Awaitable[None]],
        *,
        nursery: Callable[[], trio.Nursery],
        ghost_link: Callable[[int], Any],
        ensure_listener: Callable[[int], Awaitable[None]],
        count_error: Callable[[int, int], None],
        latency_histogram: Callable[[int], Any],
        hold_timeout: float,
    ) -> None:
        self.pipeline = pipeline
        self.events = events
        self.emit = emit
        self.nursery = nursery
        self.ghost_link = ghost_link
        self.ensure_listener = ensure_listener
        self.count_error = count_error
        self.latency_histogram = latency_histogram
        self.hold_timeout = hold_timeout

    @staticmethod
    def clock() -> float:
        return trio.current_time()

    # ------------------------------------------------------------------ requests

    async def on_request(self, conn: Connection, ex: Exchange) -> None:
        """A request off the fast path: plan it, carry the plan out, release what its arrival releases."""
        plan = self.pipeline.on_request(ex, self.clock())
        events = self.events
        if events is not None and events.records:
            events.request_records(ex)
        await self.carry_out(conn, ex, plan)
        for entry in self.pipeline.released_by_arrival(ex):
            entry.token.set()

    async def carry_out(self, conn: Connection, ex: Exchange, plan: plans.RequestPlan) -> None:
        kind = type(plan)
        if kind is plans.Send:
            await self.deliver(conn, ex)
        elif kind is plans.SendLater:
            conn.track(ex)
            ex.outcome = "delayed"
            (conn.nursery or self.nursery()).start_soon(self._deliver_later, conn, ex, plan.seconds)
        elif kind is plans.SendCopies:
            await self.deliver(conn, ex)
            ex.outcome = "duplicated"
            entry = Parked(ex, plan.release_on, conn, trio.Event())
            if plan.release_on is not None:
                self.pipeline.holds.park(entry)
            self.nursery().start_soon(self._copies_task, entry, plan)
        elif kind is plans.Withhold:
            conn.track(ex)  # never answered: later responses wait behind it, as on a stuck broker
            ex.outcome = "dropped"
            await self.trace_request(conn, ex)
        elif kind is plans.Answer:
            conn.track(ex)
            ex.outcome = "answered"
            await self._answer_with_error(conn, ex, plan.error_code)
        elif kind is plans.Close:
            if plan.when == "after":
                await self.deliver(conn, ex)
                if ex.expects_response:
                    # Cut when the broker's answer is in (on_response): the request
                    # has then surely been applied, and the answer surely lost.
                    return
                self._disconnect(conn, ex, plan.side, "after forwarding")
            else:
                ex.outcome = "dropped"
                await self.trace_request(conn, ex)
                self._disconnect(conn, ex, plan.side, "before forwarding")
        elif kind is plans.Park:
            conn.track(ex)
            ex.outcome = "held"
            entry = Parked(ex, plan.release_on, conn, trio.Event())
            self.pipeline.holds.park(entry)
            self.nursery().start_soon(self._park_task, entry, plan)
        else:  # pragma: no cover - the plan vocabulary is closed
            raise AssertionError(f"unknown plan {plan!r}")

    @staticmethod
    def _disconnect(conn: Connection, ex: Exchange, side: str, moment: str) -> None:
        rule = ex.decision.rule_id
        reason = f"fault rule {rule!r} disconnected the {side} side {moment}"
        if not conn.closed_on_purpose:
            conn.close_rule = rule  # the close event names the rule that cut the connection
        if side == "upstream":
            conn.drop_upstream(reason)
        else:
            conn.close("fault_disconnect", reason)

    async def deliver(self, conn: Connection, ex: Exchange, *, tracked: bool = False) -> None:
        """Send a request to the broker on the client's own connection (guard mode may refuse it)."""
        now = self.clock()
        hazard = self.pipeline.on_delivery(ex, now)
        if hazard is not None:
            await self._refused(conn, ex, tracked)
            return
        if not tracked:
            conn.track(ex)
        conn.expect_upstream_response(ex)
        ex.sent = now
        await self.trace_request(conn, ex)
        await conn.send_upstream(ex.request_frame)

    async def _refused(self, conn: Connection | None, ex: Exchange, tracked: bool) -> None:
        await self.trace_request(conn, ex)
        if conn is not None and not conn.closed.is_set() and ex.copy == 0:
            if not tracked:
                conn.track(ex)
            await self._answer_with_error(conn, ex, INVALID_TXN_STATE)

    async def _answer_with_error(self, conn: Connection, ex: Exchange, error_code: int) -> None:
        if not ex.expects_response:  # acks=0: a broker would not answer either
            await self.trace_request(conn, ex)
            return
        frame = error_answer(ex, error_code)
        if frame is None:
            log.warning("cannot answer %s v%d with an error: no decoder; forwarding", apis.api_name(ex.api_key), ex.api_version)
            ex.outcome = "delivered"
            conn.order.remove(ex)
            await self.deliver(conn, ex)
            return
        ex.response_frame = frame
        metrics.frames.labels(apis.api_name(ex.api_key), "response", "proxy").inc()
        await self.trace_request(conn, ex)
        if self.events is not None:
            await self.emit(self.events.response(conn, ex, len(frame) - 4, [error_code], None, self.clock()))
        await conn.flush_responses()

    async def _deliver_later(self, conn: Connection, ex: Exchange, seconds: float) -> None:
        metrics.pending_requests.labels("delayed").inc()
        try:
            await trio.sleep(seconds)
        finally:
            metrics.pending_requests.labels("delayed").dec()
        await self.deliver(conn, ex, tracked=True)

    # ------------------------------------------------------------------ parked requests, copies, ghosts

    async def _park_task(self, entry: Parked, plan: plans.Park) -> None:
        try:
            await self._park(entry, plan)
        except Exception:
            log.exception("held %s could not be delivered", apis.api_name(entry.ex.api_key))

    async def _park(self, entry: Parked, plan: plans.Park) -> None:
        metrics.pending_requests.labels("held").inc()
        try:
            if plan.timeout_s is None:
                await entry.token.wait()
            else:
                with trio.move_on_after(plan.timeout_s):
                    await entry.token.wait()
        finally:
            metrics.pending_requests.labels("held").dec()
            self.pipeline.holds.forget(entry)
        conn, ex = entry.conn, entry.ex
        if plan.ghost or conn.closed.is_set():
            await self.ghost_deliver(conn, ex, copy=0)
            return
        try:
            await self.deliver(conn, ex, tracked=True)
        except Exception as exc:  # the client's connection died meanwhile
            log.info("held request could not use the client connection (%s); delivering as ghost", exc)
            await self.ghost_deliver(conn, ex, copy=0)

    async def _copies_task(self, entry: Parked, plan: plans.SendCopies) -> None:
        try:
            await self._copies(entry, plan)
        except Exception:
            log.exception("duplicate of %s could not be delivered", apis.api_name(entry.ex.api_key))

    async def _copies(self, entry: Parked, plan: plans.SendCopies) -> None:
        if plan.release_on is not None:
            metrics.pending_requests.labels("held").inc()
            try:
                with trio.move_on_after(self.hold_timeout):
                    await entry.token.wait()
            finally:
                metrics.pending_requests.labels("held").dec()
                self.pipeline.holds.forget(entry)
        for copy in range(1, plan.copies + 1):
            await trio.sleep(plan.spacing_s)
            await self.ghost_deliver(entry.conn, entry.ex, copy=copy)

    async def ghost_deliver(self, conn: Connection, ex: Exchange, copy: int) -> None:
        """Deliver over the proxy's own connection; the answer is traced and dropped."""
        ghost = ex.copy_for_delivery(copy)
        if copy:  # a copy is a frame of the proxy's own; a held request (copy 0) was counted on arrival
            metrics.frames.labels(apis.api_name(ex.api_key), "request", "ghost").inc()
        now = self.clock()
        if self.pipeline.on_delivery(ghost, now) is not None:
            await self._refused(None, ghost, True)
            return
        ghost.sent = now
        ghost.outcome = "ghost"
        await self.trace_request(conn, ghost)
        link = self.ghost_link(conn.node_id)
        metrics.pending_requests.labels("ghost").inc()
        try:
            await link.send(self.nursery(), ghost.request_frame, (conn, ghost), ghost.expects_response)
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
        if self.events is None:
            return
        entries = [in_flight_entry(conn.conn_id, ghost, "awaiting_broker") for conn, ghost in tokens]
        await self.emit(self.events.close(-1, None, node_id, reason, None, entries))

    async def on_ghost_response(self, token: Any, frame: bytes) -> None:
        conn, ghost = token
        metrics.pending_requests.labels("ghost").dec()
        metrics.frames.labels(apis.api_name(ghost.api_key), "response", "ghost").inc()
        now = self.clock()
        decoded, codes = response_facts(ghost, frame)
        if decoded is not None:
            self.pipeline.numbering.on_answer(ghost, decoded, now)
            if ghost.api_key == apis.METADATA:
                self.pipeline.answers.learn_topic_names(decoded)
        if self.events is not None:
            await self.emit(self.events.response(conn, ghost, len(frame) - 4, codes, decoded, now))

    def connection_closed(self, conn: Connection) -> None:
        for entry in self.pipeline.holds.released_by_close(conn):
            entry.token.set()

    # ------------------------------------------------------------------ responses

    async def on_response(self, conn: Connection, ex: Exchange, frame: bytes, now: float) -> None:
        """The broker's answer to a request off the fast path (or one whose answer names brokers)."""
        pipeline = self.pipeline
        plan = pipeline.response_plan(ex, now)
        if plan.delay_s:
            await trio.sleep(plan.delay_s)
        answered = pipeline.on_answer(ex, frame, plan, now)
        for node_id in answered.new_brokers:
            # Before the answer goes out: the client may connect to a new broker at once.
            await self.ensure_listener(node_id)
        for entry in answered.released:
            entry.token.set()
        events = self.events
        if events is not None:
            if ex.header is not None:
                # What the client gets; when a rule changed it, what the broker sent as well.
                await self.emit(events.response(conn, ex, len(answered.frame) - 4, answered.codes, answered.decoded,
                                                now, upstream=answered.upstream))
            else:
                await self.emit(events.fast_response(conn, ex, answered.frame, now, codes=answered.codes))
        ex.response_frame = answered.frame
        if answered.close is not None and ex.header is not None:
            self._disconnect(conn, ex, answered.close, "instead of passing on the broker's answer")
        self.latency_histogram(ex.api_key).observe(now - ex.arrived)
        if ex.sent:
            metrics.upstream_latency.labels(apis.api_name(ex.api_key)).observe(now - ex.sent)
        timer = pipeline.timer
        if timer is not None and ex.sent:
            timer.observe(ex.api_key, "upstream", now - ex.sent)
            if ex.outcome in ("delayed", "held"):
                timer.observe(ex.api_key, "held", ex.sent - ex.arrived)
        if ex.header is not None and answered.codes:
            for code in answered.codes:
                self.count_error(ex.api_key, code)

    # ------------------------------------------------------------------ traces

    async def trace_request(self, conn: Connection | None, ex: Exchange) -> None:
        events = self.events
        if events is None:
            return
        timer = self.pipeline.timer
        if timer is None:
            await self.emit(events.request(conn, ex))
            return
        started = timer.now()
        await self.emit(events.request(conn, ex))
        timer.observe(ex.api_key, "trace", timer.now() - started)

    async def trace_close(self, conn: Connection, unsent: list[Exchange]) -> None:
        """The connection-close event: why it closed, and every request the client had no answer to.

        `unsent` are requests read from the client but never forwarded (the
        broker could not be reached). Every other one is in `conn.order`.
        """
        if self.events is None:
            return
        entries = [in_flight_entry(conn.conn_id, ex, "not_sent") for ex in unsent]
        for ex in conn.order:
            entries.append(in_flight_entry(conn.conn_id, ex, in_flight_state(ex, conn.in_flight)))
        rule = conn.close_rule if conn.close_reason == "fault_disconnect" else None
        await self.emit(self.events.close(conn.conn_id, conn.client_addr, conn.node_id, conn.close_reason, rule, entries))


def in_flight_state(ex: Exchange, in_flight: dict[int, Exchange]) -> str:
    """Where an unanswered request was when its connection closed (docs/traces.md, close events)."""
    if ex.response_frame is not None:
        return "response_dropped" if ex.suppress_response else "response_unsent"
    if in_flight.get(ex.correlation_id) is ex:
        return "awaiting_broker"
    if ex.outcome in ("delayed", "held", "dropped") and not ex.sent:
        return ex.outcome
    # Sent, and no longer awaited from the broker: its response was on its way to the client
    # (cut-through, or a response rule's delay) when the connection closed.
    return "responding" if ex.sent else "not_sent"
