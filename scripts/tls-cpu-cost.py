#!/usr/bin/env python3
"""CPU a proxy spends per MiB (and per small record), over TLS and in plaintext: kproxy against HAProxy.

`kproxy bench --tls --reference` gives throughput ratios, which a busy
machine blurs (other work takes the cores the workload needs). The proxy
process's own CPU time per byte moved barely depends on that, so this
script measures it, for four paths in one run, paired per round:

- kproxy with TLS on both sides, in front of the broker behind an HAProxy TLS terminator;
- HAProxy ending and opening TLS the same way, in front of a second such broker;
- kproxy and HAProxy (TCP mode) in plaintext, each in front of its own embedded broker.

The same confluent-kafka workloads as `kproxy bench`: 1 KiB records batched
(acks=all), consuming them back, and 100 B records with linger.ms=0.
Usage: scripts/tls-cpu-cost.py [ROUNDS] (default 3). Needs Debian's haproxy and openssl.
"""

from __future__ import annotations

import contextlib
import os
import statistics
import sys
import tempfile
from pathlib import Path

from kproxy.bench import workloads
from kproxy.bench.reference import haproxy_path
from kproxy.bench.tls import haproxy_tls_path, make_pki, tls_broker
from kproxy.brokers import start_broker
from kproxy.proxy_process import start_proxy


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def haproxy_pid(config_name: str) -> int:
    """The HAProxy started with a config file of this name (the bench helpers start them)."""
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if "haproxy" in cmdline and config_name in cmdline:
                return int(entry.name)
    raise RuntimeError(f"no HAProxy running with {config_name}")


def measure(bootstrap: str, pid: int) -> tuple[float, float, float]:
    """(ms CPU per MiB produced batched, ms CPU per MiB consumed, us CPU per 100 B record produced unbatched)."""
    topic = workloads.create_topic(bootstrap)
    start = cpu_seconds(pid)
    batched = workloads.produce(bootstrap, topic, 20000, 1024, 5, 1048576)
    produced = cpu_seconds(pid)
    consumed = workloads.consume(bootstrap, topic, 20000, 4)
    after_consume = cpu_seconds(pid)
    small_topic = workloads.create_topic(bootstrap)
    before_small = cpu_seconds(pid)
    small = workloads.produce(bootstrap, small_topic, 10000, 100, 0, 16384)
    after_small = cpu_seconds(pid)
    mib = 1048576
    return (
        1000 * (produced - start) / (batched.bytes / mib),
        1000 * (after_consume - produced) / (consumed.bytes / mib),
        1e6 * (after_small - before_small) / small.records,
    )


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    work = Path(tempfile.mkdtemp(prefix="kproxy-tls-cpu-"))
    pki = make_pki(work / "pki")
    tls_client = {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca)}
    with contextlib.ExitStack() as stack:
        secured = stack.enter_context(tls_broker(work, pki))
        plain_broker = start_broker(log_path=work / "broker.log")
        stack.callback(plain_broker.stop)
        tls_args = ("--tls-cert", str(pki.proxy.cert), "--tls-key", str(pki.proxy.key),
                    "--upstream-tls", "--upstream-ca", str(pki.ca))
        kproxy_tls = start_proxy(secured.bootstrap, "--log-level", "warning", *tls_args, admin=False,
                                 log_path=work / "kproxy-tls.log")
        stack.callback(kproxy_tls.stop)
        kproxy_plain = start_proxy(plain_broker.bootstrap, "--log-level", "warning", admin=False,
                                   log_path=work / "kproxy-plain.log")
        stack.callback(kproxy_plain.stop)
        haproxy_tls = stack.enter_context(haproxy_tls_path(work, pki))
        haproxy_plain = stack.enter_context(haproxy_path(work))
        paths = {
            "kproxy, TLS": (kproxy_tls.bootstrap, kproxy_tls.process.pid, tls_client),
            "HAProxy, TLS": (haproxy_tls, haproxy_pid("haproxy-tls-reference-"), tls_client),
            "kproxy, plaintext": (kproxy_plain.bootstrap, kproxy_plain.process.pid, {}),
            "HAProxy, plaintext": (haproxy_plain, haproxy_pid(str(work / "haproxy.cfg")), {}),
        }
        results: dict[str, list[tuple[float, float, float]]] = {name: [] for name in paths}
        for rnd in range(rounds):
            order = list(paths) if rnd % 2 == 0 else list(reversed(paths))
            for name in order:
                bootstrap, pid, security = paths[name]
                workloads.set_client_security(security)
                results[name].append(measure(bootstrap, pid))
                print(f"round {rnd + 1}/{rounds}: {name} {results[name][-1]}", file=sys.stderr, flush=True)
    print(f"{'path':20} {'produce 1 KiB batched':>24} {'consume':>18} {'produce 100 B, linger 0':>26}")
    for name, rows in results.items():
        produce, consume, small = (statistics.median(row[i] for row in rows) for i in range(3))
        print(f"{name:20} {produce:>17.2f} ms/MiB {consume:>11.2f} ms/MiB {small:>16.1f} us/record")
    print(f"\nproxy process CPU, median over {rounds} rounds (HAProxy: the hop in front, not the broker's terminator)")


if __name__ == "__main__":
    main()
