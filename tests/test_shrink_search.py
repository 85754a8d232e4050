"""The shrinking search with a verdict given by a rule of the test, not by runs."""

from __future__ import annotations

import pytest

from kproxy.shrink.search import (
    Candidate, Floors, Stop, Verdict, Workload, anomaly_appears, attributed_rules, ddmin, shrink, shrink_number,
)

TORN = {
    "id": "stale-commit",
    "match": {"api": "end_txn", "committed": True, "txn_number": {"min": 1, "max": 10}},
    "action": {"type": "duplicate", "copies": 3, "hold_until": "next_txn_records"},
}
LATENCY = {"id": "latency", "match": {"probability": 0.33}, "action": {"type": "delay", "ms": 20, "jitter_ms": 10}}
FETCH = {"id": "fetch-cut", "match": {"api": "fetch", "direction": "response"},
         "action": {"type": "rewrite", "field": "fetch_skip_batch"}}
SLOW = {"id": "slow-commits", "match": {"api": "end_txn"}, "action": {"type": "delay", "ms": 1500}}
START = Candidate(
    rules={"version": 1, "seed": 17754, "rules": [LATENCY, TORN, FETCH]},
    workload=Workload(processes=3, duration=20.0, max_txn_length=8, keys=4),
)


def torn_appears(candidate: Candidate) -> bool:
    """The fake system: a torn transaction needs the stale-commit rule
    matching commits, two processes, 5 s and transactions of 3 ops."""
    rules = {r["id"]: r for r in candidate.rules["rules"]}
    rule = rules.get("stale-commit")
    w = candidate.workload
    return (rule is not None and rule["match"].get("committed") is True
            and w.processes >= 2 and w.duration >= 5 and w.max_txn_length >= 3)


def judge_with(predicate):
    calls = []

    def judge(candidate, axis, change):
        calls.append((axis, change))
        judge.ran.append(candidate.key())
        return Verdict(reproduced=predicate(candidate), runs=1, hits=int(predicate(candidate)))

    judge.ran = []  # every candidate run, as its key: a change's words may recur with other rules
    return judge, calls


def test_ddmin_finds_the_one_item_that_matters():
    tested = []

    def test(items):
        tested.append(items)
        return "b" in items

    assert ddmin(list("abcdefgh"), test) == ["b"]
    assert len(tested) <= 8


def test_ddmin_keeps_a_pair_that_only_works_together():
    assert ddmin(list("abcdef"), lambda items: "b" in items and "e" in items) == ["b", "e"]


def test_ddmin_may_keep_nothing_when_allowed():
    assert ddmin(["x", "y"], lambda items: True, allow_empty=True) == []
    assert ddmin(["x", "y"], lambda items: True) in (["x"], ["y"])


@pytest.mark.parametrize("needed", [0, 1, 7, 50, 100])
def test_shrink_number_finds_the_threshold_of_a_monotone_test(needed):
    found = shrink_number(100, 0, lambda v: v >= needed, integer=True, max_tries=10)
    assert found == needed


def test_shrink_number_stays_within_its_tries():
    tried = []
    found = shrink_number(1500.0, 0, lambda v: tried.append(v) or v >= 333, integer=False, max_tries=4)
    assert len(tried) == 4 and found >= 333
    assert tried[0] == 0  # the smallest value first


def test_the_torn_rule_alone_survives_with_a_smaller_workload():
    judge, calls = judge_with(torn_appears)
    result = shrink(START, judge, floors=Floors(duration=2))
    best = result.best
    assert best.rule_ids == ["stale-commit"]
    rule = best.rules["rules"][0]
    # The conditions that did not matter are gone, the ones that aim the fault stay.
    assert rule["match"] == {"api": "end_txn", "committed": True}
    assert rule["action"]["copies"] == 1
    # Integers reach their threshold; the duration's search stops within its four tries.
    assert (best.workload.processes, best.workload.max_txn_length, best.workload.keys) == (2, 3, 1)
    assert 5 <= best.workload.duration <= 6
    assert result.stopped is None
    assert [s.change for s in result.kept][:2] == ["drop rule fetch-cut", "drop rule latency"]
    # Each change is told from the best candidate at the time it was tried.
    assert [s.change for s in result.steps if s.change.startswith("max transaction length")] == [
        "max transaction length 8 -> 1", "max transaction length 8 -> 4", "max transaction length 4 -> 2",
        "max transaction length 4 -> 3"]
    # Every run the callback made is a step, and no candidate ran twice.
    assert len([s for s in result.steps if s.outcome in ("kept", "rejected")]) == len(calls)
    assert len(set(judge.ran)) == len(judge.ran)


def test_a_fault_that_shows_in_the_shortest_run_is_shrunk_with_short_runs():
    # The torn transaction here needs only its rule: the run-time moves come first, straight to the
    # floors, and every rule move after them is run with the short workload.
    judge, calls = judge_with(lambda c: any(r["id"] == "stale-commit" for r in c.rules["rules"]))
    result = shrink(START, judge, floors=Floors(duration=2))
    assert [s.change for s in result.steps[:2]] == ["duration (s) 20 -> 2", "processes 3 -> 1"]
    assert all(s.outcome == "kept" for s in result.steps[:2])
    rule_moves = [s for s in result.steps if s.axis != "workload"]
    assert rule_moves and len(calls) == len([s for s in result.steps if s.outcome in ("kept", "rejected")])
    assert (result.best.workload.duration, result.best.workload.processes) == (2, 1)


def test_a_floor_the_fault_needs_more_than_is_tried_once_and_searched_later():
    judge, _ = judge_with(torn_appears)
    result = shrink(START, judge, floors=Floors(duration=2))
    assert [(s.change, s.outcome) for s in result.steps[:2]] == [
        ("duration (s) 20 -> 2", "rejected"), ("processes 3 -> 1", "rejected")]
    # The workload pass still finds each axis' threshold, and runs no candidate twice.
    assert (result.best.workload.processes, result.best.workload.duration >= 5) == (2, True)
    assert len(set(judge.ran)) == len(judge.ran)


def test_the_same_verdicts_give_the_same_result():
    first = shrink(START, judge_with(torn_appears)[0])
    second = shrink(START, judge_with(torn_appears)[0])
    assert first.best == second.best and first.steps == second.steps


def test_schedule_phases_go_when_the_fault_needs_none_of_them():
    rules = {"version": 1, "rules": [TORN, SLOW],
             "schedule": {"phases": [{"name": "calm", "duration_s": 5, "rules": []},
                                     {"name": "slow", "duration_s": 5, "rules": ["slow-commits"]}]}}
    start = Candidate(rules, Workload(3, 10, 8, 4))
    result = shrink(start, judge_with(torn_appears)[0])
    assert "schedule" not in result.best.rules
    assert result.best.rule_ids == ["stale-commit"]


def test_a_schedule_the_fault_needs_loses_only_its_other_phases():
    rules = {"version": 1, "rules": [TORN, SLOW],
             "schedule": {"phases": [{"name": "calm", "duration_s": 5, "rules": []},
                                     {"name": "torn", "duration_s": 5, "rules": ["stale-commit"]},
                                     {"name": "slow", "duration_s": 5, "rules": ["slow-commits"]}]}}

    def needs_the_torn_phase(candidate):
        schedule = candidate.rules.get("schedule")
        return torn_appears(candidate) and schedule is not None and any(
            "stale-commit" in p["rules"] for p in schedule["phases"])

    result = shrink(Candidate(rules, Workload(3, 10, 8, 4)), judge_with(needs_the_torn_phase)[0])
    assert [p["name"] for p in result.best.rules["schedule"]["phases"]] == ["torn"]


def test_invalid_candidates_are_refused_before_they_run():
    # A rule that names a phase: dropping the schedule would leave the name dangling.
    phased = {**TORN, "match": {**TORN["match"], "phase": "torn"}}
    rules = {"version": 1, "rules": [phased],
             "schedule": {"phases": [{"name": "torn", "duration_s": 5, "rules": ["stale-commit"]}]}}
    judge, calls = judge_with(lambda c: torn_appears(c) and c.rules["rules"][0]["match"].get("phase") == "torn")
    result = shrink(Candidate(rules, Workload(3, 10, 8, 4)), judge)
    invalid = [s for s in result.steps if s.outcome == "invalid"]
    assert invalid and all(s.reason for s in invalid)
    assert all(change not in {s.change for s in invalid} for _, change in calls)


def test_a_stop_from_the_callback_keeps_the_best_so_far():
    budget = iter(range(5))  # the two run-time tries (both rejected), then three more

    def judge(candidate, axis, change):
        if next(budget, None) is None:
            raise Stop("budget")
        return Verdict(reproduced=torn_appears(candidate))

    result = shrink(START, judge)
    assert result.stopped == "budget"
    assert result.best.rule_ids == ["stale-commit"]
    assert result.steps[-1].outcome == "unfinished"


def test_ctrl_c_keeps_the_best_so_far():
    seen = []

    def judge(candidate, axis, change):
        seen.append(change)
        if len(seen) == 4:  # the two run-time tries (both rejected), one rule move, then ^C
            raise KeyboardInterrupt
        return Verdict(reproduced=torn_appears(candidate))

    result = shrink(START, judge)
    assert result.stopped == "interrupted"
    assert result.best.rule_ids == ["latency", "stale-commit"]  # the first half, kept before the interrupt


def test_without_a_rule_to_blame_the_empty_rule_set_is_tried():
    judge, calls = judge_with(lambda c: True)
    result = shrink(START, judge, require_rule=False)
    assert result.best.rule_ids == []
    assert calls[2] == ("rules", "drop every rule")  # after the two run-time moves


REPORT = {
    "counts": {"torn-transaction": 3, "G1a": 150},
    "anomalies": {"G1a": [{"cause": {"by": "broker"}}], "torn-transaction": [{}]},
    "stats": {"fault_impact": [
        {"rule": "stale-commit", "anomaly": "torn-transaction", "cases": 3},
        {"rule": "latency", "anomaly": "rule-effect", "cases": 40},
    ]},
}


def test_an_anomaly_counts_only_when_a_rule_is_blamed_if_that_was_required():
    assert attributed_rules(REPORT, "torn-transaction") == {"stale-commit"}
    assert anomaly_appears(REPORT, "torn-transaction", require_rule=True)
    assert not anomaly_appears(REPORT, "G1a", require_rule=True)  # the broker's own
    assert anomaly_appears(REPORT, "G1a", require_rule=False)
    assert not anomaly_appears(REPORT, "lost-write", require_rule=False)


def test_a_case_whose_cause_is_a_rule_blames_it():
    report = {"counts": {"G1a": 2}, "anomalies": {"G1a": [{"cause": {"by": "rule", "rule": "stale-abort"}},
                                                          {"cause": {"by": "broker"}}]},
              "stats": {"fault_impact": []}}
    assert attributed_rules(report, "G1a") == {"stale-abort"}


def test_the_minimal_file_says_what_changed_in_each_rule():
    from kproxy.shrink.runner import annotated
    from kproxy.shrink.search import Step

    kept = [Step("rules", "drop rule latency", "kept"),
            Step("conditions", "rule stale-commit: drop match conditions committed, txn_number", "kept"),
            Step("params", "rule stale-commit: action.copies 3 -> 1", "kept")]
    rules = {"version": 1, "rules": [{**TORN, "description": "copy of a commit"}, FETCH]}
    out = annotated(rules, kept)
    assert out["rules"][0]["description"] == (
        "copy of a commit [shrunk: drop match conditions committed, txn_number; action.copies 3 -> 1]")
    assert "description" not in out["rules"][1]
    assert rules["rules"][0]["description"] == "copy of a commit"  # the candidate itself is left alone


def test_action_numbers_shrink_towards_their_smallest():
    slow = {"id": "slow-commits", "match": {"api": "end_txn", "nth": 6, "probability": 0.8},
            "action": {"type": "delay", "ms": 1500, "jitter_ms": 500}}

    def needs_a_long_delay(candidate):
        rule = candidate.rules["rules"][0]
        return rule["action"]["ms"] >= 300 and rule["match"].get("nth", 1) >= 2

    start = Candidate({"version": 1, "rules": [slow]}, Workload(1, 2, 1, 1))
    result = shrink(start, judge_with(needs_a_long_delay)[0])
    rule = result.best.rules["rules"][0]
    assert 300 <= rule["action"]["ms"] < 1500
    assert "jitter_ms" not in rule["action"] or rule["action"]["jitter_ms"] == 0
    assert rule["match"]["nth"] == 2
    assert "probability" not in rule["match"]  # a condition: dropped before numbers are tried
    assert any(s.change == "rule slow-commits: action.jitter_ms 500 -> 0" for s in result.kept)
