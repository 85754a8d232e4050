"""Stage: the broker's answer, as the client will get it.

Addresses rewritten (kproxy.pipeline.addresses), facts read (error codes,
what the tracker learns, topic names), parked requests the answer releases,
and the response plan carried out on the decoded answer: a rule's rewrite,
or the answer withheld. A rewrite that fails leaves the answer as the broker
sent it: a fault action must never cost the client its connection.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from kproxy.obs import metrics
from kproxy.pipeline.addresses import needs_rewrite, rewrite_response
from kproxy.pipeline.decode import response_facts
from kproxy.pipeline.exchange import Exchange
from kproxy.pipeline.holds import HoldBook, Parked
from kproxy.pipeline.plans import ResponsePlan, Side
from kproxy.protocol import apis
from kproxy.protocol.broker_addresses import AddressMap
from kproxy.protocol.codec import encode_response, error_codes

log = logging.getLogger("kproxy.pipeline")


@dataclass(slots=True)
class Answered:
    frame: bytes  # what the client gets (unless the exchange's response is suppressed)
    codes: list[int] | None  # its error codes; None: not read here (the trace reads them later)
    decoded: Any  # the decoded answer as the client gets it, None if not decoded
    upstream: Any = None  # the broker's own answer, when a rule changed it
    new_brokers: tuple[int, ...] = ()  # listeners to open before the answer goes out
    close: Side | None = None  # cut this side of the connection once it is handled
    released: list[Parked] = field(default_factory=list)


class Answers:
    def __init__(self, addresses: AddressMap, version_caps: dict[int, int], topic_names: dict[Any, str],
                 numbering: Any, holds: HoldBook) -> None:
        self.addresses = addresses
        self.version_caps = version_caps
        self.topic_names = topic_names
        self.numbering = numbering
        self.holds = holds
        self._failed_rules: set[str] = set()

    def answer(self, ex: Exchange, frame: bytes, plan: ResponsePlan, now: float) -> Answered:
        decoded = None
        new_brokers: tuple[int, ...] = ()
        if needs_rewrite(ex, frame, self.addresses):
            rewritten = rewrite_response(ex, frame, self.addresses, self.version_caps)
            frame, decoded, new_brokers = rewritten.frame, rewritten.decoded, rewritten.new_brokers
            if ex.api_key == apis.METADATA and ex.header is None:
                # Fetch v13+ names topics by id: the trace (any level) maps them back.
                self.learn_topic_names(decoded)
        if ex.header is None:
            # A fast-path exchange whose answer needed its addresses rewritten: nothing else applies.
            return Answered(frame, error_codes(decoded) if decoded is not None else None, decoded,
                            new_brokers=new_brokers)
        if decoded is None:
            decoded, codes = response_facts(ex, frame)
        else:
            codes = error_codes(decoded)
        if decoded is not None:
            self.numbering.on_answer(ex, decoded, now)
            if ex.api_key == apis.METADATA:
                self.learn_topic_names(decoded)
        released = self.holds.released_by_answer(ex) if ex.txn else []
        changed = None
        if plan.transform is not None and decoded is not None:
            changed = self._transform(ex, plan, decoded)
        if changed is not None:
            ex.outcome = "rewritten"
            return Answered(encode_response(changed, ex.correlation_id), error_codes(changed), changed,
                            upstream=decoded, new_brokers=new_brokers, close=plan.close, released=released)
        if plan.withhold:
            ex.suppress_response = True
            ex.outcome = "dropped"
        return Answered(frame, codes, decoded, new_brokers=new_brokers, close=plan.close, released=released)

    def _transform(self, ex: Exchange, plan: ResponsePlan, decoded: Any) -> Any:
        rule = ex.decision.rule_id if ex.decision is not None else ""
        action = ex.decision.action if ex.decision is not None else ""
        try:
            return plan.transform(decoded, self.topic_names)
        except Exception:  # noqa: BLE001 - a rule's rewrite must never cost the client its connection
            metrics.fault_failures.labels(rule, action).inc()
            if rule not in self._failed_rules:  # once per rule: it fails the same way on every match
                self._failed_rules.add(rule)
                log.exception(
                    "rule %r could not %s a %s v%d response; passing it on unchanged (logged once per rule)",
                    rule, action, apis.api_name(ex.api_key), ex.api_version,
                )
            return None

    def learn_topic_names(self, decoded: Any) -> None:
        for topic in getattr(decoded, "topics", ()):
            topic_id = getattr(topic, "topic_id", None)
            if topic_id is not None and topic.name:
                self.topic_names[topic_id] = topic.name
