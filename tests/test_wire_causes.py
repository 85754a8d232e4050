"""Causes on hand-made traces: each broker diagnosis fires on the response
that breaks the protocol and stays silent on a correct one; a rule is named
only when its action is on the case's causal path."""

from __future__ import annotations

import pytest

from tests.test_wire_scenarios import PID, Scenario, torn_scenario

pytestmark = pytest.mark.spark


def _wire(spark, tmp_path, scenario):
    from kproxy_spark.attribution import attribute_run
    from kproxy_spark.history import load_history
    from kproxy_spark.report import INFORMATIONAL
    from kproxy_spark.traces import load_traces
    from kproxy_spark.wire import read_wire_rows, wire_frame

    history, traces_dir = scenario.write(tmp_path)
    frame = wire_frame(load_history(spark, str(history)), load_traces(spark, traces_dir))
    cases, _ = read_wire_rows(frame.collect())
    attribute_run({}, cases, INFORMATIONAL)
    return cases


def _analyze(spark, tmp_path, scenario):
    from kproxy_spark.jobs import analyze

    history, traces_dir = scenario.write(tmp_path)
    return analyze(str(history), str(traces_dir), str(tmp_path / "out"), spark=spark)


def _committed_txns(s: Scenario, fetches, polled) -> Scenario:
    """Producer PID: value 1 aborted (offset 0, abort marker 1), value 2
    committed (offset 2, commit marker 3), value 4 committed (offset 5,
    commit marker 6). `fetches`: (records, aborted list) per Fetch response;
    `polled`: the [offset, value] pairs the consumer returned."""
    s.op(0, "ok", "create", [7, "t", 0])
    s.op(0, "invoke", "txn", [["send", 7, 1]])
    s.produce(1, 1, [1], base_offset=0, txn=(1, 1))
    s.end_txn(1, 2, commit=False, txn=(1, 1))
    s.op(0, "fail", "txn", [["send", 7, [0, 1]]], error="aborted")
    s.op(0, "invoke", "txn", [["send", 7, 2]])
    s.produce(1, 3, [2], base_offset=2, txn=(2, 2))
    s.end_txn(1, 4, commit=True, txn=(2, 2))
    s.op(0, "ok", "txn", [["send", 7, [2, 2]]])
    s.op(0, "invoke", "txn", [["send", 7, 4]])
    s.produce(1, 5, [4], base_offset=5, txn=(3, 3))
    s.end_txn(1, 6, commit=True, txn=(3, 3))
    s.op(0, "ok", "txn", [["send", 7, [5, 4]]])
    for corr, (records, aborted) in enumerate(fetches, start=1):
        s.fetch(2, corr, records, aborted=aborted)
    s.op(1, "invoke", "poll", [["poll"]])
    s.op(1, "ok", "poll", [["poll", {"7": polled}]])
    return s


def test_stale_aborted_entry_drops_a_committed_record_and_is_the_lost_writes_cause(spark, tmp_path):
    # The broker lists the first, long-finished abort for a fetch from offset
    # 2: the client drops committed value 2, reads 4 from the next response.
    scenario = _committed_txns(Scenario(), [([(2, 2), (3, "commit")], [(PID, 0)]), ([(5, 4), (6, "commit")], [])],
                               polled=[[5, 4]])
    report = _analyze(spark, tmp_path, scenario)
    [entry] = report["anomalies"]["stale-aborted-entry"]
    assert entry["offsets"] == [2] and entry["records"] == [[7, 2]] and entry["listed_first_offsets"] == [0]
    assert entry["cause"]["by"] == "broker" and entry["rules"] == []
    [lost] = report["anomalies"]["lost-write"]
    assert lost["value"] == 2
    assert lost["cause"]["by"] == "broker" and lost["cause"]["name"] == "stale-aborted-entry"
    assert lost["cause"]["at"]["correlation_id"] == 1
    assert report["stats"]["causes"]["lost-write"] == {"broker:stale-aborted-entry": 1}
    assert report["stats"]["fault_impact"] == []


def test_an_entry_that_overlaps_the_fetched_range_is_no_diagnosis(spark, tmp_path):
    # Fetch from 0: the entry covers value 1 up to its abort marker, and
    # value 2 after the marker is the client's to read.
    scenario = _committed_txns(
        Scenario(), [([(0, 1), (1, "abort"), (2, 2), (3, "commit"), (5, 4), (6, "commit")], [(PID, 0)])],
        polled=[[2, 2], [5, 4]])
    found = _wire(spark, tmp_path, scenario)
    assert found["stale-aborted-entry"] == [] and found["broker-aborted-read"] == []
    assert found["past-lso-read"] == []


def test_records_served_past_the_last_stable_offset_before_their_end_txn(spark, tmp_path):
    # Value 4 (offset 5) is served while its transaction is still open: the
    # Fetch response comes back before the client's EndTxn reaches the broker.
    s = Scenario()
    s.op(0, "ok", "create", [7, "t", 0])
    s.op(0, "invoke", "txn", [["send", 7, 4]])
    s.produce(1, 1, [4], base_offset=5, txn=(1, 1))
    s.fetch(2, 1, [(5, 4)])
    s.fetch(2, 2, [(6, "commit")])
    s.end_txn(1, 2, commit=True, txn=(1, 1))
    s.op(0, "ok", "txn", [["send", 7, [5, 4]]])
    s.op(1, "invoke", "poll", [["poll"]])
    s.op(1, "ok", "poll", [["poll", {"7": [[5, 4]]}]])
    for fetch in (e for e in s.events if e["api"] == "fetch" and e["direction"] == "response"):
        fetch["partitions"][0]["last_stable_offset"] = 5
    [past] = _wire(spark, tmp_path, s)["past-lso-read"]
    assert past["offsets"] == [5] and past["last_stable_offset"] == 5
    assert past["cause"]["name"] == "past-last-stable-offset" and past["cause"]["by"] == "broker"


def test_records_past_the_last_stable_offset_after_their_end_txn_are_no_diagnosis(spark, tmp_path):
    # Kafka reports the LSO it read before reading the records: a response
    # that comes back after the transaction's EndTxn reached the broker may
    # carry it past that snapshot, decided, and is not the broker's error.
    scenario = _committed_txns(Scenario(), [([(2, 2), (3, "commit"), (5, 4), (6, "commit")], [])],
                               polled=[[2, 2], [5, 4]])
    fetch = next(e for e in scenario.events if e["api"] == "fetch" and e["direction"] == "response")
    fetch["partitions"][0]["last_stable_offset"] = 5
    assert _wire(spark, tmp_path, scenario)["past-lso-read"] == []

    fetch["partitions"][0]["last_stable_offset"] = 6  # everything served lies below it
    (tmp_path / "below").mkdir()
    assert _wire(spark, tmp_path / "below", scenario)["past-lso-read"] == []



def _rewritten(scenario: Scenario, upstream_aborted: list[dict]) -> dict:
    """Mark the scenario's Fetch response as rewritten by rule drop-index,
    with the broker's own response carrying `upstream_aborted`."""
    fetch = next(e for e in scenario.events if e["api"] == "fetch" and e["direction"] == "response")
    [part] = fetch["partitions"]
    fetch.update(rule="drop-index", action="rewrite", outcome="rewritten",
                 upstream_partitions=[{**part, "aborted_transactions": upstream_aborted}])
    return fetch


def test_a_rewrite_that_removed_the_cover_is_the_aborted_reads_cause(spark, tmp_path):
    scenario = torn_scenario(stale=False, listed=False)
    _rewritten(scenario, [{"producer_id": PID, "first_offset": 0}, {"producer_id": PID, "first_offset": 2}])
    found = _wire(spark, tmp_path, scenario)
    [case] = found["broker-aborted-read"]
    assert case["rules"] == ["drop-index"] and case["cause"]["by"] == "rule"
    assert case["cause"]["rule"] == "drop-index"
    impact = {(r["rule"], r["anomaly"]): r["cases"] for r in found["fault-impact"]}
    assert impact[("drop-index", "broker-aborted-read")] == 1


def test_a_rewrite_of_a_list_the_broker_never_filled_causes_nothing(spark, tmp_path):
    # As on a broker that sends an empty list: removing it changes nothing,
    # so the aborted read is the broker's, and the rule only acted.
    scenario = torn_scenario(stale=False, listed=False)
    _rewritten(scenario, [])
    found = _wire(spark, tmp_path, scenario)
    [case] = found["broker-aborted-read"]
    assert case["rules"] == [] and case["cause"]["by"] == "broker"
    assert case["response_rule"] == "drop-index"
    impact = {(r["rule"], r["anomaly"]) for r in found["fault-impact"] if r["rule"] == "drop-index"}
    assert impact == {("drop-index", "rule-effect")}
    [effect] = [e for e in found["rule-effect"] if e["rule"] == "drop-index"]
    assert effect["rule"] == "drop-index" and "responses-rewritten" in effect["effects"]


def test_a_record_a_rule_took_out_of_a_response_is_the_lost_writes_cause(spark, tmp_path):
    scenario = _committed_txns(Scenario(), [([(3, "commit")], []), ([(5, 4), (6, "commit")], [])],
                               polled=[[5, 4]])
    fetch = next(e for e in scenario.events if e["api"] == "fetch" and e["direction"] == "response")
    part = fetch["partitions"][0]
    upstream = {**part, "records": [{"offset": 2, "key": "7", "value": "2", "control": None, "producer_id": PID,
                                     "transactional": True}, *part["records"]]}
    fetch.update(rule="hide", action="rewrite", outcome="rewritten", upstream_partitions=[upstream])
    report = _analyze(spark, tmp_path, scenario)
    [lost] = report["anomalies"]["lost-write"]
    assert lost["value"] == 2 and lost["cause"]["by"] == "rule" and lost["cause"]["rule"] == "hide"
    assert lost["cause"]["name"] == "removed-by-rule"
    impact = {(r["rule"], r["anomaly"]): r["cases"] for r in report["stats"]["fault_impact"]}
    assert impact[("hide", "lost-write")] == 1


def test_an_aborted_record_a_rule_took_out_of_a_read_committed_response_explains_no_skip(spark, tmp_path):
    # As fetch_hide_aborted on Tansu: committed 2, aborted 1, committed 4.
    # Reader 1's response loses value 1, which a read_committed client drops
    # anyway; reader 2 is served it by the broker's own response (an empty
    # aborted list). Reader 1 "skipped" value 1 only because reader 2 read
    # it: the broker's doing, not the rule's.
    s = Scenario()
    s.op(0, "ok", "create", [7, "t", 0])
    for corr, (value, offset, commit) in enumerate(((2, 0, True), (1, 2, False), (4, 5, True))):
        s.op(0, "invoke", "txn", [["send", 7, value]])
        s.produce(1, 2 * corr + 1, [value], base_offset=offset, txn=(corr + 1, corr + 1))
        s.end_txn(1, 2 * corr + 2, commit=commit, txn=(corr + 1, corr + 1))
        if commit:
            s.op(0, "ok", "txn", [["send", 7, [offset, value]]])
        else:
            s.op(0, "fail", "txn", [["send", 7, [offset, value]]], error="aborted")
    upstream = [(0, 2), (1, "commit"), (2, 1), (3, "abort"), (5, 4), (6, "commit")]
    s.fetch(2, 1, [(0, 2), (5, 4)], aborted=[])
    s.fetch(3, 1, upstream, aborted=[])
    rewritten, served = [e for e in s.events if e["api"] == "fetch" and e["direction"] == "response"]
    rewritten.update(rule="hide", action="rewrite", outcome="rewritten",
                     upstream_partitions=[{**rewritten["partitions"][0],
                                           "records": served["partitions"][0]["records"]}])
    for process, polled in ((1, [[0, 2], [5, 4]]), (2, [[0, 2], [2, 1], [5, 4]])):
        s.op(process, "invoke", "poll", [["poll"]])
        s.op(process, "ok", "poll", [["poll", {"7": polled}]])
    report = _analyze(spark, tmp_path, s)
    [skip] = report["anomalies"]["int-poll-skip"]
    assert skip["skipped"] == [1] and skip["process"] == 1
    assert skip["cause"]["by"] == "broker" and skip["cause"]["name"] == "aborted-txn-not-listed", skip["cause"]
    assert {(r["rule"], r["anomaly"]) for r in report["stats"]["fault_impact"]} == {("hide", "rule-effect")}


def test_a_late_copy_that_lands_in_an_aborted_transaction_is_not_a_torn_one(spark, tmp_path):
    # The client's transaction committed value 1 at offset 0. A late copy of
    # its Produce landed at offset 2 in the next broker-side transaction,
    # which aborted: value 1 is committed once and aborted once, yet the
    # client's transaction is whole.
    s = Scenario()
    s.op(0, "ok", "create", [7, "t", 0])
    s.op(0, "invoke", "txn", [["send", 7, 1]])
    s.produce(1, 1, [1], base_offset=0, txn=(1, 1))
    s.end_txn(1, 2, commit=True, txn=(1, 1))
    s.op(0, "ok", "txn", [["send", 7, [0, 1]]])
    s.produce(9, 1, [1], base_offset=2, txn=(1, 2), hazard="late_produce", rule="late", action="duplicate",
              outcome="ghost", copy=1)
    s.end_txn(1, 3, commit=False, txn=(2, 2))
    found = _wire(spark, tmp_path, s)
    assert found["torn-transaction"] == [] and found["client-outcome-mismatch"] == []
    [late] = found["late-produce"]
    assert late["landed_fates"] == ["aborted"] and late["copy"] == 1
    assert "in a transaction that aborted (a copy the proxy delivered" in late["explanation"]


def test_a_held_request_delivered_late_counts_as_delivered(spark, tmp_path):
    s = Scenario()
    s.op(0, "ok", "create", [8, "t", 0])
    s.op(0, "invoke", "send", [["send", 8, 1]])
    s.produce(1, 1, [1], key=8, base_offset=0, rule="hold-it", action="hold", outcome="held")
    s.op(0, "ok", "send", [["send", 8, [0, 1]]])
    found = _wire(spark, tmp_path, s)
    [effect] = found["rule-effect"]
    assert effect["writes"]["landed_once"] == 1 and effect["writes"]["never_landed"] == 0


def test_a_request_its_connection_closed_on_is_lost_not_unanswered(spark, tmp_path):
    from kproxy_spark.traces import load_traces
    from kproxy_spark.wire.landings import produce_attempts

    s = Scenario()
    s.op(0, "ok", "create", [8, "t", 0])
    s.op(0, "invoke", "send", [["send", 8, 1]])
    records = [{"offset": None, "key": "8", "value": "1", "producer_id": 2000, "producer_epoch": 0, "sequence": 0,
                "transactional": False}]
    s.event(direction="request", api="produce", conn_id=1, correlation_id=1,
            partitions=[{"topic": "t", "partition": 0, "records": records}])
    s.event(direction="close", api=None, conn_id=1, close_reason="client_closed",
            in_flight=[{"conn_id": 1, "correlation_id": 1, "copy": 0, "api": "produce", "api_key": 0,
                        "api_version": 9, "state": "awaiting_broker"}])
    s.op(0, "info", "send", [["send", 8, 1]], error="timeout")
    _, traces_dir = s.write(tmp_path)
    [attempt] = produce_attempts(load_traces(spark, traces_dir)).collect()
    assert attempt["status"] == "lost" and attempt["lost_reason"] == "lost: connection closed (client_closed)"


def test_a_response_that_leaves_out_committed_records_is_the_lost_writes_cause(spark, tmp_path):
    # The broker's response serves offsets 0-1 and 5-6 and skips 2, where
    # committed value 2 lies; the client reads on from 5.
    scenario = _committed_txns(Scenario(), [([(0, 1), (1, "abort"), (5, 4), (6, "commit")], [(PID, 0)])],
                               polled=[[5, 4]])
    report = _analyze(spark, tmp_path, scenario)
    [gap] = report["anomalies"]["left-out-records"]
    assert gap["offsets"] == [2] and gap["records"] == [[7, 2]] and gap["cause"]["by"] == "broker"
    [lost] = report["anomalies"]["lost-write"]
    assert lost["value"] == 2 and lost["cause"]["name"] == "records-left-out"


def test_a_gap_of_aborted_records_or_markers_is_no_diagnosis(spark, tmp_path):
    # Left out: the aborted value 1 and its abort marker, as a broker that
    # filters aborted data for read_committed does.
    scenario = _committed_txns(Scenario(), [([(2, 2), (3, "commit"), (5, 4), (6, "commit")], [])],
                               polled=[[2, 2], [5, 4]])
    assert _wire(spark, tmp_path, scenario)["left-out-records"] == []


def test_a_record_delivered_after_every_end_txn_is_decided_by_its_transaction_number_with_its_rule(spark, tmp_path):
    # The late Produce reaches the broker after the producer's last EndTxn:
    # no EndTxn follows it in delivery order, so the one that ended its
    # broker-side transaction (2) decides it: rule 'torn''s stale commit,
    # with every column of that EndTxn (hazard, rule, action, outcome, where
    # and when), not a mix of the two ways of choosing it.
    scenario = torn_scenario()
    late = [e for e in scenario.events if e["api"] == "produce" and e["correlation_id"] == 2]
    assert [e["direction"] for e in late] == ["request", "response"] and late[0]["hazard"] == "late_produce"
    for event in late:
        scenario.events.remove(event)
    last = scenario.events[-1]["mono_ns"]
    for step, event in enumerate(late, start=1):
        event.update(mono_ns=last + step * 1_000_000, wall_time=1.7e9 + (last + step * 1_000_000) / 1e9)
        scenario.events.append(event)
    [torn] = _wire(spark, tmp_path, scenario)["torn-transaction"]
    [stale] = torn["stale_end_txns"]
    assert (stale["txn_broker"], stale["end_txn_commit"], stale["copy"]) == (2, True, 1)
    assert (stale["hazard"], stale["rule"], stale["action"], stale["outcome"]) == (
        "stale_end_txn", "torn", "duplicate", "duplicated")
    assert "duplicated by rule 'torn' and delivered while broker txn 2 was open" in torn["explanation"]
    assert torn["cause"]["rule"] == "torn" and torn["cause"]["text"] == "rule 'torn' delivered the stale EndTxn"


def test_the_rule_that_delivered_the_stale_end_txn_is_the_torn_transactions_cause(spark, tmp_path):
    # Rule 'a-latency' (first by name) only delayed a Produce; rule 'torn'
    # delivered the stale EndTxn that decided the records.
    scenario = torn_scenario()
    late = next(e for e in scenario.events if e.get("hazard") == "late_produce" and e["direction"] == "request")
    late["rule"] = "a-latency"
    [torn] = _wire(spark, tmp_path, scenario)["torn-transaction"]
    assert set(torn["rules"]) == {"a-latency", "torn"}
    assert torn["cause"]["rule"] == "torn"
