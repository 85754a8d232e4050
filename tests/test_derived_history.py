"""A verdict from the trace alone (no client history): what it refuses, and traces of several proxies.

The agreement of the wire-derived verdict with the history-based one on the
recorded runs is in tests/test_recorded_runs.py; kproxy test's end-to-end run
of an application kproxy did not write is in tests/test_kproxy_test.py.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import pytest

pytestmark = pytest.mark.spark

RECORDED = Path(__file__).parent / "data" / "recorded"


def _events(run: str) -> list[dict]:
    with gzip.open(RECORDED / run / "traces" / "trace.jsonl.gz", "rt") as f:
        return [json.loads(line) for line in f]


def _write(directory: Path, name: str, events: list[dict]) -> None:
    directory.mkdir(parents=True, exist_ok=True)
    (directory / name).write_text("".join(json.dumps(e) + "\n" for e in events))


def test_a_trace_without_records_is_refused_naming_the_level_it_needs(spark, tmp_path):
    from kproxy_spark.jobs import InputError, analyze

    # The same run as the proxy writes it at level `headers`: every event, no records.
    headers = [{**e, "partitions": None, "upstream_partitions": None} for e in _events("noida-healthy")]
    _write(tmp_path / "traces", "trace.jsonl", headers)
    with pytest.raises(InputError, match="carry no records.*trace-level records"):
        analyze(None, tmp_path / "traces", tmp_path / "out", spark=spark)


def test_a_missing_history_needs_traces(tmp_path):
    from kproxy_spark.jobs import InputError, analyze

    with pytest.raises(InputError, match="without a history the verdict is derived from the traces"):
        analyze(None, None, tmp_path / "out")


@pytest.mark.slow  # two analyses of a recorded run: about 45 s of the default suite's 600
def test_traces_of_two_proxies_in_one_directory_give_the_verdict_of_one(spark, tmp_path):
    """A run whose connections went through two proxies (split by connection, each proxy numbering its
    connections from the same start) is judged as the whole."""
    from kproxy_spark.jobs import analyze

    events = _events("noida-torn-transaction")

    def as_proxy_b(event: dict) -> dict:
        # Proxy b numbers its connections as proxy a does: only the proxy id tells them apart.
        in_flight = [{**entry, "conn_id": entry["conn_id"] - 1} for entry in event.get("in_flight") or []]
        return {**event, "proxy_id": "proxy-b", "conn_id": event["conn_id"] - 1,
                "in_flight": in_flight if event.get("in_flight") is not None else None}

    _write(tmp_path / "split", "trace-a.jsonl", [{**e, "proxy_id": "proxy-a"} for e in events if e["conn_id"] % 2 == 0])
    _write(tmp_path / "split", "trace-b.jsonl", [as_proxy_b(e) for e in events if e["conn_id"] % 2 == 1])
    whole = analyze(None, RECORDED / "noida-torn-transaction" / "traces", tmp_path / "whole", spark=spark)
    split = analyze(None, tmp_path / "split", tmp_path / "split-out", spark=spark)
    assert split["stats"]["derived_history"]["proxies"] == ["proxy-a", "proxy-b"]
    assert split["errors"] == whole["errors"] and "torn-transaction" in split["errors"]
    for name in whole["errors"]:
        assert split["stats"]["causes"][name] == whole["stats"]["causes"][name], name
    for count in ("txns", "polls", "transactional_producers"):
        assert split["stats"]["derived_history"][count] == whole["stats"]["derived_history"][count]
