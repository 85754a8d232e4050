"""Rule matching, counting, limits, schedules and the rule store, over a passed-in clock."""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.faults import FORWARD, ExchangeView, RuleFileError, engine_from_rules, load_rule_text
from kproxy.faults import decisions as d
from kproxy.faults.engine import FaultEngine
from kproxy.faults.limits import MAX_RULES

PRODUCE, FETCH, END_TXN, ADD_PARTITIONS = 0, 1, 26, 24


def rule(rule_id: str = "r", action: dict[str, Any] | None = None, limits: dict[str, Any] | None = None,
         **match: Any) -> dict[str, Any]:
    spec: dict[str, Any] = {"id": rule_id, "action": action or {"type": "drop"}, "match": match}
    if limits:
        spec["limits"] = limits
    return spec


def produce(**facts: Any) -> ExchangeView:
    return ExchangeView(api_key=PRODUCE, api_version=9, **facts)


def end_txn(committed: bool, txn_number: int, version: int = 3, **facts: Any) -> ExchangeView:
    return ExchangeView(api_key=END_TXN, api_version=version, committed=committed, txn_number=txn_number,
                       transactional_id=facts.pop("transactional_id", "tx-1"), **facts)


def applied(engine: FaultEngine, views: list[ExchangeView], now: float = 0.0) -> list[bool]:
    return [engine.decide(v, now) is not FORWARD for v in views]


# -- static match fields ------------------------------------------------------

@pytest.mark.parametrize("spelling", ["end_txn", "EndTxn", "ENDTXN", 26, ["produce", "end_txn"]])
def test_api_by_name_or_key(spelling: Any) -> None:
    engine = engine_from_rules([rule(api=spelling)])
    assert isinstance(engine.decide(end_txn(True, 1), 0), d.Drop)
    assert engine.decide(ExchangeView(FETCH, 12), 0) is FORWARD


def test_versions_single_range_open_and_list() -> None:
    engine = engine_from_rules([rule(api="end_txn", versions=["0-1", 3, "5+"])])
    hits = [v for v in range(8) if engine.decide(end_txn(True, 1, version=v), 0) is not FORWARD]
    assert hits == [0, 1, 3, 5, 6, 7]


def test_direction_defaults_to_request() -> None:
    engine = engine_from_rules([rule(api="fetch")])
    assert engine.decide(ExchangeView(FETCH, 12, direction="response"), 0) is FORWARD
    assert engine.decide(ExchangeView(FETCH, 12, direction="request"), 0) is not FORWARD
    response_rule = engine_from_rules([rule(api="fetch", direction="response", action={"type": "drop_response"})])
    assert isinstance(response_rule.decide(ExchangeView(FETCH, 12, direction="response"), 0), d.DropResponse)


def test_id_globs_need_the_fact() -> None:
    engine = engine_from_rules([rule(transactional_id="orders-*", client_id="app-?")])
    assert applied(engine, [
        produce(transactional_id="orders-7", client_id="app-1"),
        produce(transactional_id="orders-7", client_id="app-12"),
        produce(transactional_id="billing-1", client_id="app-1"),
        produce(transactional_id=None, client_id="app-1"),  # not decoded: cannot match
        produce(transactional_id="orders-7", client_id=None),
    ]) == [True, False, False, False, False]


def test_globs_are_case_sensitive() -> None:
    engine = engine_from_rules([rule(topic="Orders")])
    assert applied(engine, [produce(topics=(("orders", (0,)),)), produce(topics=(("Orders", (0,)),))]) == [False, True]


def test_topic_and_partition_must_hold_for_the_same_topic() -> None:
    engine = engine_from_rules([rule(topic="orders*", partition=[1, 2])])
    assert applied(engine, [
        produce(topics=(("orders", (0, 2)),)),
        produce(topics=(("orders", (0,)), ("audit", (1,)))),
        produce(topics=(("audit", (2,)), ("orders-eu", (1,)))),
        produce(topics=None),
    ]) == [True, False, True, False]


def test_committed_flag_and_txn_number() -> None:
    engine = engine_from_rules([rule(api="end_txn", committed=True, txn_number={"min": 2, "max": 3})])
    assert applied(engine, [
        end_txn(True, 1), end_txn(True, 2), end_txn(False, 2), end_txn(True, 3), end_txn(True, 4),
        ExchangeView(END_TXN, 3, committed=True, txn_number=None),
    ]) == [False, True, False, True, False, False]


def test_exact_txn_number_and_open_minimum() -> None:
    exact = engine_from_rules([rule(txn_number=2)])
    assert applied(exact, [produce(txn_number=n) for n in (1, 2, 3)]) == [False, True, False]
    open_ended = engine_from_rules([rule(txn_number={"min": 2})])
    assert applied(open_ended, [produce(txn_number=n) for n in (1, 2, 30)]) == [False, True, True]


# -- counting and limits --------------------------------------------------------

def test_nth_applies_once_to_the_nth_match() -> None:
    engine = engine_from_rules([rule(api="produce", nth=3)])
    views = [produce(), ExchangeView(FETCH, 12), produce(), produce(), produce()]
    assert applied(engine, views) == [False, False, False, True, False]


def test_every_and_after() -> None:
    engine = engine_from_rules([rule(every=2, after=3)])
    assert applied(engine, [produce() for _ in range(9)]) == [False, False, False, False, True, False, True, False, True]


def test_count_and_once() -> None:
    counted = engine_from_rules([rule(limits={"count": 2})])
    assert applied(counted, [produce() for _ in range(4)]) == [True, True, False, False]
    once = engine_from_rules([rule(limits={"once": True})])
    assert applied(once, [produce() for _ in range(3)]) == [True, False, False]


def test_counters_advance_only_for_static_matches() -> None:
    engine = engine_from_rules([rule(api="end_txn", committed=True, nth=2)])
    views = [end_txn(False, 1), end_txn(True, 1), end_txn(False, 2), end_txn(True, 2)]
    assert applied(engine, views) == [False, False, False, True]
    counters = engine.list_rules()[0]["counters"]
    assert counters == {"matched": 2, "applied": 1}


def test_duration_runs_from_the_first_decision_after_load() -> None:
    engine = engine_from_rules([rule(limits={"duration_s": 5})])
    assert engine.decide(produce(), 100.0) is not FORWARD
    assert engine.decide(produce(), 104.9) is not FORWARD
    assert engine.decide(produce(), 105.0) is FORWARD


def test_first_matching_rule_wins_and_later_rules_do_not_count_it() -> None:
    engine = engine_from_rules([
        rule("first", action={"type": "delay", "ms": 5}, limits={"count": 1}),
        rule("second", action={"type": "drop"}),
    ])
    first, second = engine.decide(produce(), 0), engine.decide(produce(), 0)
    assert (first.rule_id, second.rule_id) == ("first", "second")
    assert isinstance(second, d.Drop)
    counts = {r["id"]: r["counters"] for r in engine.list_rules()}
    assert counts == {"first": {"matched": 2, "applied": 1}, "second": {"matched": 1, "applied": 1}}


def test_probability_zero_and_one() -> None:
    never = engine_from_rules([rule(probability=0.0)])
    always = engine_from_rules([rule(probability=1.0)])
    assert not any(applied(never, [produce() for _ in range(50)]))
    assert all(applied(always, [produce() for _ in range(50)]))


# -- schedules ------------------------------------------------------------------

SCHEDULED = """
version: 1
rules:
  - id: a
    match: {api: produce}
    action: {type: delay, ms: 1}
  - id: b
    match: {api: produce}
    action: {type: drop}
  - id: background
    match: {api: fetch}
    action: {type: drop_response}
  - id: only-in-b
    match: {api: end_txn, phase: fault-b}
    action: {type: respond, error: INVALID_TXN_STATE}
    limits: {duration_s: 2}
schedule:
  repeat: REPEAT
  phases:
    - {name: fault-a, duration_s: 30, rules: [a]}
    - {name: healthy, duration_s: 30}
    - {name: fault-b, duration_s: 20, rules: [b]}
"""


def scheduled(repeat: bool) -> FaultEngine:
    return FaultEngine(load_rule_text(SCHEDULED.replace("REPEAT", str(repeat).lower()), "scheduled.yaml"))


def test_phases_follow_the_passed_in_clock() -> None:
    engine = scheduled(repeat=False)
    start = 1000.0
    expected = {0: "fault-a", 29.9: "fault-a", 30: "healthy", 59: "healthy", 60: "fault-b", 79.9: "fault-b", 80: None, 500: None}
    assert engine.active_phase(start) == "fault-a"  # the first time seen is time zero
    for offset, phase in expected.items():
        assert engine.active_phase(start + offset) == phase, offset


def test_rules_named_by_phases_act_only_in_them_and_others_always() -> None:
    engine = scheduled(repeat=True)
    kinds = {}
    for offset in (0, 35, 65, 85, 145):  # a, healthy, b, a again (repeat), b again
        kinds[offset] = type(engine.decide(produce(), 10.0 + offset)).__name__
    assert kinds == {0: "Delay", 35: "Forward", 65: "Drop", 85: "Delay", 145: "Drop"}
    # `background` is in no phase: active throughout.
    assert isinstance(engine.decide(ExchangeView(FETCH, 12), 10.0 + 35), d.DropResponse)


def test_match_phase_and_duration_window_from_phase_start() -> None:
    engine = scheduled(repeat=True)
    t0 = 0.0
    engine.active_phase(t0)
    assert engine.decide(end_txn(True, 1), t0 + 10) is FORWARD  # wrong phase
    assert isinstance(engine.decide(end_txn(True, 1), t0 + 61), d.Respond)  # 1 s into fault-b
    assert engine.decide(end_txn(True, 1), t0 + 63) is FORWARD  # 3 s in: window of 2 s closed
    assert isinstance(engine.decide(end_txn(True, 1), t0 + 80 + 61), d.Respond)  # next cycle's fault-b


# -- decisions --------------------------------------------------------------------

@pytest.mark.parametrize(("action", "expected"), [
    ({"type": "delay", "ms": 250}, d.Delay("r", 0.25)),
    ({"type": "duplicate", "copies": 2, "spacing_ms": 10, "hold_until": "client_retry"}, d.Duplicate("r", 2, 0.01, "client_retry")),
    ({"type": "drop"}, d.Drop("r")),
    ({"type": "respond", "error": "NOT_LEADER_OR_FOLLOWER"}, d.Respond("r", 6)),
    ({"type": "respond", "error": 48}, d.Respond("r", 48)),
    ({"type": "replace_error", "error": "invalid_txn_state"}, d.ReplaceError("r", 48)),
    ({"type": "drop_response"}, d.DropResponse("r")),
    ({"type": "disconnect"}, d.Disconnect("r", "client", "before")),
    ({"type": "disconnect", "side": "upstream", "when": "after"}, d.Disconnect("r", "upstream", "after")),
    ({"type": "hold", "until": "client_disconnect", "timeout_ms": 1500, "ghost": True}, d.Hold("r", "client_disconnect", 1.5, True)),
    ({"type": "hold", "until": "next_txn_records"}, d.Hold("r", "next_txn_records", None, False)),
    ({"type": "rewrite", "field": "produce_error_offset_zero", "error": "REQUEST_TIMED_OUT"},
     d.Rewrite("r", "produce_error_offset_zero", 7, 1)),
    ({"type": "rewrite", "field": "fetch_stale_last_stable_offset", "lag": 100}, d.Rewrite("r", "fetch_stale_last_stable_offset", None, 100)),
])
def test_each_action_builds_its_decision(action: dict[str, Any], expected: d.Decision) -> None:
    # A rewrite field fits one API only (fetch_... or produce_...), and its rule must say so.
    api = "fetch" if action.get("field", "").startswith("fetch_") else "produce"
    view = ExchangeView(api_key=FETCH, api_version=12) if api == "fetch" else produce()
    decision = engine_from_rules([rule(action=action, api=api)]).decide(view, 0)
    assert decision == expected
    assert decision.action == action["type"]


def test_delay_jitter_stays_within_bounds() -> None:
    engine = engine_from_rules([rule(action={"type": "delay", "ms": 100, "jitter_ms": 20})], seed=9)
    delays = [engine.decide(produce(), 0).seconds for _ in range(200)]
    assert all(0.08 <= s <= 0.12 for s in delays)
    assert max(delays) - min(delays) > 0.03  # actually jittered


# -- what the proxy asks before decoding --------------------------------------------

def test_needs_body_and_wants_tables() -> None:
    engine = engine_from_rules([
        rule("header-only", api="produce", client_id="app-*"),
        rule("body", api="end_txn", committed=True),
        rule("response", api="fetch", direction="response", topic="t", action={"type": "drop_response"}),
    ])
    assert engine.wants(PRODUCE, "request") and not engine.needs_body(PRODUCE, "request")
    assert engine.wants(END_TXN, "request") and engine.needs_body(END_TXN, "request")
    assert engine.wants(FETCH, "response") and engine.needs_body(FETCH, "response")
    assert not engine.wants(FETCH, "request") and not engine.needs_body(FETCH, "request")
    assert not engine.wants(ADD_PARTITIONS, "request")
    engine.set_enabled("body", False)  # tables follow the store
    assert not engine.wants(END_TXN, "request") and not engine.needs_body(END_TXN, "request")


def test_rules_without_api_cover_every_api_even_unknown_keys() -> None:
    engine = engine_from_rules([rule(txn_number=1)])
    assert engine.wants(PRODUCE, "request") and engine.needs_body(9999, "request")
    assert engine.decide(ExchangeView(9999, 0, txn_number=1), 0) is not FORWARD


# -- the rule store -----------------------------------------------------------------

def test_put_adds_replaces_in_place_and_validates() -> None:
    engine = engine_from_rules([rule("a"), rule("b")])
    engine.put_rule(rule("c", action={"type": "delay", "ms": 1}))
    engine.put_rule(rule("a", action={"type": "drop_response"}))
    assert [r["id"] for r in engine.list_rules()] == ["a", "b", "c"]
    assert engine.list_rules()[0]["action"] == {"type": "drop_response"}
    with pytest.raises(RuleFileError, match=r"rule 'x': action.ms: Input should be a valid number"):
        engine.put_rule(rule("x", action={"type": "delay", "ms": "soon"}))
    with pytest.raises(RuleFileError, match="has no schedule"):
        engine.put_rule(rule("y", phase="p"))
    assert [r["id"] for r in engine.list_rules()] == ["a", "b", "c"]


def test_a_checked_rule_is_refused_if_its_phase_went_away_before_it_was_installed() -> None:
    # The admin API checks a rule on a worker thread; a reload may replace the schedule meanwhile.
    engine = engine_from_rules([], schedule={"phases": [{"name": "p", "duration_s": 10}]})
    checked = engine.check_rule(rule("y", phase="p"))
    engine.replace(load_rule_text("version: 1\n", "reloaded.yaml"))
    with pytest.raises(RuleFileError, match="rule 'y': match.phase: phase 'p' given but the file has no schedule"):
        engine.install_rule(checked)
    assert engine.list_rules() == []


def test_the_rule_store_holds_at_most_max_rules() -> None:
    engine = engine_from_rules([rule(f"r{i}") for i in range(MAX_RULES)])
    engine.put_rule(rule("r0", action={"type": "drop_response"}))  # replacing one is fine
    with pytest.raises(RuleFileError, match=f"already holds {MAX_RULES} rules"):
        engine.put_rule(rule("one-more"))
    assert len(engine.list_rules()) == MAX_RULES


def test_listed_rules_round_trip_through_put() -> None:
    engine = engine_from_rules([rule("a", api="end_txn", committed=True, txn_number={"min": 2},
                                     action={"type": "respond", "error": "PRODUCER_FENCED"})])
    listed = engine.list_rules()[0]
    listed.pop("counters")
    other = engine_from_rules([])
    other.put_rule(listed)
    assert other.list_rules()[0] == engine.list_rules()[0]


def test_enable_disable_delete_reset_and_unknown_ids() -> None:
    engine = engine_from_rules([rule("a", limits={"once": True})])
    assert engine.decide(produce(), 0) is not FORWARD
    engine.set_enabled("a", False)
    assert engine.decide(produce(), 0) is FORWARD and engine.list_rules()[0]["enabled"] is False
    engine.set_enabled("a", True)
    assert engine.decide(produce(), 0) is FORWARD  # once: still used up
    engine.reset_counters()
    assert engine.decide(produce(), 0) is not FORWARD
    engine.delete_rule("a")
    assert engine.list_rules() == [] and not engine.wants(PRODUCE, "request")
    for operation in (lambda: engine.set_enabled("zz", True), lambda: engine.delete_rule("zz"), lambda: engine.get_rule("zz")):
        with pytest.raises(KeyError):
            operation()


def test_hot_reload_keeps_counters_of_unchanged_rules_only() -> None:
    engine = engine_from_rules([rule("same", api="produce", limits={"count": 2}), rule("edited", api="fetch")])
    engine.decide(produce(), 0)
    engine.decide(ExchangeView(FETCH, 12), 0)
    new_file = load_rule_text("""
version: 1
rules:
  - {id: same, match: {api: produce}, action: {type: drop}, limits: {count: 2}}
  - {id: edited, match: {api: fetch}, action: {type: delay, ms: 3}}
  - {id: fresh, match: {api: end_txn}, action: {type: drop}}
""", "reloaded.yaml")
    engine.replace(new_file)
    counters = {r["id"]: r["counters"]["applied"] for r in engine.list_rules()}
    assert counters == {"same": 1, "edited": 0, "fresh": 0}
    assert applied(engine, [produce(), produce()]) == [True, False]  # count 2 spans the reload


def test_reload_after_disabling_keeps_the_rules_counters() -> None:
    text = "version: 1\nrules:\n  - {id: a, action: {type: drop}, limits: {once: true}}\n"
    engine = FaultEngine(load_rule_text(text, "a.yaml"))
    assert engine.decide(produce(), 0) is not FORWARD
    engine.set_enabled("a", False)
    engine.replace(load_rule_text(text, "a.yaml"))  # the file says enabled: the rule is on again...
    assert engine.list_rules()[0]["enabled"] is True
    assert engine.decide(produce(), 0) is FORWARD  # ...but `once` is not re-armed


def test_sasl_apis_only_when_named() -> None:
    """A rule without `api` never meets authentication; naming SaslAuthenticate does (docs/security.md)."""
    sasl_handshake, sasl_authenticate = 17, 36
    catch_all = engine_from_rules([rule(client_id="*")])
    for key in (sasl_handshake, sasl_authenticate):
        assert not catch_all.wants(key, "request")
        assert catch_all.decide(ExchangeView(key, 1, client_id="c"), 0) is FORWARD
    assert isinstance(catch_all.decide(ExchangeView(PRODUCE, 9, client_id="c"), 0), d.Drop)
    named = engine_from_rules([rule(api=["SaslAuthenticate"])])
    assert named.wants(sasl_authenticate, "request") and not named.wants(sasl_handshake, "request")
    assert isinstance(named.decide(ExchangeView(sasl_authenticate, 2, client_id="c"), 0), d.Drop)


# -- globs ------------------------------------------------------------------------

def test_globs_are_compiled_when_rules_load_and_matching_never_compiles(monkeypatch: pytest.MonkeyPatch) -> None:
    # More distinct globs than any shared cache held: matching used to compile each on
    # the event loop at first use, and again whenever the cache had evicted it.
    from types import SimpleNamespace

    from kproxy.faults import globs

    rules = [rule(f"r{i}", client_id=f"client-{i}-*", transactional_id=f"tx-[a-c]{i}?", topic=f"*orders-{i}")
             for i in range(MAX_RULES)]
    engine = engine_from_rules(rules)

    def no_compiling(*args: Any, **kwargs: Any) -> Any:
        raise AssertionError("a glob was compiled while matching")

    monkeypatch.setattr(globs, "re", SimpleNamespace(compile=no_compiling))
    for i in (MAX_RULES - 1, 0, 500):
        view = produce(client_id=f"client-{i}-7", transactional_id=f"tx-b{i}x", topics=((f"eu-orders-{i}", (0,)),))
        assert engine.decide(view, 0).rule_id == f"r{i}"
    assert engine.decide(produce(client_id="nobody", transactional_id="tx-b1x", topics=(("orders-1", (0,)),)), 0) is FORWARD


@pytest.mark.parametrize(("pattern", "value", "expected"), [
    ("orders", "orders", True), ("orders", "orders2", False), ("*", "", True), ("*", "x", True),
    ("a*b*c", "abc", True), ("a*b*c", "aXbYc", True), ("a*b*c", "acb", False), ("*ab*ab", "abab", True),
    ("*ab*ab", "ab", False), ("a**", "a", True), ("t-?", "t-1", True), ("t-[!0-9]", "t-1", False),
    ("Orders", "orders", False),  # case-sensitive, as Kafka names are
])
def test_globs_match_as_fnmatchcase_does(pattern: str, value: str, expected: bool) -> None:
    import fnmatch

    from kproxy.faults.globs import compile_glob

    assert compile_glob(pattern)(value) is expected is fnmatch.fnmatchcase(value, pattern)
