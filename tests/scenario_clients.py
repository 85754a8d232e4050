"""Real-client helpers for the end-to-end scenario tests.

The scenario tests drive confluent-kafka (librdkafka) and kafka-python
through a real `kproxy run` in front of the real broker, then judge what
happened from three places: what the client saw, what the proxy counted
(/metrics, /rules, /txns) and what crossed the wire (a records-level trace).

Timeouts are short on purpose: a fault that makes a client wait must cost
seconds, not the library defaults of minutes.
"""

from __future__ import annotations

import io
import time
import uuid
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, KafkaException, Producer, TopicPartition

from kproxy.obs.trace_files import iter_trace_events
from kproxy.proxy_process import ProxyProcess

# librdkafka settings that keep every scenario within seconds.
FAST_CLIENT = {
    "socket.timeout.ms": 3000,
    "retry.backoff.ms": 100,
    "retry.backoff.max.ms": 200,
    "reconnect.backoff.ms": 50,
    "reconnect.backoff.max.ms": 200,
    "topic.metadata.refresh.interval.ms": 2000,
}
FAST_PRODUCER = {**FAST_CLIENT, "request.timeout.ms": 3000, "message.timeout.ms": 10000, "linger.ms": 0}


# ---------------------------------------------------------------- producing


@dataclass(frozen=True)
class Delivery:
    """What the producer was told about one record."""

    value: str
    offset: int | None
    error: KafkaError | None

    @property
    def ok(self) -> bool:
        return self.error is None


def producer(bootstrap: str, **settings: Any) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, **FAST_PRODUCER, **settings})


def transactional_producer(bootstrap: str, transactional_id: str | None = None, **settings: Any) -> Producer:
    """A librdkafka transactional producer, already initialised."""
    p = producer(
        bootstrap,
        **{
            "transactional.id": transactional_id or f"tx-{uuid.uuid4().hex[:8]}",
            "transaction.timeout.ms": 10000,
            **settings,
        },
    )
    p.init_transactions(15)
    return p


def send(p: Producer, topic: str, values: Iterable[str], key: str = "k", timeout: float = 15.0) -> list[Delivery]:
    """Produce each value (one request each: flushed one by one) and return the delivery reports."""
    reports: list[Delivery] = []
    for value in values:

        def on_delivery(err: KafkaError | None, msg: Any, value: str = value) -> None:
            reports.append(Delivery(value, msg.offset() if err is None else None, err))

        p.produce(topic, key=key.encode(), value=value.encode(), partition=0, on_delivery=on_delivery)
        remaining = p.flush(timeout)
        assert remaining == 0, f"{remaining} record(s) still queued after {timeout}s"
    return reports


# ---------------------------------------------------------------- consuming


@dataclass(frozen=True)
class Consumed:
    offset: int
    key: str | None
    value: str | None


def read_partition(
    bootstrap: str,
    topic: str,
    *,
    isolation: str = "read_uncommitted",
    want: int | None = None,
    timeout: float = 8.0,
    stop_at_want: bool = False,
    **settings: Any,
) -> list[Consumed]:
    """Read partition 0 from the start (assign, no group join) until the end or `want` records.

    Stops at the first end-of-partition once `want` records are in (or, with
    no `want`, at the first end-of-partition), or when `timeout` runs out.
    With `stop_at_want`, stops as soon as `want` records are in (for a consumer
    that never sees the end of the partition).
    """
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"g-{uuid.uuid4().hex[:8]}",
            "enable.auto.commit": False,
            "isolation.level": isolation,
            "enable.partition.eof": True,
            "fetch.wait.max.ms": 100,
            **FAST_CLIENT,
            **settings,
        }
    )
    out: list[Consumed] = []
    try:
        consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            msg = consumer.poll(0.2)
            if msg is None:
                continue
            err = msg.error()
            if err is not None:
                if err.code() == KafkaError._PARTITION_EOF:
                    if want is None or len(out) >= want:
                        break
                    continue
                raise KafkaException(err)
            out.append(Consumed(msg.offset(), _text(msg.key()), _text(msg.value())))
            if stop_at_want and want is not None and len(out) >= want:
                break
    finally:
        consumer.close()
    return out


def _text(raw: bytes | None) -> str | None:
    return None if raw is None else raw.decode()


# ---------------------------------------------------------------- the proxy's view


def txns(proxy: ProxyProcess) -> dict:
    return httpx.get(f"{proxy.admin_url}/txns", timeout=5).json()


def hazards(proxy: ProxyProcess) -> dict[str, int]:
    return txns(proxy)["stats"]["hazards_by_kind"]


def rule_counters(proxy: ProxyProcess) -> dict[str, dict[str, int]]:
    """rule id -> {"matched": n, "applied": n}, from GET /rules."""
    listing = httpx.get(f"{proxy.admin_url}/rules", timeout=5).json()
    return {rule["id"]: rule["counters"] for rule in listing["rules"]}


def wait_until(condition: Any, timeout: float = 10.0, interval: float = 0.1, what: str = "condition") -> Any:
    """Poll `condition()` until it returns something truthy; fail after `timeout`."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


# ---------------------------------------------------------------- the wire, from a records-level trace


@dataclass(frozen=True)
class WireRecord:
    """One record (or transaction marker) of the log, as a Fetch response carried it."""

    offset: int
    value: str | None
    control: str | None  # "commit" / "abort" for a marker
    producer_id: int | None


def trace_events(trace_dir: Path) -> list[dict]:
    return list(iter_trace_events(trace_dir))


def wire_log(events: Iterable[dict], topic: str, partition: int = 0) -> list[WireRecord]:
    """The partition's log as the Fetch responses carried it, one entry per offset, in offset order."""
    by_offset: dict[int, WireRecord] = {}
    for event in events:
        if event["api"] != "fetch" or event["direction"] != "response" or not event.get("partitions"):
            continue
        for part in event["partitions"]:
            if part["topic"] != topic or part["partition"] != partition:
                continue
            for rec in part.get("records") or ():
                if rec.get("offset") is None:
                    continue
                by_offset[rec["offset"]] = WireRecord(rec["offset"], rec.get("value"), rec.get("control"), rec.get("producer_id"))
    return [by_offset[o] for o in sorted(by_offset)]


def fates(log: list[WireRecord]) -> dict[str, str | None]:
    """value -> the first transaction marker of its producer after it ("commit"/"abort"), or None.

    A transactional record's fate is decided by the next marker its producer
    wrote to the partition: that is what a correct read_committed consumer
    would go by (Tansu gives no aborted-transactions list, so the markers are
    the only truth on this broker).
    """
    out: dict[str, str | None] = {}
    for i, rec in enumerate(log):
        if rec.control is not None or rec.value is None:
            continue
        fate = None
        for later in log[i + 1 :]:
            if later.control is not None and later.producer_id == rec.producer_id:
                fate = later.control
                break
        out[rec.value] = fate
    return out


# ---------------------------------------------------------------- raw Fetch, to see exactly what a client is handed


@dataclass(frozen=True)
class RawFetch:
    """One Fetch response for partition 0, as the client received it."""

    high_watermark: int
    last_stable_offset: int
    aborted_transactions: tuple[tuple[int, int], ...]
    records: tuple[WireRecord, ...]


def raw_fetch(bootstrap: str, topic: str, offset: int = 0, read_committed: bool = True, timeout: float = 10.0) -> RawFetch:
    """Send one Fetch (v12) for partition 0 over a fresh socket and decode what comes back."""
    import datetime
    import socket
    import struct

    from kio.schema.fetch.v12 import request as fetch_request
    from kio.schema.fetch.v12.response import FetchResponse
    from kio.schema.request_header.v2.header import RequestHeader
    from kio.schema.response_header.v1.header import ResponseHeader
    from kio.serial import entity_reader, entity_writer

    from kproxy.protocol.records import decode_batches

    request = fetch_request.FetchRequest(
        max_wait=datetime.timedelta(milliseconds=100),
        min_bytes=1,
        max_bytes=4 << 20,
        isolation_level=1 if read_committed else 0,
        topics=(
            fetch_request.FetchTopic(
                topic=topic,
                partitions=(fetch_request.FetchPartition(partition=0, fetch_offset=offset, partition_max_bytes=1 << 20),),
            ),
        ),
        forgotten_topics_data=(),
    )
    out = io.BytesIO()
    entity_writer(RequestHeader)(
        out, RequestHeader(request_api_key=1, request_api_version=12, correlation_id=7, client_id="scenario-raw")
    )
    entity_writer(fetch_request.FetchRequest)(out, request)
    frame = out.getvalue()
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", _recv_exactly(sock, 4))
        body = _recv_exactly(sock, size)
    header, at = entity_reader(ResponseHeader)(body, 0)
    assert header.correlation_id == 7
    response, _ = entity_reader(FetchResponse)(body, at)
    ((part,),) = [t.partitions for t in response.responses]
    assert part.error_code == 0, part
    records = tuple(
        WireRecord(
            batch.base_offset + i if batch.is_control else rec.offset,
            None if rec.value is None else rec.value.decode(errors="replace"),
            batch.control_type,
            batch.producer_id,
        )
        for batch in decode_batches(bytes(part.records or b""))
        for i, rec in enumerate(batch.records)
    )
    return RawFetch(
        part.high_watermark,
        part.last_stable_offset,
        tuple((a.producer_id, a.first_offset) for a in part.aborted_transactions or ()),
        records,
    )


def _recv_exactly(sock: Any, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = sock.recv(n - len(data))
        if not chunk:
            raise ConnectionError(f"connection closed after {len(data)} of {n} bytes")
        data += chunk
    return bytes(data)


# ---------------------------------------------------------------- kafka-python


def kafka_python_producer(bootstrap: str, **settings: Any) -> Any:
    from kafka import KafkaProducer

    return KafkaProducer(
        bootstrap_servers=bootstrap,
        request_timeout_ms=3000,
        retry_backoff_ms=100,
        max_block_ms=10000,
        **settings,
    )


def kafka_python_send(p: Any, topic: str, values: Iterable[str], key: str = "k") -> list[Delivery]:
    """Send each value and wait for its answer; errors become failed deliveries (code in `error`)."""
    from kafka.errors import KafkaError as KafkaPythonError

    reports = []
    for value in values:
        future = p.send(topic, key=key.encode(), value=value.encode(), partition=0)
        try:
            meta = future.get(15)
            reports.append(Delivery(value, meta.offset, None))
        except KafkaPythonError as exc:
            reports.append(Delivery(value, None, exc))  # type: ignore[arg-type]
    return reports
