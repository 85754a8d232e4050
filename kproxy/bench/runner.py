"""Run the workloads directly and through the proxy, alternating, and compare.

Every round runs each path (direct, proxy, and proxy with tracing when asked)
in an order that alternates between rounds, so warm-up and drift hit both
sides alike. Figures are the median over rounds. A ratio is the median over
rounds of that round's pair (proxy / direct measured seconds apart), not a
ratio of medians: the broker slows as it holds more data, by a third over a
run, and a ratio of medians taken from different rounds carries that drift.
"""

from __future__ import annotations

import contextlib
import socket
import statistics
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kproxy.bench import workloads
from kproxy.bench.reference import haproxy_path
from kproxy.bench.rss import rss_bytes
from kproxy.brokers import start_broker
from kproxy.protocol.endpoints import parse_endpoint
from kproxy.proxy_process import start_proxy

# Targets from the proxy's performance contract (docs/performance.md).
THROUGHPUT_TARGETS = {"batched_produce": 0.90, "consume": 0.90, "unbatched_produce": 0.85}
ADDED_P99_TARGET_MS = 1.0
TRACING_COST_TARGET = 0.05  # headers-level tracing: at most 5% of proxy throughput
REFERENCE = "haproxy"  # the reference path's name in results


@dataclass
class BenchConfig:
    bootstrap: str | None = None  # None: start an embedded broker of kind `broker`
    broker: str = "tansu"
    rounds: int = 3
    batched_records: int = 40_000  # 1 KiB each
    consume_passes: int = 12  # the consume run reads the batched records this many times
    small_records: int = 40_000  # 100 B each, linger.ms=0
    rate: int = 500  # records/s for the latency run
    latency_seconds: float = 4.0
    trace_levels: tuple[str, ...] = ()  # extra proxies with --traces at these levels
    reference: bool = False  # also run through HAProxy (TCP mode) in front of a second embedded broker
    # TLS on every path: the broker behind an HAProxy TLS terminator, kproxy with TLS on both sides,
    # and the reference HAProxy ending and opening TLS as kproxy does (kproxy/bench/tls.py).
    tls: bool = False
    memory_check: bool = True
    work_dir: Path | None = None


@dataclass
class PathResult:
    samples: dict[str, list[workloads.Sample]] = field(default_factory=dict)
    # kproxy paths: CPU seconds the proxy process (event loop and trace writer) spent per run.
    cpu_s: dict[str, list[float]] = field(default_factory=dict)

    def add(self, workload: str, sample: workloads.Sample, cpu_s: float | None = None) -> None:
        self.samples.setdefault(workload, []).append(sample)
        if cpu_s is not None:
            self.cpu_s.setdefault(workload, []).append(cpu_s)

    def cpu_us_per_record(self, workload: str) -> list[float]:
        return [c / s.records * 1e6 if s.records else 0.0 for c, s in zip(self.cpu_s.get(workload, []), self.samples[workload])]

    def paired_cpu_ratio(self, other: PathResult, workload: str) -> float | None:
        """Median over rounds of this path's proxy CPU per record over `other`'s in the same round."""
        mine, theirs = self.cpu_us_per_record(workload), other.cpu_us_per_record(workload)
        pairs = [a / b for a, b in zip(mine, theirs, strict=True) if b > 0] if mine and theirs else []
        return statistics.median(pairs) if pairs else None

    def median_rate(self, workload: str) -> float:
        return statistics.median(s.records_per_s for s in self.samples[workload])

    def median_mib(self, workload: str) -> float:
        return statistics.median(s.mib_per_s for s in self.samples[workload])

    def rates(self, workload: str) -> list[float]:
        return [s.records_per_s for s in self.samples[workload]]

    def paired_ratio(self, other: PathResult, workload: str) -> float:
        """Median over rounds of this path's rate over `other`'s in the same round."""
        return statistics.median(a / b for a, b in zip(self.rates(workload), other.rates(workload), strict=True))

    def latency_percentiles(self) -> dict[str, float]:
        lat = sorted(x for s in self.samples.get("latency", []) for x in s.latencies_ms)
        if not lat:
            return {}
        pick = lambda q: lat[min(len(lat) - 1, int(q * len(lat)))]  # noqa: E731
        return {"p50": pick(0.50), "p90": pick(0.90), "p99": pick(0.99), "max": lat[-1]}


def memory_check(proxy_bootstrap: str, pid: int, seconds: float = 6.0) -> dict[str, Any]:
    """Proxy RSS with 100 idle and 10 busy connections: it must level off, not grow."""
    address = parse_endpoint(proxy_bootstrap, default_host=None)
    idle = [socket.create_connection((address.host, address.port), timeout=10) for _ in range(100)]
    topic = workloads.create_topic(proxy_bootstrap)
    before = rss_bytes(pid)
    samples: list[int] = []
    stop = time.monotonic() + seconds

    def busy() -> None:
        while time.monotonic() < stop:
            workloads.produce(proxy_bootstrap, topic, 2000, 1024, linger_ms=5, batch_bytes=262144)

    threads = [threading.Thread(target=busy, daemon=True) for _ in range(10)]
    for t in threads:
        t.start()
    half = None
    while any(t.is_alive() for t in threads):
        samples.append(rss_bytes(pid))
        if half is None and time.monotonic() > stop - seconds / 2:
            half = samples[-1]
        time.sleep(0.2)
    for s in idle:
        s.close()
    peak = max(samples) if samples else before
    return {
        "idle_connections": 100,
        "busy_connections": 10,
        "rss_before_mib": before / 1048576,
        "rss_half_mib": (half or peak) / 1048576,
        "rss_peak_mib": peak / 1048576,
        "rss_after_mib": rss_bytes(pid) / 1048576,
    }


@contextlib.contextmanager
def _environment(config: BenchConfig) -> Iterator[tuple[str, dict[str, Any]]]:
    work = Path(config.work_dir or tempfile.mkdtemp(prefix="kproxy-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as stack:
        tls_args: tuple[str, ...] = ()
        pki = None
        if config.tls:
            from kproxy.bench.tls import make_pki, tls_broker

            pki = make_pki(work / "pki")
            bootstrap = stack.enter_context(tls_broker(work, pki)).bootstrap
            tls_args = ("--tls-cert", str(pki.proxy.cert), "--tls-key", str(pki.proxy.key),
                        "--upstream-tls", "--upstream-ca", str(pki.ca))
            workloads.set_client_security({"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)})
            stack.callback(workloads.set_client_security, {})
        elif config.bootstrap is None:
            broker = start_broker(kind=config.broker, log_path=work / "broker.log")
            stack.callback(broker.stop)
            bootstrap = broker.bootstrap
        else:
            bootstrap = config.bootstrap
        proxies: dict[str, Any] = {}
        plain = start_proxy(bootstrap, "--log-level", "warning", *tls_args, log_path=work / "proxy.log", admin=False)
        stack.callback(plain.stop)
        proxies["proxy"] = plain
        for level in config.trace_levels:
            traced = start_proxy(
                bootstrap, "--log-level", "warning", "--traces", str(work / f"traces-{level}"),
                "--trace-level", level, *tls_args, log_path=work / f"proxy-{level}.log", admin=False,
            )
            stack.callback(traced.stop)
            proxies[f"proxy+trace:{level}"] = traced
        references: dict[str, str] = {}
        if config.reference and pki is not None:
            from kproxy.bench.tls import haproxy_tls_path

            references[REFERENCE] = stack.enter_context(haproxy_tls_path(work, pki))
        elif config.reference:
            references[REFERENCE] = stack.enter_context(haproxy_path(work))
        yield bootstrap, proxies, references


# A tracing proxy composes and writes a batch up to its flush interval (at
# most 0.2 s) after the batch's first event: its CPU per record is read this
# long after each run, on every proxy path alike (an idle proxy spends about
# 1 ms of CPU a second). Read at once, a run's last batch was counted to the
# next run, or to none.
TRACE_SETTLE_S = 0.3


def process_cpu_s(pid: int) -> float:
    """CPU seconds a process has run, all its threads (scheduler nanoseconds: /proc/PID/stat counts 10 ms ticks)."""
    total = 0
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            total += int((task / "schedstat").read_text().split()[0])
        except (FileNotFoundError, ProcessLookupError):
            pass  # a thread that just ended
    return total / 1e9


def run_bench(config: BenchConfig, progress: Callable[[str], None] = lambda _: None) -> dict[str, Any]:
    with _environment(config) as (bootstrap, proxies, references):
        paths = {"direct": bootstrap, **{name: p.bootstrap for name, p in proxies.items()}, **references}
        results = {name: PathResult() for name in paths}
        names = list(paths)
        for rnd in range(config.rounds):
            order = names if rnd % 2 == 0 else list(reversed(names))
            for name in order:
                target = paths[name]
                progress(f"round {rnd + 1}/{config.rounds}: {name}")
                pid = proxies[name].process.pid if name in proxies else None
                result = results[name]

                def run(workload: str, job: Callable[[], workloads.Sample], pid: int | None = pid,
                        result: PathResult = result) -> None:
                    # CPU time, unlike a rate, barely moves with other jobs on a shared machine.
                    before = process_cpu_s(pid) if pid is not None else None
                    sample = job()
                    if pid is not None:
                        time.sleep(TRACE_SETTLE_S)  # the last flush batch's work is the run's too
                    result.add(workload, sample, process_cpu_s(pid) - before if before is not None else None)

                topic = workloads.create_topic(target)
                run("batched_produce", lambda: workloads.produce(target, topic, config.batched_records, 1024, 5, 1048576))
                run("consume", lambda: workloads.consume(target, topic, config.batched_records, config.consume_passes))
                small = workloads.create_topic(target)
                run("unbatched_produce", lambda: workloads.produce(target, small, config.small_records, 100, 0, 16384))
                run("latency", lambda: workloads.fixed_rate_latency(target, small, config.rate, config.latency_seconds))
        memory = None
        if config.memory_check:
            progress("memory: 100 idle + 10 busy connections")
            memory = memory_check(proxies["proxy"].bootstrap, proxies["proxy"].process.pid)
    return summarise(results, config, memory)


def summarise(results: dict[str, PathResult], config: BenchConfig, memory: dict[str, Any] | None) -> dict[str, Any]:
    direct = results["direct"]
    out: dict[str, Any] = {"config": {k: v for k, v in vars(config).items() if k != "work_dir"}, "paths": {}}
    for name, res in results.items():
        entry: dict[str, Any] = {}
        for workload in THROUGHPUT_TARGETS:
            entry[workload] = {
                "records_per_s": res.median_rate(workload),
                "mib_per_s": res.median_mib(workload),
                "ratio": res.paired_ratio(direct, workload),
                "rounds_records_per_s": res.rates(workload),
            }
        entry["latency_ms"] = res.latency_percentiles()
        out["paths"][name] = entry
    direct_p99 = out["paths"]["direct"]["latency_ms"].get("p99", 0.0)
    proxy = out["paths"]["proxy"]
    checks = {w: proxy[w]["ratio"] >= t for w, t in THROUGHPUT_TARGETS.items()}
    added = proxy["latency_ms"].get("p99", 0.0) - direct_p99
    out["added_p99_ms"] = added
    checks["added_p99"] = added <= ADDED_P99_TARGET_MS
    for name, res in results.items():
        if res.cpu_s:
            out["paths"][name]["proxy_cpu_us_per_record"] = {
                w: statistics.median(res.cpu_us_per_record(w)) for w in THROUGHPUT_TARGETS if res.cpu_s.get(w)
            }
            out["paths"][name]["rounds_proxy_cpu_s"] = {w: res.cpu_s[w] for w in res.cpu_s}
    for name in out["paths"]:
        if name.startswith("proxy+trace:"):
            cost = {w: 1.0 - results[name].paired_ratio(results["proxy"], w) for w in THROUGHPUT_TARGETS}
            out["paths"][name]["cost_vs_proxy"] = cost
            cpu = {w: results[name].paired_cpu_ratio(results["proxy"], w) for w in THROUGHPUT_TARGETS}
            out["paths"][name]["cpu_cost_vs_proxy"] = {w: r - 1.0 for w, r in cpu.items() if r is not None}
            if name.endswith(":headers"):
                checks["tracing_headers_cost"] = max(cost.values()) <= TRACING_COST_TARGET
    if REFERENCE in out["paths"]:
        ref = out["paths"][REFERENCE]
        out["proxy_vs_reference"] = {
            w: results["proxy"].paired_ratio(results[REFERENCE], w) for w in THROUGHPUT_TARGETS
        }
        out["reference_added_p99_ms"] = ref["latency_ms"].get("p99", 0.0) - direct_p99
    if memory is not None:
        out["memory"] = memory
        # Bounded: the second half of the busy period adds little to the first.
        checks["memory_bounded"] = memory["rss_peak_mib"] <= memory["rss_half_mib"] * 1.25 + 16
    out["checks"] = checks
    return out
