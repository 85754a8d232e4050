"""The data path's stages and plans, on literal frames: no socket, no trio, no broker.

Every exchange here is built from frames encoded with the Kafka schemas
(kio), passed through kproxy.pipeline, and judged by the plan and the facts
that come out.
"""

from __future__ import annotations

import typing
from datetime import timedelta
from typing import Any

import pytest
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.schema.types import BrokerId
from kio.static.primitive import i32, i32Timedelta

from kproxy.faults import decisions as d
from kproxy.faults.actions import ACTIONS
from kproxy.faults.engine import FaultEngine, engine_from_rules
from kproxy.faults.model import RuleFile
from kproxy.obs import metrics
from kproxy.obs.trace_events import CELLS, close_row, exchange_row
from kproxy.obs.trace_schema import FIELD_NAMES
from kproxy.pipeline import plans
from kproxy.pipeline.decode import Undecodable
from kproxy.pipeline.exchange import Exchange
from kproxy.pipeline.holds import Parked
from kproxy.pipeline.path import Pipeline
from kproxy.pipeline.rules import plan_for_request, plan_for_response
from kproxy.protocol import apis
from kproxy.protocol.broker_addresses import AddressMap
from kproxy.protocol.codec import decode_response, encode_request, encode_response, parse_request_header
from kproxy.txn.tracker import TxnTracker

TXN = "tx-1"
PID, EPOCH = 4000, 0


def request(api_key: int, version: int, correlation_id: int = 1, client_id: str = "c", **body: Any) -> Exchange:
    """An exchange as the request pump hands it to the stages: header parsed, frame kept."""
    frame = encode_request(load_request_schema(api_key, version)(**body), correlation_id, client_id)
    header = parse_request_header(frame, 4)
    ex = Exchange(api_key, version, correlation_id, client_id, 0.0)
    ex.header = header
    ex.request_frame = frame
    return ex


def end_txn(committed: bool = True, correlation_id: int = 1) -> Exchange:
    return request(apis.END_TXN, 3, correlation_id, transactional_id=TXN, producer_id=PID, producer_epoch=EPOCH,
                   committed=committed)


def add_offsets(correlation_id: int = 1) -> Exchange:
    return request(apis.ADD_OFFSETS_TO_TXN, 3, correlation_id, transactional_id=TXN, producer_id=PID,
                   producer_epoch=EPOCH, group_id="g")


def pipeline(rules: list[dict] | None = None, *, guard: bool = False, addresses: AddressMap | None = None) -> Pipeline:
    engine = engine_from_rules(rules) if rules else FaultEngine(RuleFile(version=1))
    return Pipeline(engine, TxnTracker(), addresses or AddressMap("127.0.0.1", 19100), {}, {}, guard=guard)


# ------------------------------------------------------------------ plans: one per action, from its own module

DECISIONS = [
    (d.Delay("r", 0.5), plans.SendLater(0.5)),
    (d.Drop("r"), plans.Withhold()),
    (d.Respond("r", 48), plans.Answer(48)),
    (d.Duplicate("r", 2, 0.01, "next_txn_records"), plans.SendCopies(2, 0.01, "next_txn_records")),
    (d.Hold("r", "client_retry", 1.0, True), plans.Park("client_retry", 1.0, True)),
    (d.Disconnect("r", "upstream", "before"),
     plans.Close("upstream", "before", then=plans.ResponsePlan(withhold=True, close="upstream"))),
    (d.DropResponse("r"), plans.Send(then=plans.ResponsePlan(withhold=True))),
    (d.Forward(""), plans.SEND),
]


@pytest.mark.parametrize(("decision", "plan"), DECISIONS, ids=lambda v: getattr(v, "action", ""))
def test_each_action_says_which_plan_its_decision_produces(decision, plan):
    assert plan_for_request(decision) == plan


def test_every_registered_action_has_a_plan_for_each_direction_it_may_match():
    for spec in ACTIONS.values():
        assert ("request" in spec.directions) == (spec.request_plan is not None), spec.name
        assert ("response" in spec.directions) == (spec.response_plan is not None), spec.name


def test_response_side_plans():
    assert plan_for_response(d.Delay("r", 0.2)) == plans.ResponsePlan(delay_s=0.2)
    assert plan_for_response(d.Disconnect("r", "client", "after")) == plans.ResponsePlan(withhold=True, close="client")
    replaced = plan_for_response(d.ReplaceError("r", 7))
    assert replaced.transform is not None and not replaced.withhold


# ------------------------------------------------------------------ requests: decode, numbering, rules

def test_a_transactional_request_is_numbered_on_arrival_and_its_plan_is_send_without_rules():
    path = pipeline()
    first = add_offsets()
    assert path.on_request(first, 0.0) == plans.SEND
    assert first.txn_client == 1 and first.txn[0].transactional_id == TXN
    commit = end_txn()
    assert path.on_request(commit, 0.0) == plans.SEND
    assert commit.txn_client == 1  # an EndTxn ends the transaction it belongs to
    nxt = add_offsets(correlation_id=3)
    path.on_request(nxt, 0.0)
    assert nxt.txn_client == 2


RULED = [
    ({"type": "delay", "ms": 250}, plans.SendLater(0.25)),
    ({"type": "drop"}, plans.Withhold()),
    ({"type": "respond", "error": "INVALID_TXN_STATE"}, plans.Answer(48)),
    ({"type": "hold", "until": "next_txn_records", "ghost": True}, plans.Park("next_txn_records", None, True)),
    ({"type": "duplicate", "copies": 1, "hold_until": "next_txn_records"},
     plans.SendCopies(1, 0.0, "next_txn_records")),
]


@pytest.mark.parametrize(("action", "plan"), RULED, ids=lambda v: v.get("type", "") if isinstance(v, dict) else "")
def test_a_rule_on_end_txn_turns_into_its_plan_and_the_exchange_names_the_rule(action, plan):
    path = pipeline([{"id": "r1", "match": {"api": "end_txn", "committed": True}, "action": action}])
    ex = end_txn(committed=True)
    assert path.on_request(ex, 0.0) == plan
    assert ex.decision.rule_id == "r1" and ex.decision.action == action["type"]
    # The rule matched on the body's facts: an abort is left alone.
    other = end_txn(committed=False, correlation_id=2)
    assert path.on_request(other, 0.0) == plans.SEND and other.decision is None


def test_a_request_the_stages_must_read_and_cannot_is_undecodable():
    ex = end_txn()
    ex.request_frame = ex.request_frame[:-3]  # the body cut short
    with pytest.raises(Undecodable, match="undecodable end_txn v3 request"):
        pipeline().on_request(ex, 0.0)


def test_a_stale_end_txn_is_a_hazard_on_delivery_and_guard_mode_refuses_it():
    for guard in (False, True):
        path = pipeline(guard=guard)
        first = add_offsets()
        path.on_request(first, 0.0)
        assert path.on_delivery(first, 0.0) is None
        commit = end_txn(correlation_id=2)
        path.on_request(commit, 0.0)  # held back by some rule: not delivered yet
        retry = end_txn(correlation_id=3)  # the client's retry is delivered and answered
        path.on_request(retry, 0.0)
        assert path.on_delivery(retry, 0.0) is None
        second = add_offsets(correlation_id=4)  # the producer's next transaction
        path.on_request(second, 0.0)
        assert path.on_delivery(second, 0.0) is None
        refusal = path.on_delivery(commit, 0.0)  # the held EndTxn, delivered late
        if guard:
            assert refusal is not None and refusal.kind == "stale_end_txn"
            assert commit.outcome == "refused" and commit.txn_broker is None
        else:
            assert refusal is None
            assert commit.hazard.kind == "stale_end_txn"
            assert (commit.txn_client, commit.txn_broker) == (1, 2)


# ------------------------------------------------------------------ answers: addresses, rewrites, holds

def metadata_answer(version: int = 12, correlation_id: int = 1) -> bytes:
    schema = load_response_schema(apis.METADATA, version)
    broker = typing.get_type_hints(schema)["brokers"].__args__[0]
    brokers = (broker(node_id=BrokerId(7), host="broker-7.internal", port=i32(9092), rack=None),)
    body = schema(throttle_time=i32Timedelta.parse(timedelta(0)), brokers=brokers, cluster_id="c",
                  controller_id=BrokerId(7), topics=())
    return encode_response(body, correlation_id)


def end_txn_answer() -> bytes:
    schema = load_response_schema(apis.END_TXN, 3)
    return encode_response(schema(throttle_time=i32Timedelta.parse(timedelta(0)), error_code=ErrorCode.none), 1)


def test_an_answer_naming_a_broker_is_rewritten_to_its_listener_and_the_broker_is_new():
    addresses = AddressMap("127.0.0.1", 19100)
    path = pipeline(addresses=addresses)
    ex = request(apis.METADATA, 12, topics=(), allow_auto_topic_creation=False, include_topic_authorized_operations=False)
    answered = path.on_answer(ex, metadata_answer(), plans.PASS, 0.0)
    assert answered.new_brokers == (7,)
    client_sees = decode_response(apis.METADATA, 12, answered.frame[4:])
    assert [(b.node_id, b.host, b.port) for b in client_sees.brokers] == [(7, "127.0.0.1", 19107)]


def test_a_rewrite_that_fails_passes_the_answer_on_unchanged_and_counts_the_failure():
    path = pipeline()
    ex = end_txn()
    path.on_request(ex, 0.0)
    ex.decision = d.Rewrite("bad-rule", "fetch_drop_records", None, 1)  # a Fetch rewrite on an EndTxn answer

    def broken(response: Any, names: Any) -> Any:
        raise AttributeError("EndTxnResponse has no responses")

    frame = end_txn_answer()
    before = metrics.fault_failures.labels("bad-rule", "rewrite")._value.get()
    answered = path.on_answer(ex, frame, plans.ResponsePlan(transform=broken), 0.0)
    assert answered.frame == frame and ex.outcome == "delivered"
    assert metrics.fault_failures.labels("bad-rule", "rewrite")._value.get() == before + 1


def test_a_replace_error_rule_rewrites_the_answer_and_keeps_the_brokers_own():
    path = pipeline([{"id": "r", "match": {"api": "end_txn"}, "action": {"type": "replace_error", "error": 7}}])
    ex = end_txn()
    plan = path.on_request(ex, 0.0)
    frame = end_txn_answer()
    answered = path.on_answer(ex, frame, path.response_plan(ex, 0.0), 0.0)
    assert plan.then.transform is not None
    assert answered.codes == [7] and answered.upstream.error_code == 0 and ex.outcome == "rewritten"


def test_a_withheld_answer_is_suppressed_and_a_close_side_comes_with_it():
    path = pipeline([{"id": "cut", "match": {"api": "end_txn"},
                      "action": {"type": "disconnect", "side": "client", "when": "after"}}])
    ex = end_txn()
    assert path.on_request(ex, 0.0) == plans.Close("client", "after", then=plans.ResponsePlan(withhold=True, close="client"))
    frame = end_txn_answer()
    answered = path.on_answer(ex, frame, path.response_plan(ex, 0.0), 0.0)
    assert ex.suppress_response and answered.close == "client" and ex.outcome == "dropped"


def test_holds_are_released_by_a_retry_by_the_next_transactions_records_and_by_a_hang_up():
    path = pipeline()
    conn = object()
    held = end_txn()
    path.on_request(held, 0.0)
    retry_entry = Parked(held, "client_retry", conn)
    close_entry = Parked(held, "client_disconnect", conn)
    path.holds.park(retry_entry)
    path.holds.park(close_entry)
    assert path.released_by_arrival(held) == []  # its own arrival releases nothing
    retry = end_txn(correlation_id=2)
    path.on_request(retry, 0.0)
    assert path.released_by_arrival(retry) == [retry_entry]
    assert path.holds.released_by_close(object()) == []
    assert path.holds.released_by_close(conn) == [close_entry]
    assert path.holds.entries == []


# ------------------------------------------------------------------ trace rows, from the schema's one list

def test_every_cell_names_a_field_of_the_schema_and_rows_follow_its_order():
    assert set(CELLS) <= set(FIELD_NAMES)
    path = pipeline()
    path.on_request(add_offsets(), 0.0)
    ex = end_txn(correlation_id=2)
    path.on_request(ex, 0.0)

    class Conn:
        conn_id, client_addr, node_id = 9, "127.0.0.1:5", 1

    row = dict(zip(FIELD_NAMES, exchange_row(Conn, ex, "request", 40, 1.5, 77, "p1")))
    assert len(row) == len(FIELD_NAMES)
    assert row["schema_version"] is None  # the writer's
    assert (row["conn_id"], row["api"], row["transactional_id"], row["txn_client"], row["end_txn_commit"]) == (
        9, "end_txn", TXN, 1, True)
    assert row["error_code"] is None and row["error_codes"] is None  # a request has none
    answer = dict(zip(FIELD_NAMES, exchange_row(Conn, ex, "response", 8, 1.5, 78, "p1", latency=1.0, codes=[])))
    assert answer["error_code"] == 0 and answer["error_codes"] == []
    close = dict(zip(FIELD_NAMES, close_row(9, "127.0.0.1:5", 1, "fault_disconnect", "cut", [], 1.5, 79, "p1")))
    assert (close["direction"], close["rule"], close["action"], close["api"]) == ("close", "cut", "disconnect", None)
