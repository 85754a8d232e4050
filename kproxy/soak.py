"""The soak: a long run under load and rotating faults, with every request accounted for.

A real `kproxy run` (tracing at level headers) in front of a broker; real
confluent-kafka producers and consumers keep about `connections` client
connections busy; the rule file is rewritten every `rotate_s` seconds with
the next fault action, so over the run every action takes a turn while the
proxy reloads under traffic. The proxy's RSS and open descriptors are sampled
throughout. At the end the proxy is stopped with SIGTERM and its trace read
back: every traced request must have an outcome (answered, unanswered by
design, or listed by a close event), and the result says how many of each.

docs/reliability.md describes the run and holds the figures of the last one.
"""

from __future__ import annotations

import json
import os
import signal
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from kproxy.obs.accounting import account
from kproxy.obs.trace_files import iter_trace_events

# One rule per phase, cycling. Each stays occasional (every/probability) so
# clients keep working between the faults, and each action appears at least
# once in a cycle. Producers send acks=all: the accounting needs no acks=0.
PHASES: list[tuple[str, dict[str, Any]]] = [
    ("delay", {"match": {"api": "produce", "probability": 0.2}, "action": {"type": "delay", "ms": 200, "jitter_ms": 100}}),
    ("duplicate", {"match": {"api": "produce", "every": 10}, "action": {"type": "duplicate", "copies": 1, "spacing_ms": 20}}),
    ("drop", {"match": {"api": "produce", "every": 200}, "action": {"type": "drop"}}),
    ("drop_response", {"match": {"api": "produce", "every": 200}, "action": {"type": "drop_response"}}),
    ("respond", {"match": {"api": "produce", "every": 20}, "action": {"type": "respond", "error": "NOT_LEADER_OR_FOLLOWER"}}),
    ("replace_error", {"match": {"api": "produce", "every": 20}, "action": {"type": "replace_error", "error": "REQUEST_TIMED_OUT"}}),
    ("disconnect", {"match": {"api": "fetch", "every": 150}, "action": {"type": "disconnect"}}),
    ("hold", {"match": {"api": "produce", "every": 50}, "action": {"type": "hold", "until": "client_disconnect", "timeout_ms": 1500, "ghost": True}}),
    ("rewrite", {"match": {"api": "fetch", "every": 10}, "action": {"type": "rewrite", "field": "fetch_stale_high_watermark", "lag": 1}}),
    ("disconnect_after", {"match": {"api": "produce", "every": 150}, "action": {"type": "disconnect", "when": "after"}}),
    ("healthy", {}),
]


# Each producer sends a message this often: the load is what the proxy should
# carry on a shared 2-core machine without the broker falling behind.
SEND_INTERVAL_S = 0.2


def rule_file_text(phase: int, seed: int = 22) -> tuple[str, str]:
    """The rule file of a phase number (cycling through PHASES), and its action's name."""
    name, rule = PHASES[phase % len(PHASES)]
    rules = [{"id": f"soak-{phase}-{name}", **rule}] if rule else []
    return json.dumps({"version": 1, "seed": seed, "rules": rules}, indent=1), name


@dataclass
class Sample:
    t: float
    rss_kib: int
    fds: int
    client_connections: int
    cpu_s: float = 0.0  # the proxy's CPU time so far (user + system)
    load1: float = 0.0  # the machine's 1-minute load average
    # Requests in flight to the brokers: at the sample, and the most seen since the last
    # sample (the admin API's /debug/memory, read every second).
    in_flight: int = -1
    in_flight_max: int = -1
    # Requests the proxy holds: in flight, or answered and waiting for an earlier one's turn.
    exchanges: int = -1
    exchanges_max: int = -1
    # The most held on one connection since the last sample, and the connections paused at the
    # bound (--max-outstanding-requests) at the sample.
    exchanges_one_connection_max: int = -1
    paused_connections: int = -1
    # Trace events waiting for the writer at the sample, and the seconds the data path has
    # waited for room in its queue so far (its peaks are the other source of memory steps).
    trace_queue_depth: int = -1
    trace_backpressure_s: float = -1.0
    # Who holds the memory (kproxy.obs.memory): pymalloc's arenas (1 MiB each) and the
    # bytes in their blocks; glibc's bytes in use and free, main heap and threads' arenas.
    arenas: int = -1
    arenas_highwater: int = -1
    pymalloc_used_kib: int = -1
    glibc_used_kib: int = -1
    glibc_free_kib: int = -1
    glibc_thread_heaps_kib: int = -1
    # The cycle collector's full collections so far, and the objects they collected.
    gc_full_collections: int = -1
    gc_full_collected: int = -1
    # RSS by mapping (/proc/PID/smaps): the main heap, threads' glibc arenas, the other
    # anonymous mappings (pymalloc's arenas, large blocks, stacks), and files.
    rss_heap_kib: int = -1
    rss_thread_heaps_kib: int = -1
    rss_anon_kib: int = -1
    rss_file_kib: int = -1


@dataclass
class SoakResult:
    duration_s: float
    clients: int
    rotations: int
    actions: list[str]
    samples: list[Sample] = field(default_factory=list)
    accounting: dict[str, Any] = field(default_factory=dict)
    without_outcome: list[dict[str, Any]] = field(default_factory=list)
    events: int = 0
    closes_by_reason: dict[str, int] = field(default_factory=dict)
    client_errors: dict[str, int] = field(default_factory=dict)
    delivered: int = 0
    consumed: int = 0
    proxy_exit: int | None = None
    proxy_errors: list[str] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        rss = [s.rss_kib for s in self.samples]
        fds = [s.fds for s in self.samples]
        conns = [s.client_connections for s in self.samples]
        return {
            "duration_s": round(self.duration_s, 1),
            "clients": self.clients,
            "client_connections": {"median": sorted(conns)[len(conns) // 2] if conns else 0, "max": max(conns, default=0)},
            "rotations": self.rotations,
            "actions": self.actions,
            "rss_mib": {"first": _mib(rss[0]) if rss else None, "max": _mib(max(rss)) if rss else None,
                        "last": _mib(rss[-1]) if rss else None},
            "rss_mib_per_min_second_half": _round(rss_slope_mib_per_min(self.samples, self.duration_s / 2), 3),
            "fds": {"first": fds[0] if fds else None, "max": max(fds, default=None), "last": fds[-1] if fds else None},
            "proxy_cpu_share": round((self.samples[-1].cpu_s - self.samples[0].cpu_s)
                                     / max(self.samples[-1].t - self.samples[0].t, 1e-9), 2) if len(self.samples) > 1 else None,
            "load_average_median": sorted(s.load1 for s in self.samples)[len(self.samples) // 2] if self.samples else None,
            "trace_events": self.events,
            "requests": self.accounting,
            "closes_by_reason": self.closes_by_reason,
            "messages_delivered": self.delivered,
            "messages_consumed": self.consumed,
            "client_errors": self.client_errors,
            "proxy_exit": self.proxy_exit,
            "proxy_errors": self.proxy_errors[:10],
        }


def _mib(kib: int) -> float:
    return round(kib / 1024, 1)


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def rss_slope_mib_per_min(samples: list[Sample], since_s: float) -> float | None:
    """The least-squares slope of the proxy's RSS over the samples from `since_s` on, in MiB a minute.

    None with fewer than two such samples. A soak's memory is flat when this is
    near zero over its second half, after warm-up (docs/reliability.md).
    """
    points = [(s.t / 60, s.rss_kib / 1024) for s in samples if s.t >= since_s]
    if len(points) < 2:
        return None
    mean_t = sum(t for t, _ in points) / len(points)
    mean_r = sum(r for _, r in points) / len(points)
    spread = sum((t - mean_t) ** 2 for t, _ in points)
    if spread == 0:
        return None
    return sum((t - mean_t) * (r - mean_r) for t, r in points) / spread


def _proc_sample(pid: int) -> tuple[int, int, float]:
    """RSS (KiB), open descriptors and CPU seconds of a process."""
    rss = 0
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            rss = int(line.split()[1])
    stat = Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()
    cpu = (int(stat[11]) + int(stat[12])) / os.sysconf("SC_CLK_TCK")  # utime, stime
    return rss, len(list(Path(f"/proc/{pid}/fd").iterdir())), cpu


_THREAD_HEAP_ALIGN = 64 * 1024 * 1024  # glibc's HEAP_MAX_SIZE on 64-bit: a thread's arena starts aligned to it


def rss_by_mapping(pid: int) -> dict[str, int]:
    """The process's RSS (KiB) by kind of mapping: `heap`, `thread_heaps`, `anon` (the other anonymous ones), `file`.

    A thread's glibc arena is told by its shape: an anonymous mapping at a
    64 MiB boundary whose reserved rest (`---p`) ends 64 MiB further on.
    """
    try:
        text = Path(f"/proc/{pid}/smaps").read_text()
    except OSError:
        return {"heap": -1, "thread_heaps": -1, "anon": -1, "file": -1}
    maps: list[list[Any]] = []  # [start, end, perms, path, rss]
    for line in text.splitlines():
        head = line.split(maxsplit=5)
        if len(head) >= 5 and "-" in head[0] and not head[0].endswith(":"):
            start, end = (int(x, 16) for x in head[0].split("-"))
            maps.append([start, end, head[1], head[5] if len(head) > 5 else "", 0])
        elif line.startswith("Rss:") and maps:
            maps[-1][4] = int(line.split()[1])
    kinds = {"heap": 0, "thread_heaps": 0, "anon": 0, "file": 0}
    for i, (start, end, perms, path, rss) in enumerate(maps):
        if path == "[heap]":
            kind = "heap"
        elif path.startswith("/"):
            kind = "file"
        elif not path and start % _THREAD_HEAP_ALIGN == 0 and (
            end - start == _THREAD_HEAP_ALIGN
            or (i + 1 < len(maps) and maps[i + 1][0] == end and maps[i + 1][2] == "---p"
                and maps[i + 1][1] == start + _THREAD_HEAP_ALIGN)
        ):
            kind = "thread_heaps"
        else:
            kind = "anon"
        kinds[kind] += rss
    return kinds


def _debug_memory(admin_url: str, *, held_only: bool = False) -> dict[str, Any]:
    try:
        response = httpx.get(f"{admin_url}/debug/memory{'?held' if held_only else ''}", timeout=5)
        return response.json() if response.status_code == 200 else {}
    except (httpx.HTTPError, ValueError):
        return {}


def _scraped(admin_url: str) -> tuple[int, int, float]:
    """From /metrics: client connections open, trace events waiting for the writer, and the seconds
    the data path has waited for room in the writer's queue (-1 where the scrape failed)."""
    from prometheus_client.parser import text_string_to_metric_families

    connections, queued, waited = 0, -1, -1.0
    try:
        response = httpx.get(f"{admin_url}/metrics", timeout=5)
        if response.status_code != 200:
            return -1, -1, -1.0
        for family in text_string_to_metric_families(response.text):
            for sample in family.samples:
                if sample.name == "kproxy_connections_open" and sample.labels.get("side") == "client":
                    connections = int(sample.value)
                elif sample.name == "kproxy_trace_queue_depth":
                    queued = int(sample.value)
                elif sample.name == "kproxy_trace_backpressure_seconds_total":
                    waited = sample.value
    except (httpx.HTTPError, ValueError):  # a proxy going down answers with an error page, or not at all
        return -1, -1, -1.0
    return connections, queued, waited


class _Clients:
    """Producers and consumers on their own threads until stopped."""

    def __init__(self, bootstrap: str, topic: str, clients: int, partitions: int) -> None:
        self.bootstrap = bootstrap
        self.topic = topic
        self.partitions = partitions
        self.stop = threading.Event()
        self.errors: Counter[str] = Counter()
        self.delivered = 0
        self.consumed = 0
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self._producer if i % 2 == 0 else self._consumer, args=(i,), daemon=True)
            for i in range(clients)
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()
            time.sleep(0.02)  # a gentler start than all at once

    def join(self, timeout: float) -> None:
        self.stop.set()
        deadline = time.monotonic() + timeout
        for t in self.threads:
            t.join(max(0.1, deadline - time.monotonic()))

    def _error(self, err: Any) -> None:
        name = err.name() if hasattr(err, "name") else str(err)
        with self.lock:
            self.errors[name] += 1

    def _producer(self, n: int) -> None:
        from confluent_kafka import Producer

        def delivered(err: Any, msg: Any) -> None:
            if err is not None:
                self._error(err)
            else:
                with self.lock:
                    self.delivered += 1

        producer = Producer({
            "bootstrap.servers": self.bootstrap, "client.id": f"soak-producer-{n}", "acks": "all",
            "linger.ms": 5, "message.timeout.ms": 30000, "request.timeout.ms": 5000, "retry.backoff.ms": 100,
            "log_level": 0, "error_cb": self._error,
        })
        i = 0
        while not self.stop.is_set():
            try:
                producer.produce(self.topic, key=b"%d" % (n % 16), value=b"%d-%d" % (n, i), on_delivery=delivered)
            except BufferError:
                producer.poll(0.1)
                continue
            i += 1
            producer.poll(SEND_INTERVAL_S)
        producer.flush(10)

    def _consumer(self, n: int) -> None:
        from confluent_kafka import OFFSET_END, Consumer, TopicPartition

        consumer = Consumer({
            "bootstrap.servers": self.bootstrap, "client.id": f"soak-consumer-{n}", "group.id": f"soak-{n}",
            "enable.auto.commit": False, "fetch.wait.max.ms": 500, "log_level": 0, "error_cb": self._error,
        })
        # From the end: each consumer reads what is produced during the run, not the
        # whole log again after every reconnect.
        # One partition each, as a group would share them out.
        consumer.assign([TopicPartition(self.topic, n // 2 % self.partitions, OFFSET_END)])
        while not self.stop.is_set():
            msg = consumer.poll(0.5)
            if msg is None:
                continue
            if msg.error():
                self._error(msg.error())
            else:
                with self.lock:
                    self.consumed += 1
        consumer.close()


def run_soak(
    work_dir: Path,
    *,
    bootstrap: str | None = None,
    broker_kind: str = "tansu",
    duration_s: float = 600.0,
    connections: int = 100,
    rotate_s: float = 30.0,
    sample_s: float = 5.0,
    partitions: int = 4,
    progress: Callable[[str], None] = lambda line: None,
) -> SoakResult:
    """Run the soak (starting a `broker_kind` broker unless `bootstrap` is given); files go to work_dir."""
    from kproxy.brokers import start_broker
    from kproxy.proxy_process import start_proxy

    work_dir.mkdir(parents=True, exist_ok=True)
    broker = None
    if bootstrap is None:
        broker = start_broker(kind=broker_kind, log_path=work_dir / "broker.log")
        bootstrap = broker.bootstrap
    rules = work_dir / "soak-rules.yaml"  # JSON, which is YAML
    rules.write_text(rule_file_text(len(PHASES) - 1)[0])  # start healthy
    traces = work_dir / "traces"
    proxy = start_proxy(bootstrap, "--traces", str(traces), "--rules", str(rules), log_path=work_dir / "kproxy.log")
    topic = f"soak-{uuid.uuid4().hex[:8]}"
    # Measured here: a consumer holds two connections (bootstrap and broker), a producer one.
    clients = max(2, round(connections / 1.5))
    result = SoakResult(duration_s=duration_s, clients=clients, rotations=0, actions=[])
    try:
        _create_topic(proxy.bootstrap, topic, partitions)
        workers = _Clients(proxy.bootstrap, topic, clients, partitions)
        start = time.monotonic()
        workers.start()
        # Samples are taken on a thread of their own: under load they take seconds,
        # and the rotations must keep their pace.
        sampler = threading.Thread(
            target=_sample_until, args=(proxy, start, start + duration_s, sample_s, result, progress), daemon=True)
        sampler.start()
        next_rotation, phase = start, 0
        while (now := time.monotonic()) < start + duration_s:
            if now >= next_rotation:
                text, name = rule_file_text(phase)
                rules.write_text(text)
                result.actions.append(name)
                result.rotations += 1
                phase += 1
                next_rotation += rotate_s
            time.sleep(0.2)
            if not proxy.alive():
                raise RuntimeError(f"kproxy died during the soak:\n{proxy.log_text()[-3000:]}")
        result.duration_s = time.monotonic() - start
        sampler.join(30)
        workers.join(30)
        result.client_errors = dict(workers.errors)
        result.delivered, result.consumed = workers.delivered, workers.consumed
    finally:
        result.proxy_exit = proxy.stop(signal.SIGTERM, timeout=60)
        if broker is not None:
            broker.stop()
    log = proxy.log_text()
    result.proxy_errors = [line for line in log.splitlines() if "internal error" in line or "Traceback" in line]
    result.events, accounted, result.closes_by_reason = account_traces(traces)
    result.accounting = accounted.summary()
    result.without_outcome = accounted.without_outcome
    (work_dir / "soak.json").write_text(json.dumps(
        {**result.summary(), "samples": [s.__dict__ for s in result.samples],
         "without_outcome_sample": result.without_outcome[:20]}, indent=1))
    return result


def _sample_until(proxy: Any, start: float, end: float, sample_s: float, result: SoakResult,
                  progress: Callable[[str], None]) -> None:
    """Sample the proxy every `sample_s` until `end`, and peek at the requests it holds every second between."""
    next_sample = start
    in_flight_max = exchanges_max = one_connection_max = -1
    while (now := time.monotonic()) < end and proxy.alive():
        if now < next_sample:
            peek = _debug_memory(proxy.admin_url, held_only=True)
            in_flight_max = max(in_flight_max, peek.get("in_flight", -1))
            exchanges_max = max(exchanges_max, peek.get("exchanges", -1))
            one_connection_max = max(one_connection_max, peek.get("exchanges_one_connection", -1))
            time.sleep(max(0.0, min(1.0, next_sample - time.monotonic())))
            continue
        try:
            rss, fds, cpu = _proc_sample(proxy.process.pid)
        except OSError:  # the proxy has just exited: the soak's loop says so
            return
        conns, trace_queued, trace_waited = _scraped(proxy.admin_url)
        load1 = os.getloadavg()[0]
        mem = _debug_memory(proxy.admin_url)
        pym, glibc, heaps = mem.get("pymalloc", {}), mem.get("glibc", {}), mem.get("glibc_heaps", [])
        by_mapping = rss_by_mapping(proxy.process.pid)
        in_flight, exchanges = mem.get("in_flight", -1), mem.get("exchanges", -1)
        sample = Sample(
            round(now - start, 1), rss, fds, conns, cpu, load1,
            in_flight=in_flight, in_flight_max=max(in_flight_max, in_flight),
            exchanges=exchanges, exchanges_max=max(exchanges_max, exchanges),
            exchanges_one_connection_max=max(one_connection_max, mem.get("exchanges_one_connection", -1)),
            paused_connections=mem.get("paused_connections", -1),
            trace_queue_depth=trace_queued, trace_backpressure_s=round(trace_waited, 1),
            arenas=pym.get("arenas_allocated_current", -1), arenas_highwater=pym.get("arenas_highwater_mark", -1),
            pymalloc_used_kib=pym.get("bytes_in_allocated_blocks", -1024) // 1024,
            glibc_used_kib=glibc.get("in_use_bytes", -1024) // 1024,
            glibc_free_kib=glibc.get("free_bytes", -1024) // 1024,
            glibc_thread_heaps_kib=sum(h["system_bytes"] for h in heaps if h["nr"] != 0) // 1024 if heaps else -1,
            gc_full_collections=mem.get("gc", {}).get("collections", [-1] * 3)[2],
            gc_full_collected=mem.get("gc", {}).get("collected", [-1] * 3)[2],
            rss_heap_kib=by_mapping["heap"], rss_thread_heaps_kib=by_mapping["thread_heaps"],
            rss_anon_kib=by_mapping["anon"], rss_file_kib=by_mapping["file"],
        )
        in_flight_max = exchanges_max = one_connection_max = -1
        result.samples.append(sample)
        phase = result.actions[-1] if result.actions else "-"
        progress(f"{now - start:6.0f}s  rss {rss / 1024:6.1f} MiB  fds {fds:5d}  client connections {conns:4d}  "
                 f"proxy cpu {cpu:7.1f}s  load {load1:5.1f}  phase {phase}  "
                 f"in flight {sample.in_flight:5d} (max {sample.in_flight_max:5d})  held {sample.exchanges:5d} "
                 f"(max {sample.exchanges_max:5d}, {sample.exchanges_one_connection_max:4d} on one connection, "
                 f"{sample.paused_connections:3d} paused)  trace queue {trace_queued:5d} "
                 f"(waited {trace_waited:6.1f}s)  arenas {sample.arenas:3d}  "
                 f"pymalloc {sample.pymalloc_used_kib / 1024:5.1f}  gc2 {sample.gc_full_collections} "
                 f"{sample.gc_full_collected}  glibc {sample.glibc_used_kib / 1024:5.1f}"
                 f"+{sample.glibc_free_kib / 1024:4.1f} free  rss heap/threads/anon/file "
                 f"{sample.rss_heap_kib / 1024:5.1f}/{sample.rss_thread_heaps_kib / 1024:4.1f}/"
                 f"{sample.rss_anon_kib / 1024:5.1f}/{sample.rss_file_kib / 1024:5.1f} MiB")
        next_sample += sample_s


# What the accounting reads of an event. A 30-minute soak in front of Apache Kafka
# traces millions of requests: kept whole, they took 12 GB to read back.
_ACCOUNTED_FIELDS = ("direction", "proxy_id", "conn_id", "correlation_id", "copy", "outcome", "close_reason",
                     "in_flight", "api", "ts", "repeats", "first_correlation_id")


def account_traces(traces: Path) -> tuple[int, Any, dict[str, int]]:
    """Read a trace directory once: its event count, every request's outcome, and closes by reason."""
    count = 0
    closes: Counter[str] = Counter()

    def slim() -> Any:
        nonlocal count
        for event in iter_trace_events(traces, records=False):  # counts and outcomes: no records needed
            count += event.get("repeats") or 1  # a folded idle Fetch event stands for that many
            if event.get("direction") == "close":
                closes[event.get("close_reason") or "unknown"] += 1
            yield {k: event[k] for k in _ACCOUNTED_FIELDS if k in event}

    accounted = account(slim())
    return count, accounted, dict(closes)


def _create_topic(bootstrap: str, topic: str, partitions: int) -> None:
    from confluent_kafka.admin import AdminClient, NewTopic

    admin = AdminClient({"bootstrap.servers": bootstrap, "log_level": 0})
    for future in admin.create_topics([NewTopic(topic, partitions, 1)], operation_timeout=15).values():
        future.result(20)
