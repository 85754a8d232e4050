"""The analysis on runs recorded from the real proxy, real clients and the two
embedded brokers (`kproxy demo`, seed 1; tests/data/recorded/README.md says
how they were made). Each broker diagnosis fires on the real trace of the
broker that shows it, and a rule is credited only with what it caused."""

from __future__ import annotations

import shutil
from pathlib import Path

import orjson
import pytest

from tests.fixtures.trace_fold import refold

pytestmark = pytest.mark.spark

RECORDED = Path(__file__).parent / "data" / "recorded"
RULE = "rule:stale-commit-into-next-txn"


@pytest.fixture(scope="module")
def analysed(spark, tmp_path_factory):
    from kproxy_spark.jobs import analyze

    reports: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in reports:
            run = RECORDED / name
            out = tmp_path_factory.mktemp(name)
            reports[name] = analyze(str(run / "history.jsonl"), str(run / "traces"), str(out), spark=spark)
        return reports[name]

    return get


def _labels(report: dict) -> set[str]:
    return {label for by in report["stats"].get("causes", {}).values() for label in by}


def test_tansu_serves_aborted_records_unlisted_and_the_rule_tears_transactions(analysed):
    report = analysed("tansu-torn-transaction")
    causes = report["stats"]["causes"]
    assert set(causes["torn-transaction"]) == {RULE}
    assert set(causes["broker-aborted-read"]) == {"broker:aborted-txn-not-listed"}
    # Both at once: reads of values the stale commit committed are the rule's,
    # reads of records Tansu served without listing their abort are Tansu's.
    assert {RULE, "broker:aborted-txn-not-listed"} <= set(causes["G1a"])
    impact = {(r["rule"], r["anomaly"]) for r in report["stats"]["fault_impact"]}
    assert ("stale-commit-into-next-txn", "torn-transaction") in impact
    assert ("stale-commit-into-next-txn", "broker-aborted-read") not in impact


def test_noida_lists_stale_aborted_entries_and_nothing_is_a_rules(analysed):
    report = analysed("noida-healthy")
    assert report["stats"].get("fault_impact", []) == []
    assert not any(label.startswith("rule:") for label in _labels(report))
    [first, *_] = report["anomalies"]["stale-aborted-entry"]
    assert first["cause"]["by"] == "broker" and first["listed_first_offsets"]
    # noida-db lists the aborted transactions it serves: no unlisted aborted read.
    assert report["counts"]["broker-aborted-read"] == 0
    for name in report["errors"]:
        assert "unexplained" not in report["stats"]["causes"].get(name, {}), name


def test_on_noida_the_torn_transactions_aborted_reads_are_the_rules(analysed):
    report = analysed("noida-torn-transaction")
    causes = report["stats"]["causes"]
    assert set(causes["torn-transaction"]) == {RULE}
    assert causes["G1a"].get(RULE, 0) > 0
    impact = {(r["rule"], r["anomaly"]) for r in report["stats"]["fault_impact"]}
    assert {("stale-commit-into-next-txn", "torn-transaction"), ("stale-commit-into-next-txn", "G1a")} <= impact


def _with_idle_fetches(run: Path, out: Path, copies: int) -> tuple[int, int]:
    """The run's trace as a segment file, each Fetch response followed by `copies` idle exchanges on its
    connection, as noida-db answers a consumer with nothing new to read: the same partitions, offsets and
    aborted-transactions lists, no record (their requests decoded, with nothing to say: a writer may fold
    them). Returns (events written, idle responses added)."""
    import copy as copying

    from kproxy.obs.trace_files import iter_jsonl_events
    from kproxy.obs.trace_schema import SCHEMA_VERSION
    from kproxy.obs.trace_segments import COLUMNS, encode_segment, file_header

    events, idle = [], 0
    for event in iter_jsonl_events(run / "traces" / "trace.jsonl.gz"):
        events.append(event)
        if event.get("api") != "fetch" or event.get("direction") != "response" or not event.get("partitions"):
            continue
        empty = [{**part, "records": [], "batches": [], "compression": None, "records_file": None,
                  "records_offset": None, "records_length": None} for part in event["partitions"]]
        for i in range(copies):
            correlation_id = 1_000_000 + idle
            for direction in ("request", "response"):
                twin = copying.deepcopy(event)
                twin.update(direction=direction, correlation_id=correlation_id, mono_ns=event["mono_ns"] + i + 1,
                            partitions=copying.deepcopy(empty) if direction == "response" else [])
                events.append(twin)
            idle += 1
    rows = [[SCHEMA_VERSION if name == "schema_version" else e.get(name) for name, _ in COLUMNS] for e in events]
    out.mkdir(parents=True)
    with open(out / "trace-idle-20260101T000000-000000.events", "wb") as f:
        f.write(file_header())
        f.writelines(encode_segment(rows[start : start + 512]) for start in range(0, len(rows), 512))
    return len(events), idle


def test_idle_fetches_keep_their_events_and_change_no_finding(analysed, spark, tmp_path):
    """noida-db's idle consumers flood the trace with empty Fetch responses: the analysis reads their
    partitions once per distinct text (load_traces(lean=True)) and finds exactly what it finds without them."""
    from kproxy_spark.jobs import analyze
    from kproxy_spark.traces import load_traces, trace_partitions
    from pyspark.sql import functions as F

    run = RECORDED / "noida-torn-transaction"
    events, idle = _with_idle_fetches(run, tmp_path / "traces", copies=12)
    assert idle > 1000

    def facts(lean: bool) -> tuple:
        traces = load_traces(spark, tmp_path / "traces", lean=lean)
        fetches = traces.where((F.col("api") == "fetch") & (F.col("direction") == "response"))
        [row] = fetches.agg(F.count(F.lit(1)).alias("n"),
                            F.sum(F.col("partitions").isNotNull().cast("int")).alias("with_partitions")).collect()
        entries = (trace_partitions(traces).where(F.col("aborted_transactions").isNotNull())
                   .select("topic", "partition", F.explode("aborted_transactions").alias("a"))
                   .select("topic", "partition", "a.producer_id", "a.first_offset").distinct().collect())
        return traces.count(), row["n"], row["with_partitions"], sorted(map(tuple, entries))

    full, lean = facts(False), facts(True)
    assert full[0] == lean[0] == events and full[1] == lean[1] == full[2]
    # Most idle responses repeat one seen before; every aborted-transactions entry is still there.
    assert lean[2] < full[2] - idle // 2
    assert lean[3] == full[3] and lean[3]

    plain = analysed("noida-torn-transaction")
    flooded = analyze(str(run / "history.jsonl"), str(tmp_path / "traces"), str(tmp_path / "out"), spark=spark)
    assert flooded["counts"] == plain["counts"]
    assert flooded["stats"]["causes"] == plain["stats"]["causes"]
    assert set(flooded["stats"]["causes"]["torn-transaction"]) == {RULE}
    assert flooded["stats"]["trace_events"] == events

    # The same flood through a writer that folds idle Fetch exchanges: far fewer events, the same
    # verdict, and every exchange still counted (a real noida-db run: tests/test_trace_fold_e2e.py, slow).
    read, written = refold(tmp_path / "traces", tmp_path / "folded")
    assert read == events and written < events - idle
    folded = analyze(str(run / "history.jsonl"), str(tmp_path / "folded"), str(tmp_path / "out-folded"),
                     spark=spark)
    for key in ("valid", "counts", "anomalies"):
        assert folded[key] == flooded[key], key
    assert folded["stats"]["causes"] == flooded["stats"]["causes"]
    assert folded["stats"]["trace_events"] == events
    responses = {row["api"]: row["responses"] for row in flooded["stats"]["latency"]}
    assert {row["api"]: row["responses"] for row in folded["stats"]["latency"]} == responses


def _cases(report: dict) -> dict[str, list[bytes]]:
    # Cases within an anomaly come in no fixed order.
    return {name: sorted(orjson.dumps(case, option=orjson.OPT_SORT_KEYS) for case in cases)
            for name, cases in report["anomalies"].items()}


def test_a_recorded_run_read_through_viewfs_gives_the_local_report(analysed, spark, mounted, tmp_path):
    from kproxy_spark.jobs import analyze

    here = analysed("tansu-torn-transaction")
    local, uri = mounted
    shutil.copytree(RECORDED / "tansu-torn-transaction", local / "run")
    there = analyze(f"{uri}/run/history.jsonl", f"{uri}/run/traces", str(tmp_path / "viewfs"), spark=spark)
    assert there["counts"] == here["counts"]
    assert here["counts"]["torn-transaction"] > 0
    assert _cases(there) == _cases(here)
    assert there["stats"]["trace_events"] == here["stats"]["trace_events"]
    assert orjson.loads((tmp_path / "viewfs" / "report.json").read_bytes())["counts"] == here["counts"]


def test_on_noida_the_writes_a_stale_commit_cut_off_from_their_transaction_are_the_rules(analysed):
    """The torn run's lost writes: each was produced after the rule's stale EndTxn(commit) had ended its
    transaction on noida-db, so the client's own EndTxn(commit) did not reach it and the producer's next
    transaction, which aborted, took it (docs/analysis.md, "Causes"). The reverse, a record cut off from a
    transaction the client aborted and committed by the next, is a G1a of the rule's."""
    report = analysed("noida-torn-transaction")
    causes = report["stats"]["causes"]
    for name in report["errors"]:
        assert "unexplained" not in causes.get(name, {}), (name, causes.get(name))
    assert set(causes["lost-write"]) == {RULE}
    lost = {(c["key"], c["value"]): c["cause"] for c in report["anomalies"]["lost-write"]}
    cause = lost[(0, 14)]  # op 27's last send, told committed
    assert (cause["by"], cause["rule"], cause["name"]) == ("rule", "stale-commit-into-next-txn",
                                                           "cut-off-by-stale-end-txn")
    # Where the trace shows it: the stale EndTxn (the rule's copy) and the record it cut off.
    assert cause["at"] == {"topic": "kproxy-demo-ea9b44e219-0", "partition": 0, "offset": 20,
                           "conn_id": 9, "correlation_id": 10}
    for evidence in ("its Produce (conn 6, correlation id 20)", "stale EndTxn(commit) (conn 9, correlation id 10, copy 1)",
                     "the client's own EndTxn(commit) (conn 9, correlation id 15) did not reach it",
                     "next marker in kproxy-demo-ea9b44e219-0[0] after offset 20 aborted it"):
        assert evidence in cause["text"], cause["text"]
    g1a = [c["cause"] for c in report["anomalies"]["G1a"] if (c["key"], c["value"]) == (4, 3)]
    assert g1a and all(c["name"] == "cut-off-by-stale-end-txn" and "committed it" in c["text"] for c in g1a)


@pytest.fixture(scope="module")
def derived(spark, tmp_path_factory):
    """The same runs' verdicts with no history: derived from their traces alone."""
    from kproxy_spark.jobs import analyze

    reports: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in reports:
            out = tmp_path_factory.mktemp(f"{name}-derived")
            reports[name] = analyze(None, str(RECORDED / name / "traces"), str(out), spark=spark)
        return reports[name]

    return get


def _blamed_rules(report: dict, skip_causes: set[str] = frozenset()) -> dict[str, set[str]]:
    """Per anomaly class, the rules its cases are blamed on (cases with any of `skip_causes` left out)."""
    blamed: dict[str, set[str]] = {}
    for anomaly, cases in report["anomalies"].items():
        for case in cases if isinstance(cases, list) else []:
            cause = case.get("cause") or {}
            if cause.get("by") == "rule" and not skip_causes & set(case.get("causes") or ()):
                blamed.setdefault(anomaly, set()).add(cause["rule"])
    return blamed


@pytest.mark.parametrize("name", ["tansu-torn-transaction", "noida-torn-transaction",
                                  pytest.param("noida-healthy", marks=pytest.mark.slow)])
def test_the_verdict_from_the_wire_alone_blames_the_rule_for_what_the_history_does(analysed, derived, name):
    from kproxy_spark.derived.describe import HISTORY_ONLY, HISTORY_ONLY_CAUSES

    by_history = _blamed_rules(analysed(name), set(HISTORY_ONLY_CAUSES))
    by_wire = _blamed_rules(derived(name))
    for anomaly, rules in by_history.items():
        if anomaly not in HISTORY_ONLY:
            assert rules <= by_wire.get(anomaly, set()), (anomaly, rules, by_wire.get(anomaly))
    report = derived(name)
    assert report["stats"]["final_reads"]
    assert report["stats"]["derived_history"]["transactional_producers"] > 0
    if name == "noida-healthy":
        assert by_wire == {}
    else:
        assert {"torn-transaction", "G1a"} <= set(by_wire)
