"""What a tracing proxy leaves behind when it is killed or stopped under load.

A confluent-kafka producer sends continuously through a `records`-level
proxy. A SIGKILL mid-run must leave a trace that reads back up to the last
flushed event: no exception, well-formed events, no hole before the end, and
a torn last line skipped (JSON Lines here; segment files in
tests/test_trace_segments.py). A SIGTERM mid-run must lose nothing: every produce
the client saw acknowledged is in the trace, and the writer's own count of
written events is what a reader finds.
"""

from __future__ import annotations

import re
import signal
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kproxy.obs.trace_files import TraceFileError, iter_trace_events, trace_files
from kproxy.obs.trace_schema import FIELD_NAMES, SCHEMA_VERSION
from kproxy.obs.trace_segments import SegmentFile
from kproxy.proxy_process import ProxyProcess
from tests.fixtures.broker import create_topic

pytestmark = pytest.mark.timeout(60)

WRITTEN_LOG_LINE = re.compile(r"trace: (\d+) events written")
# The writer flushes every 100 ms; a delivery report older than this was surely flushed before a kill.
FLUSHED_BEFORE_KILL_S = 1.0


@dataclass(frozen=True)
class Delivery:
    offset: int
    value: str
    seen_at: float  # monotonic time the client got the report


@dataclass
class ContinuousProducer:
    """A producer thread sending one record after another until stopped; keeps its delivery reports."""

    bootstrap: str
    topic: str
    delivered: list[Delivery] = field(default_factory=list)
    failed: int = 0
    error: BaseException | None = None
    _stop: threading.Event = field(default_factory=threading.Event)
    _thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="continuous-producer", daemon=True)
        self._thread.start()

    def wait_for_deliveries(self, count: int, timeout: float = 15.0) -> None:
        deadline = time.monotonic() + timeout
        while len(self.delivered) < count:
            assert self.error is None, self.error
            assert time.monotonic() < deadline, f"only {len(self.delivered)} deliveries in {timeout}s"
            time.sleep(0.05)

    def stop(self) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join(15)
        assert not self._thread.is_alive(), "the producer thread did not stop"
        assert self.error is None, self.error

    def _on_delivery(self, err, msg) -> None:  # noqa: ANN001 - librdkafka callback
        if err is None:
            self.delivered.append(Delivery(msg.offset(), msg.value().decode(), time.monotonic()))
        else:
            self.failed += 1

    def _run(self) -> None:
        from confluent_kafka import Producer

        try:
            producer = Producer({
                "bootstrap.servers": self.bootstrap,
                "enable.idempotence": True,
                "acks": "all",
                "linger.ms": 2,
                "message.timeout.ms": 3000,
                "reconnect.backoff.max.ms": 200,
            })
            sequence = 0
            while not self._stop.is_set():
                try:
                    producer.produce(self.topic, key=b"k", value=str(sequence).encode(), partition=0,
                                     on_delivery=self._on_delivery)
                    sequence += 1
                except BufferError:
                    pass  # the proxy is gone and the queue filled up: keep serving callbacks
                producer.poll(0.002)
            producer.purge()
            producer.flush(2)
        except BaseException as exc:  # noqa: BLE001 - reported to the test thread
            self.error = exc


def traced_produce_responses(events: list[dict], topic: str) -> dict[int, str]:
    """offset -> value of every record in an error-free traced Produce response to topic."""
    acknowledged: dict[int, str] = {}
    for event in events:
        if event["api"] == "produce" and event["direction"] == "response":
            for part in event["partitions"] or ():
                if part["topic"] == topic and part["error_code"] == 0:
                    for record in part["records"]:
                        acknowledged[record["offset"]] = record["value"]
    return acknowledged


def check_well_formed(events: list[dict]) -> None:
    assert events, "the trace is empty"
    for event in events:
        assert set(event) <= set(FIELD_NAMES), set(event) - set(FIELD_NAMES)
        assert event["schema_version"] == SCHEMA_VERSION
        assert event["direction"] in ("request", "response", "close")
        if event["direction"] == "close":
            assert event["close_reason"] and isinstance(event["in_flight"], list)
            continue
        assert isinstance(event["conn_id"], int) and isinstance(event["correlation_id"], int)
        assert event["api"] and isinstance(event["mono_ns"], int)


def traced_producer(proxy_factory: Callable[..., ProxyProcess], broker, tmp_path: Path,
                    topic: str, fmt: str = "segments") -> tuple[ProxyProcess, ContinuousProducer, Path]:
    create_topic(broker.bootstrap, topic, 1)
    traces = tmp_path / "traces"
    proxy = proxy_factory("--traces", str(traces), "--trace-level", "records", "--trace-format", fmt)
    producer = ContinuousProducer(proxy.bootstrap, topic)
    producer.start()
    return proxy, producer, traces


def test_sigkill_leaves_a_trace_readable_up_to_the_last_flushed_event(
        proxy_factory, broker, tmp_path: Path, topic_name: str) -> None:
    # JSON Lines here; tests/test_trace_segments.py and test_trace_side_files.py kill one writing segments.
    proxy, producer, traces = traced_producer(proxy_factory, broker, tmp_path, topic_name, fmt="jsonl")
    producer.wait_for_deliveries(100)
    time.sleep(FLUSHED_BEFORE_KILL_S + 0.2)  # traffic keeps flowing; older reports are surely flushed
    killed_at = time.monotonic()
    assert proxy.stop(signal.SIGKILL) == -signal.SIGKILL
    producer.stop()

    events = list(iter_trace_events(traces))  # must not raise, torn last line or not
    check_well_formed(events)
    assert WRITTEN_LOG_LINE.search(proxy.log_text()) is None, "a killed proxy cannot have logged its count"
    traced = traced_produce_responses(events, topic_name)
    assert traced, "no Produce response was traced"
    # No hole before the last flushed event: one producer, one partition, offsets 0..max all traced.
    assert sorted(traced) == list(range(max(traced) + 1))
    settled = [d for d in producer.delivered if d.seen_at < killed_at - FLUSHED_BEFORE_KILL_S]
    assert len(settled) >= 100
    assert [d for d in settled if traced.get(d.offset) != d.value] == []

    # A kill in the middle of a write tears the last line: readers skip it and keep the rest.
    (trace_file,) = trace_files(traces)
    data = trace_file.read_bytes()
    complete = data[: data.rindex(b"\n") + 1]
    assert len(events) == complete.count(b"\n")
    last_line = complete.split(b"\n")[-2]
    torn_dir = tmp_path / "torn"
    torn_dir.mkdir()
    (torn_dir / trace_file.name).write_bytes(complete + last_line[: len(last_line) // 2])
    # The records are in the side file, written before the lines that point
    # at them: a kill mid-write can leave unreferenced bytes behind its end
    # (here half a batch), never a line pointing past it.
    side = trace_file.with_suffix(".records")
    side_data = side.read_bytes()
    referenced = [p for e in iter_trace_events(traces, records=False) for p in e["partitions"] or () if p["records_file"]]
    assert referenced and {p["records_file"] for p in referenced} == {side.name}
    assert all(p["records"] is None for p in referenced), "the proxy decoded records"
    assert max(p["records_offset"] + p["records_length"] for p in referenced) <= len(side_data)
    (torn_dir / side.name).write_bytes(side_data + side_data[:30])
    assert list(iter_trace_events(torn_dir)) == events
    # A line pointing past its side file's end is corruption, named with the file.
    (torn_dir / side.name).write_bytes(side_data[: max(p["records_offset"] for p in referenced)])
    with pytest.raises(TraceFileError, match=re.escape(side.name)):
        list(iter_trace_events(torn_dir))

def test_sigterm_under_load_writes_every_event_the_client_saw(
        proxy_factory, broker, tmp_path: Path, topic_name: str) -> None:
    proxy, producer, traces = traced_producer(proxy_factory, broker, tmp_path, topic_name)
    producer.wait_for_deliveries(300)
    assert proxy.stop(signal.SIGTERM) == 0, proxy.log_text()[-2000:]
    time.sleep(0.3)  # the producer is still sending, now into a closed port
    producer.stop()

    events = list(iter_trace_events(traces))
    check_well_formed(events)
    (trace_file,) = trace_files(traces)
    assert trace_file.suffix == ".events" and SegmentFile(trace_file).torn == 0, "a clean stop left a torn segment"
    written = [int(n) for n in WRITTEN_LOG_LINE.findall(proxy.log_text())]
    assert written == [len(events)]
    traced = traced_produce_responses(events, topic_name)
    assert [d for d in producer.delivered if traced.get(d.offset) != d.value] == []
    # Every traced response belongs to a traced request of the same exchange.
    requests = {(e["conn_id"], e["correlation_id"]) for e in events if e["direction"] == "request"}
    assert all((e["conn_id"], e["correlation_id"]) in requests for e in events if e["direction"] == "response")
