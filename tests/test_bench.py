"""`kproxy bench` end to end, small: every path runs, the reference path cannot be bypassed.

No figure is asserted (performance is judged by a full bench run on a quiet
machine, docs/performance.md); these tests check that the command measures
what it says it measures.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
from confluent_kafka.admin import AdminClient

from kproxy.bench.reference import haproxy_path

needs_haproxy = pytest.mark.skipif(shutil.which("haproxy") is None, reason="Debian's haproxy is not installed")


@needs_haproxy
def test_reference_clients_only_learn_haproxy(tmp_path) -> None:
    with haproxy_path(tmp_path) as bootstrap:
        metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15)
        advertised = {f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    assert advertised == {bootstrap}


@needs_haproxy
def test_bench_measures_every_path(tmp_path) -> None:
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "kproxy", "bench", "--reference", "--rounds", "1", "--batched-records", "12000",
         "--small-records", "3000", "--latency-seconds", "0.5", "--consume-passes", "1", "--no-memory",
         "--out", str(out), "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["paths"]) == {"direct", "proxy", "haproxy"}
    for name, path in result["paths"].items():
        for workload in ("batched_produce", "consume", "unbatched_produce"):
            assert path[workload]["records_per_s"] > 0, (name, workload)
        assert path["latency_ms"]["p50"] > 0, name
    assert set(result["proxy_vs_reference"]) == {"batched_produce", "consume", "unbatched_produce"}
    assert set(result["checks"]) == {"batched_produce", "consume", "unbatched_produce", "added_p99"}
    assert "kproxy throughput / haproxy throughput" in run.stdout


def test_reference_refuses_an_external_broker() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kproxy", "bench", "--reference", "--bootstrap", "127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2
    assert "--reference" in run.stderr
