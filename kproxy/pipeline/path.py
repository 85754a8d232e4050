"""The stages in order: the one way a frame goes through the proxy (see the package's docstring)."""

from __future__ import annotations

from typing import Any

from kproxy.faults.engine import FaultEngine
from kproxy.pipeline.answers import Answered, Answers
from kproxy.pipeline.decode import Undecodable, produce_facts, request_body
from kproxy.pipeline.exchange import Exchange
from kproxy.pipeline.holds import HoldBook, Parked
from kproxy.pipeline.numbering import Numbering
from kproxy.pipeline.plans import SEND, RequestPlan, ResponsePlan
from kproxy.pipeline.routing import Routing
from kproxy.pipeline.rules import request_plan, response_plan
from kproxy.pipeline.timing import StageTimer
from kproxy.protocol import apis
from kproxy.protocol.broker_addresses import AddressMap
from kproxy.txn.events import Hazard
from kproxy.txn.tracker import TxnTracker

__all__ = ["Answered", "Exchange", "Parked", "Pipeline", "Undecodable"]


class Pipeline:
    def __init__(
        self, engine: FaultEngine, tracker: TxnTracker, addresses: AddressMap, version_caps: dict[int, int],
        topic_names: dict[Any, str], *, guard: bool, timer: StageTimer | None = None,
    ) -> None:
        self.engine = engine
        self.guard = guard
        self.timer = timer
        self.routing = Routing(engine)
        self.numbering = Numbering(tracker)
        self.holds = HoldBook()
        self.answers = Answers(addresses, version_caps, topic_names, self.numbering, self.holds)

    def rules_changed(self) -> None:
        self.routing.refresh(self.engine)

    def on_request(self, ex: Exchange, now: float) -> RequestPlan:
        """A request off the fast path: decode what needs decoding, number it, ask the rules."""
        engine = self.engine
        api_key = ex.api_key
        timer = self.timer
        started = timer.now() if timer is not None else 0.0
        txn_id = produce_facts(ex, ex.request_frame, 4, ex.header) if api_key == apis.PRODUCE else None
        wants = engine.wants(api_key, "request")
        body = None
        if api_key in apis.TRANSACTIONAL_APIS or txn_id is not None or (wants and engine.needs_body(api_key, "request")):
            body = request_body(ex)
        if timer is not None:
            decoded_at = timer.now()
            timer.observe(api_key, "decode", decoded_at - started)
            started = decoded_at
        if body is not None:
            self.numbering.on_arrival(ex, body)
        if timer is not None:
            numbered_at = timer.now()
            timer.observe(api_key, "numbering", numbered_at - started)
            started = numbered_at
        plan = request_plan(engine, ex, now) if wants else SEND
        if timer is not None:
            timer.observe(api_key, "rules", timer.now() - started)
        return plan

    def released_by_arrival(self, ex: Exchange) -> list[Parked]:
        return self.holds.released_by_arrival(ex)

    def on_delivery(self, ex: Exchange, now: float) -> Hazard | None:
        """Number a delivery on the broker side; in guard mode, the hazard that refuses it (nothing is numbered then)."""
        if self.guard and ex.txn:
            hazard = self.numbering.refusal(ex)
            if hazard is not None:
                self.numbering.refused(ex, hazard)
                return hazard
        self.numbering.on_delivery(ex, now)
        return None

    def response_plan(self, ex: Exchange, now: float) -> ResponsePlan:
        return response_plan(self.engine, ex, now)

    def on_answer(self, ex: Exchange, frame: bytes, plan: ResponsePlan, now: float) -> Answered:
        timer = self.timer
        if timer is None:
            return self.answers.answer(ex, frame, plan, now)
        started = timer.now()
        answered = self.answers.answer(ex, frame, plan, now)
        timer.observe(ex.api_key, "rewrite", timer.now() - started)
        return answered
