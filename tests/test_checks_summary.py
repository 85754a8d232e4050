"""Summary counts, and a clean history that every check passes."""

from tests.fixtures.spark import op, write_history


def send(k, o, v):
    return ["send", k, [o, v]]


def poll(**by_key):
    return ["poll", {k.lstrip("k"): pairs for k, pairs in by_key.items()}]


CLEAN = [
    op(0, "ok", "create", [1, "kproxy-1", 0]),
    op(0, "invoke", "assign", [1]),
    op(0, "ok", "assign", [1]),
    op(1, "invoke", "txn", [["send", 1, 10], ["send", 1, 11]]),
    op(1, "ok", "txn", [send(1, 0, 10), send(1, 1, 11)]),
    # Aborted, never read by anyone: its offsets 3 and 4 stay holes.
    op(1, "invoke", "txn", [["send", 1, 12]]),
    op(1, "fail", "txn", [["send", 1, 12]], error="aborted"),
    op(1, "invoke", "txn", [["send", 1, 13]]),
    op(1, "info", "txn", [["send", 1, 13]], error="timeout"),
    op(1, "info", "crash"),
    op(3, "invoke", "txn", [["send", 1, 14]]),
    op(3, "ok", "txn", [send(1, 6, 14)]),
    op(0, "invoke", "poll", [["poll"]]),
    op(0, "ok", "poll", [poll(k1=[[0, 10], [1, 11]])]),
    op(0, "invoke", "poll", [["poll"]]),
    op(0, "ok", "poll", [poll(k1=[[6, 14]])]),
]


def test_summary_counts_ops_sends_and_polled_records(spark, tmp_path):
    from kproxy_spark.checks import summary, summary_counts
    from kproxy_spark.checks.keypass import collect_pass, history_pass
    from kproxy_spark.history import load_history

    ops = load_history(spark, write_history(tmp_path / "h.jsonl", CLEAN))
    counts = summary_counts(summary(ops), collect_pass(history_pass(ops)).micro_ops)
    assert counts["ops"]["txn"] == {"invoke": 4, "ok": 2, "fail": 1, "info": 1}
    assert counts["ops"]["poll"] == {"invoke": 2, "ok": 2}
    assert counts["ops"]["crash"] == {"info": 1}
    assert (counts["sends_acknowledged"], counts["sends_failed"], counts["sends_unknown"]) == (3, 1, 1)
    assert counts["records_polled"] == 3


def test_a_clean_history_has_no_anomaly(spark, tmp_path):
    from kproxy_spark.checks import ANOMALY_NAMES, history_checks
    from kproxy_spark.history import load_history

    checks = history_checks(load_history(spark, write_history(tmp_path / "h.jsonl", CLEAN)))
    assert set(checks) == set(ANOMALY_NAMES)
    found = {name: len(cases) for name, cases in checks.items()}
    assert found == {name: 0 for name in ANOMALY_NAMES}
