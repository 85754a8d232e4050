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
from kproxy.bench.report import format_table
from kproxy.bench.runner import REFERENCE, THROUGHPUT_TARGETS, BenchConfig, PathResult, summarise
from kproxy.bench.workloads import Sample

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
    assert all(result["paths"]["proxy"]["proxy_cpu_us_per_record"][w] > 0
               for w in ("batched_produce", "consume", "unbatched_produce"))
    assert "kproxy throughput / haproxy throughput" in run.stdout


def test_reference_refuses_an_external_broker() -> None:
    run = subprocess.run(
        [sys.executable, "-m", "kproxy", "bench", "--reference", "--bootstrap", "127.0.0.1:9"],
        capture_output=True, text=True, timeout=60,
    )
    assert run.returncode == 2
    assert "--reference" in run.stderr


def _path(rates: list[float], latency_ms: float = 0.5, cpu_s: list[float] | None = None) -> PathResult:
    result = PathResult()
    for i, rate in enumerate(rates):
        for workload in THROUGHPUT_TARGETS:
            result.add(workload, Sample(int(rate), int(rate) * 1024, 1.0), cpu_s[i] if cpu_s else None)
        result.add("latency", Sample(1, 100, 1.0, [latency_ms]))
    return result


def test_ratios_pair_each_round_so_broker_drift_cancels() -> None:
    # The broker slows between rounds, and the slowdown landed inside round
    # 2, between its direct and proxy runs. Two of three rounds' pairs are
    # 0.9, so the median pair is 0.9; the median proxy rate over the median
    # direct rate, drawn from different rounds, reads 0.56.
    results = {
        "direct": _path([100, 90, 50]),
        "proxy": _path([90, 50, 45]),
        "proxy+trace:headers": _path([81, 45, 45]),
        REFERENCE: _path([100, 50, 50]),
    }
    out = summarise(results, BenchConfig(), memory=None)
    assert out["paths"]["proxy"]["consume"]["ratio"] == pytest.approx(0.9)
    assert out["paths"]["proxy"]["consume"]["records_per_s"] == 50  # rates stay medians
    assert out["checks"]["consume"] is True
    assert out["paths"]["proxy+trace:headers"]["cost_vs_proxy"]["consume"] == pytest.approx(0.1)
    assert out["proxy_vs_reference"]["consume"] == pytest.approx(0.9)
    assert "median over rounds of each round's pair" in format_table(out)


def test_tracing_cpu_cost_pairs_each_round_per_record() -> None:
    # CPU per record: plain 1.0, 1.0, 2.0 us; traced 1.2, 1.0, 2.2 us -> pairs +20 %, 0 %, +10 %.
    results = {
        "direct": _path([100, 100, 100]),
        "proxy": _path([100, 100, 100], cpu_s=[100e-6, 100e-6, 200e-6]),
        "proxy+trace:records": _path([100, 100, 100], cpu_s=[120e-6, 100e-6, 220e-6]),
    }
    out = summarise(results, BenchConfig(), memory=None)
    assert out["paths"]["proxy"]["proxy_cpu_us_per_record"]["consume"] == pytest.approx(1.0)
    assert out["paths"]["proxy+trace:records"]["cpu_cost_vs_proxy"]["consume"] == pytest.approx(0.1)
    assert "proxy_cpu_us_per_record" not in out["paths"]["direct"]
    assert "proxy CPU per record vs the plain proxy (records): produce 1 KiB +10.0%" in format_table(out)


def test_a_round_short_of_a_path_is_an_error_not_a_silent_pairing() -> None:
    results = {"direct": _path([100, 90]), "proxy": _path([90])}
    with pytest.raises(ValueError):
        summarise(results, BenchConfig(), memory=None)


@needs_haproxy
def test_tls_reference_clients_only_learn_haproxy(tmp_path) -> None:
    from kproxy.bench.tls import haproxy_tls_path, make_pki

    pki = make_pki(tmp_path / "pki")
    with haproxy_tls_path(tmp_path, pki) as bootstrap:
        settings = {"bootstrap.servers": bootstrap, "security.protocol": "SSL", "ssl.ca.location": str(pki.ca)}
        metadata = AdminClient(settings).list_topics(timeout=15)
        advertised = {f"{b.host}:{b.port}" for b in metadata.brokers.values()}
    assert advertised == {bootstrap}


@needs_haproxy
def test_bench_tls_measures_every_path_over_tls(tmp_path) -> None:
    out = tmp_path / "bench.json"
    work = tmp_path / "work"
    run = subprocess.run(
        [sys.executable, "-m", "kproxy", "bench", "--tls", "--reference", "--rounds", "1", "--batched-records",
         "3000", "--small-records", "1000", "--latency-seconds", "0.5", "--consume-passes", "1",
         "--out", str(out), "--work-dir", str(work)],
        capture_output=True, text=True, timeout=240,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["paths"]) == {"direct", "proxy", "haproxy"}
    assert result["config"]["tls"] is True and "memory" not in result
    # Every client spoke SSL, so every path that moved records spoke TLS to its clients.
    for name, path in result["paths"].items():
        assert path["consume"]["records_per_s"] > 0, name
