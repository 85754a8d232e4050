"""Folding idle Fetch exchanges changes no finding and no count: one real noida-db run, traced with every
event (--no-trace-fold-idle-fetches), then the same events through a trace writer that folds, and both
traces analysed against the run's history."""

from __future__ import annotations

from pathlib import Path

import pytest

from kproxy.demo import run_demo
from kproxy.obs.trace_files import iter_trace_events
from tests.fixtures.trace_fold import refold

# A real noida-db run and four analyses (2-3 minutes): tests/test_recorded_runs.py folds a recorded run's
# flood of idle exchanges in the default suite.
pytestmark = [pytest.mark.spark, pytest.mark.slow, pytest.mark.timeout(900)]

# What differs between two analyses of the same input: how long they took.
TIMINGS = ("elapsed_s", "phases_s", "spark_jobs", "spark_stages")


def test_a_noida_runs_findings_and_counts_are_the_same_with_idle_fetches_folded(
        noida_broker, spark, tmp_path, monkeypatch) -> None:
    from kproxy_spark.jobs import analyze

    monkeypatch.setenv("KPROXY_TRACE_FOLD_IDLE_FETCHES", "0")  # the demo's proxy writes every event
    run = run_demo("torn-transaction", tmp_path / "run", bootstrap=noida_broker.bootstrap, duration=6, spark=spark,
                   say=lambda line: None, progress=False)
    every = run.report
    read, written = refold(tmp_path / "run" / "traces", tmp_path / "folded")
    folded_events = list(iter_trace_events(tmp_path / "folded", records=False))
    assert len(folded_events) == written and sum(e["repeats"] or 1 for e in folded_events) == read
    # noida-db answers an idle consumer at once: most of the run's events are its empty Fetch exchanges.
    assert written < read / 4, (written, read)

    folded = analyze(str(tmp_path / "run" / "history.jsonl"), str(tmp_path / "folded"), str(tmp_path / "out"),
                     spark=spark)
    assert every["counts"] and every["anomalies"]
    for key in ("valid", "anomaly_types", "errors", "informational", "counts", "anomalies"):
        assert folded[key] == every[key], key
    stats = {k: v for k, v in every["stats"].items() if k not in (*TIMINGS, "latency")}
    assert {k: v for k, v in folded["stats"].items() if k not in (*TIMINGS, "latency")} == stats
    assert every["stats"]["trace_events"] == read
    # Latency: the same responses, errors and maxima; the percentiles are percentile_approx's of the same
    # values, each within its rank error (1/1000 of the responses) of the exact one.
    latencies = exact_latencies(tmp_path / "run" / "traces")
    rows = {row["api"]: row for row in folded["stats"]["latency"]}
    assert set(rows) == {row["api"] for row in every["stats"]["latency"]}
    for row in every["stats"]["latency"]:
        other, (client, upstream) = rows[row["api"]], latencies[row["api"]]
        for key in ("responses", "errors", "max_ms"):
            assert other[key] == row[key], (row["api"], key)
        for key, q, values in (("p50_ms", 0.5, client), ("p95_ms", 0.95, client), ("p99_ms", 0.99, client),
                               ("upstream_p99_ms", 0.99, upstream)):
            assert within_rank_error(other[key], values, q) and within_rank_error(row[key], values, q), (row, key)
    fetches = rows["fetch"]
    assert fetches["responses"] == len(latencies["fetch"][0]) > written

    # And with no history: the clients' history derived from each trace alone (the Fetch positions asked
    # included) gives the same verdict.
    derived = {name: analyze(None, str(traces), str(tmp_path / f"derived-{name}"), spark=spark)
               for name, traces in (("every", tmp_path / "run" / "traces"), ("folded", tmp_path / "folded"))}
    assert derived["every"]["counts"] and derived["every"]["stats"]["trace_events"] == read
    for key in ("valid", "errors", "counts", "anomalies"):
        assert derived["folded"][key] == derived["every"][key], key
    for key in ("causes", "trace_events", "derived_history", "completed_ops"):
        assert derived["folded"]["stats"].get(key) == derived["every"]["stats"].get(key), key


def exact_latencies(traces: Path) -> dict[str, tuple[list[float], list[float]]]:
    """Per api, every response's latency and upstream latency, sorted."""
    found: dict[str, tuple[list[float], list[float]]] = {}
    for event in iter_trace_events(traces, records=False):
        if event["direction"] == "response" and event["latency_ms"] is not None:
            client, upstream = found.setdefault(event["api"], ([], []))
            client.append(event["latency_ms"])
            if event["upstream_latency_ms"] is not None:
                upstream.append(event["upstream_latency_ms"])
    return {api: (sorted(client), sorted(upstream)) for api, (client, upstream) in found.items()}


def within_rank_error(value: float, ordered: list[float], q: float) -> bool:
    n = len(ordered)
    slack = max(1, int(n / 1000) + 1)
    rank = int(q * n)
    return ordered[max(0, rank - slack)] <= value <= ordered[min(n - 1, rank + slack)]
