"""Compressed batches are traced with their exact records, whatever the codec.

A confluent-kafka producer with `compression.type` set sends known keys and
values through a `records`-level proxy, and a consumer reads them back
through the same proxy. The trace must carry the decompressed records: in the
Produce request (no offsets yet), in the Produce response (offsets mapped
from the base offset) and in the Fetch response (with offsets), with the
partition's `compression` naming the codec. One run writes Parquet instead of
JSON Lines and is read back the same way.
"""

from __future__ import annotations

import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from kproxy.obs.trace_files import iter_trace_events, trace_files
from kproxy.proxy_process import ProxyProcess
from tests.fixtures.broker import create_topic

pytestmark = pytest.mark.timeout(60)

CODECS = ("gzip", "snappy", "lz4", "zstd")
RECORDS = 30


def known_records(codec: str) -> list[tuple[str, str]]:
    # Repetitive values so every codec really compresses; non-ASCII text checks the UTF-8 round trip.
    return [(f"key-{i}", f"{codec} value {i} · {'abc' * (i % 7 + 5)}") for i in range(RECORDS)]


def produce(bootstrap: str, topic: str, codec: str, records: list[tuple[str, str]]) -> list[int]:
    """Send the records in a few batches; return the offsets the delivery reports gave."""
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "compression.type": codec, "linger.ms": 50,
                         "enable.idempotence": True, "acks": "all"})
    offsets: dict[int, int] = {}

    def delivered(err, msg, index: int) -> None:  # noqa: ANN001 - librdkafka callback
        assert err is None, err
        offsets[index] = msg.offset()

    for index, (key, value) in enumerate(records):
        producer.produce(topic, key=key.encode(), value=value.encode(), partition=0,
                         on_delivery=lambda err, msg, index=index: delivered(err, msg, index))
        if index % 10 == 9:
            producer.flush(10)  # several Produce requests, each with its own compressed batch
    assert producer.flush(10) == 0
    return [offsets[i] for i in range(len(records))]


def consume(bootstrap: str, topic: str, count: int, timeout: float = 15.0) -> list[tuple[int, str, str]]:
    from confluent_kafka import Consumer, TopicPartition

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-reader",
                         "enable.auto.commit": False, "isolation.level": "read_committed"})
    consumer.assign([TopicPartition(topic, 0, 0)])
    read: list[tuple[int, str, str]] = []
    deadline = time.monotonic() + timeout
    try:
        while len(read) < count and time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is not None and msg.error() is None:
                read.append((msg.offset(), msg.key().decode(), msg.value().decode()))
    finally:
        consumer.close()
    return read


def partitions_of(events: list[dict], api: str, direction: str, topic: str) -> list[dict]:
    return [part for e in events if e["api"] == api and e["direction"] == direction
            for part in e["partitions"] or () if part["topic"] == topic and part["records"]]


def traced_round_trip(proxy_factory: Callable[..., ProxyProcess], broker, tmp_path: Path, topic: str,
                      codec: str, *trace_args: str) -> None:
    """Produce and consume through a tracing proxy, then check the trace against both clients."""
    create_topic(broker.bootstrap, topic, 1)
    traces = tmp_path / "traces"
    proxy = proxy_factory("--traces", str(traces), "--trace-level", "records", *trace_args)
    records = known_records(codec)
    offsets = produce(proxy.bootstrap, topic, codec, records)
    consumed = consume(proxy.bootstrap, topic, len(records))
    assert consumed == [(o, k, v) for o, (k, v) in zip(offsets, records)]
    assert proxy.stop(signal.SIGTERM) == 0, proxy.log_text()[-2000:]
    events = list(iter_trace_events(traces, strict=True))

    requested = partitions_of(events, "produce", "request", topic)
    assert requested and {p["compression"] for p in requested} == {codec}
    assert [(r["key"], r["value"]) for p in requested for r in p["records"]] == records
    assert all(r["offset"] is None for p in requested for r in p["records"])

    acknowledged = partitions_of(events, "produce", "response", topic)
    assert len(acknowledged) == len(requested)
    assert {p["compression"] for p in acknowledged} == {codec} and {p["error_code"] for p in acknowledged} == {0}
    assert [(r["offset"], r["key"], r["value"]) for p in acknowledged for r in p["records"]] == consumed
    assert all(p["records"][0]["offset"] == p["base_offset"] for p in acknowledged)

    fetched = partitions_of(events, "fetch", "response", topic)
    assert fetched and {p["compression"] for p in fetched} == {codec}
    wire = {(r["offset"], r["key"], r["value"]) for p in fetched for r in p["records"] if r["control"] is None}
    assert wire >= set(consumed)
    assert all(p["high_watermark"] is not None and p["high_watermark"] >= p["records"][-1]["offset"] + 1
               for p in fetched)


@pytest.mark.parametrize("codec", CODECS)
def test_each_codec_is_traced_with_exact_records(proxy_factory, broker, tmp_path: Path, topic_name: str,
                                                 codec: str) -> None:
    traced_round_trip(proxy_factory, broker, tmp_path, topic_name, codec)


def test_parquet_trace_reads_back_with_the_same_records(proxy_factory, broker, tmp_path: Path,
                                                        topic_name: str) -> None:
    traced_round_trip(proxy_factory, broker, tmp_path, topic_name, "zstd", "--trace-format", "parquet")
    files = trace_files(tmp_path / "traces")
    assert files and all(f.suffix == ".parquet" for f in files)
