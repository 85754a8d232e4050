"""The analysis on runs recorded from the real proxy, real clients and the two
embedded brokers (`kproxy demo`, seed 1; tests/data/recorded/README.md says
how they were made). Each broker diagnosis fires on the real trace of the
broker that shows it, and a rule is credited only with what it caused."""

from __future__ import annotations

from pathlib import Path

import pytest

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
