#!/usr/bin/env python3
"""What `/metrics` scrapes cost the Kafka data path: round-trip p50 with and without scrapes.

Starts an embedded broker (Tansu) and `kproxy run` in front of it, warms the
proxy's metrics up with traffic (so /metrics is as large as in a real run),
then alternates phases of PHASE seconds:

- `none`: no scrapes;
- `scrapes`: SCRAPERS concurrent scrapers (threads of a separate process, so
  they do not share the measuring process's GIL) each GET /metrics in a loop.

In every phase one confluent-kafka producer (acks=1, linger.ms=0) produces a
record and flushes it every 20 ms; its round trip through the proxy is
measured. Printed per phase kind: round-trip p50 / p99 / max, scrapes served
and their p50 latency, the proxy's CPU seconds per phase, and the machine's
1-minute load average at each phase's end.

    .venv/bin/python scripts/metrics-scrape-cost.py [ROUNDS] [PHASE_SECONDS] [SCRAPERS]

Defaults: 3 rounds of 15 s phases, 16 scrapers.
"""

from __future__ import annotations

import multiprocessing
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
from confluent_kafka import OFFSET_BEGINNING, Consumer, Producer, TopicPartition

from kproxy.bench.workloads import create_topic
from kproxy.brokers import start_broker
from kproxy.proxy_process import start_proxy


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def load1() -> float:
    return os.getloadavg()[0]


def scrape_loop(url: str, scrapers: int, stop: multiprocessing.synchronize.Event,
                results: multiprocessing.Queue) -> None:  # type: ignore[name-defined]
    """SCRAPERS threads GET url in a loop until `stop`; puts (count, p50 ms, bytes of the last)."""
    latencies: list[float] = []
    size = [0]
    lock = threading.Lock()

    def one() -> None:
        with httpx.Client(timeout=30) as client:
            while not stop.is_set():
                started = time.perf_counter()
                body = client.get(url).content
                took = (time.perf_counter() - started) * 1000
                with lock:
                    latencies.append(took)
                    size[0] = len(body)

    threads = [threading.Thread(target=one, daemon=True) for _ in range(scrapers)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    results.put((len(latencies), statistics.median(latencies) if latencies else 0.0, size[0]))


def round_trips(bootstrap: str, topic: str, seconds: float) -> list[float]:
    """Produce-and-flush round trips (ms), one every 20 ms, for `seconds`."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": 1, "linger.ms": 0, "enable.idempotence": False})
    producer.produce(topic, b"warm")
    producer.flush(10)
    out = []
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        started = time.perf_counter()
        producer.produce(topic, b"x" * 100)
        if producer.flush(10):
            raise RuntimeError("a record was not delivered within 10 s")
        out.append((time.perf_counter() - started) * 1000)
        time.sleep(0.02)
    return out


def warm_up(bootstrap: str, topic: str) -> None:
    """Traffic through several APIs, so the per-API series exist as in a real run."""
    producer = Producer({"bootstrap.servers": bootstrap, "acks": "all"})
    for i in range(200):
        producer.produce(topic, b"%d" % i)
    producer.flush(20)
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"warm-{os.getpid()}",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    deadline = time.monotonic() + 10
    seen = 0
    while seen < 200 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is not None and not msg.error():
            seen += 1
    consumer.close()


def pct(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    rounds = int(sys.argv[1]) if len(sys.argv) > 1 else 3
    phase = float(sys.argv[2]) if len(sys.argv) > 2 else 15.0
    scrapers = int(sys.argv[3]) if len(sys.argv) > 3 else 16
    work = Path(tempfile.mkdtemp(prefix="kproxy-scrape-cost-"))
    broker = start_broker(log_path=work / "broker.log")
    try:
        proxy = start_proxy(broker.bootstrap, "--log-level", "warning", log_path=work / "kproxy.log")
        try:
            run(proxy, rounds, phase, scrapers)
        finally:
            proxy.stop()
    finally:
        broker.stop()


def run(proxy, rounds: int, phase: float, scrapers: int) -> None:
    topic = create_topic(proxy.bootstrap)
    warm_up(proxy.bootstrap, topic)
    url = f"{proxy.admin_url}/metrics"
    first = httpx.get(url, timeout=30)
    print(f"/metrics: {len(first.content)} bytes; load average at start {os.getloadavg()}", file=sys.stderr)
    results: dict[str, dict[str, list]] = {kind: {"rt": [], "cpu": [], "load": [], "scrapes": []}
                                           for kind in ("none", "scrapes")}
    ctx = multiprocessing.get_context("spawn")
    for rnd in range(rounds):
        for kind in (("none", "scrapes") if rnd % 2 == 0 else ("scrapes", "none")):
            stop, queue, child = ctx.Event(), ctx.Queue(), None
            if kind == "scrapes":
                child = ctx.Process(target=scrape_loop, args=(url, scrapers, stop, queue))
                child.start()
                time.sleep(1.0)  # the scrapers are running before the measurement starts
            cpu_before = cpu_seconds(proxy.process.pid)
            rt = round_trips(proxy.bootstrap, topic, phase)
            cpu = cpu_seconds(proxy.process.pid) - cpu_before
            load = load1()
            scrape = None
            if child is not None:
                stop.set()
                scrape = queue.get(timeout=60)
                child.join(30)
            bucket = results[kind]
            bucket["rt"].extend(rt)
            bucket["cpu"].append(cpu)
            bucket["load"].append(load)
            if scrape:
                bucket["scrapes"].append(scrape)
            print(f"round {rnd + 1}/{rounds} {kind:8}: p50 {statistics.median(rt):.2f} ms, p99 {pct(rt, 0.99):.2f} ms,"
                  f" max {max(rt):.2f} ms ({len(rt)} round trips); proxy CPU {cpu:.2f} s in {phase:.0f} s;"
                  f" load {load:.2f}" + (f"; {scrape[0]} scrapes, p50 {scrape[1]:.1f} ms, {scrape[2]} bytes"
                                          if scrape else ""), file=sys.stderr, flush=True)
    print(f"{'phase':10} {'p50 ms':>8} {'p99 ms':>8} {'max ms':>8} {'proxy CPU s/phase':>18} {'load1':>12}"
          f" {'scrapes/s':>10} {'scrape p50 ms':>14}")
    for kind, bucket in results.items():
        rt = bucket["rt"]
        scrapes = bucket["scrapes"]
        per_s = sum(s[0] for s in scrapes) / (phase * len(scrapes)) if scrapes else 0.0
        scrape_p50 = statistics.median(s[1] for s in scrapes) if scrapes else 0.0
        loads = bucket["load"]
        print(f"{kind:10} {statistics.median(rt):>8.2f} {pct(rt, 0.99):>8.2f} {max(rt):>8.2f}"
              f" {statistics.median(bucket['cpu']):>18.2f} {min(loads):>5.1f}-{max(loads):<6.1f}"
              f" {per_s:>10.1f} {scrape_p50:>14.1f}")


if __name__ == "__main__":
    main()
