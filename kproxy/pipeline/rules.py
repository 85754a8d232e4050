"""Stage: ask the fault rules about an exchange, and turn the answer into a plan.

The rules see an `ExchangeView` (the facts a rule may match on); the engine
answers with a decision, and the decision's action module says which plan
the data path carries out for it (kproxy.faults.actions: `request_plan`,
`response_plan`). Nothing here knows what any single action does.
"""

from __future__ import annotations

from typing import Any

from kproxy.faults import decisions as d
from kproxy.faults.actions import ACTIONS
from kproxy.faults.engine import FaultEngine
from kproxy.faults.view import ExchangeView
from kproxy.obs import metrics
from kproxy.pipeline.exchange import Exchange
from kproxy.pipeline.plans import SEND, RequestPlan, ResponsePlan
from kproxy.protocol import apis


def view_of(ex: Exchange, direction: str) -> ExchangeView:
    body = ex.request_body
    topics = None
    committed = None
    txn_id = ex.txn[0].transactional_id if ex.txn else getattr(body, "transactional_id", None)
    if body is not None:
        topics = topics_of(body)
        if ex.api_key == apis.END_TXN:
            committed = bool(body.committed)
    return ExchangeView(
        api_key=ex.api_key,
        api_version=ex.api_version,
        direction=direction,  # type: ignore[arg-type]
        client_id=ex.client_id,
        transactional_id=txn_id,
        topics=topics,
        committed=committed,
        txn_number=ex.txn_client,
    )


def request_plan(engine: FaultEngine, ex: Exchange, now: float) -> RequestPlan:
    """The plan for a request the rules may act on; records the decision on the exchange."""
    decision = engine.decide(view_of(ex, "request"), now)
    if not decision.rule_id:
        return SEND
    ex.decision = decision
    metrics.faults_applied.labels(decision.rule_id, decision.action).inc()
    plan = plan_for_request(decision)
    ex.then = plan.then
    return plan


def response_plan(engine: FaultEngine, ex: Exchange, now: float) -> ResponsePlan:
    """The plan for the broker's answer: a response rule's, else what the request's plan said."""
    if engine.wants(ex.api_key, "response"):
        decision = engine.decide(view_of(ex, "response"), now)
        if decision.rule_id:
            metrics.faults_applied.labels(decision.rule_id, decision.action).inc()
            ex.decision = decision
            ex.then = plan_for_response(decision)
    return ex.then


def plan_for_request(decision: Any) -> RequestPlan:
    if isinstance(decision, d.Forward):
        return SEND
    return ACTIONS[decision.action].request_plan(decision)


def plan_for_response(decision: Any) -> ResponsePlan:
    return ACTIONS[decision.action].response_plan(decision)


def topics_of(body: Any) -> tuple[tuple[str, tuple[int, ...]], ...] | None:
    """(topic, partitions) named by a decoded request, for topic/partition rules."""
    topics = getattr(body, "topics", None) or getattr(body, "topic_data", None)
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
