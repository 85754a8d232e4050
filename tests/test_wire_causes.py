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
