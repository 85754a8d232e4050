"""Batches written by real clients, read back raw from the real broker and decoded by kproxy.

Each test produces with a real client (librdkafka via confluent-kafka, or
kafka-python) using one codec, then fetches the partition's raw record bytes
with a plain blocking Fetch request and checks that `decode_batches` gives
back the produced keys and values and names the codec the client used.
"""

from __future__ import annotations

import datetime
import importlib
import io
import socket
import struct
from dataclasses import dataclass
from typing import Any

import pytest
from kio.schema.request_header.v1.header import RequestHeader as LegacyRequestHeader
from kio.schema.request_header.v2.header import RequestHeader as FlexibleRequestHeader
from kio.schema.response_header.v0.header import ResponseHeader as LegacyResponseHeader
from kio.schema.response_header.v1.header import ResponseHeader as FlexibleResponseHeader
from kio.serial import entity_reader, entity_writer

from kproxy.protocol import compression
from kproxy.protocol.records import RecordBatch, decode_batches, scan_batches
from tests.fixtures.broker import create_topic

CLIENT_CODECS = ("gzip", "snappy", "lz4", "zstd")
READ_UNCOMMITTED = 0
READ_COMMITTED = 1


def kafka_call(bootstrap: str, request: Any, correlation_id: int = 1, timeout: float = 10.0) -> Any:
    """Send one kio request over a fresh socket and return the decoded kio response."""
    module = importlib.import_module(type(request).__module__.replace(".request", ".response"))
    response_type = getattr(module, type(request).__name__.replace("Request", "Response"))
    flexible = type(request).__flexible__
    header_type = FlexibleRequestHeader if flexible else LegacyRequestHeader
    out = io.BytesIO()
    entity_writer(header_type)(
        out,
        header_type(
            request_api_key=type(request).__api_key__,
            request_api_version=type(request).__version__,
            correlation_id=correlation_id,
            client_id="kproxy-test",
        ),
    )
    entity_writer(type(request))(out, request)
    frame = out.getvalue()
    host, port = bootstrap.rsplit(":", 1)
    with socket.create_connection((host, int(port)), timeout=timeout) as sock:
        sock.sendall(struct.pack(">i", len(frame)) + frame)
        (size,) = struct.unpack(">i", _read_exactly(sock, 4))
        body = _read_exactly(sock, size)
    response_header_type = FlexibleResponseHeader if flexible else LegacyResponseHeader
    header, offset = entity_reader(response_header_type)(body, 0)
    assert header.correlation_id == correlation_id
    response, used = entity_reader(response_type)(body, offset)
    assert offset + used == len(body)
    return response


def _read_exactly(sock: socket.socket, n: int) -> bytes:
    chunks = bytearray()
    while len(chunks) < n:
        chunk = sock.recv(n - len(chunks))
        if not chunk:
            raise ConnectionError(f"broker closed the connection after {len(chunks)} of {n} bytes")
        chunks += chunk
    return bytes(chunks)


@dataclass(frozen=True)
class RawPartition:
    raw: bytes  # every fetched records buffer, concatenated
    batches: list[RecordBatch]
    high_watermark: int
    last_stable_offset: int
    aborted_transactions: list[tuple[int, int]]


def fetch_raw(
    bootstrap: str, topic: str, version: int = 12, isolation: int = READ_UNCOMMITTED, max_rounds: int = 50
) -> RawPartition:
    """All batches of partition 0, fetched from offset 0 up to the high watermark."""
    schema = importlib.import_module(f"kio.schema.fetch.v{version}.request")
    raws: list[bytes] = []
    batches: list[RecordBatch] = []
    aborted: list[tuple[int, int]] = []
    offset = 0
    for correlation_id in range(1, max_rounds + 1):
        partition_fields: dict[str, Any] = {"partition": 0, "fetch_offset": offset, "partition_max_bytes": 1 << 20}
        request_fields: dict[str, Any] = {
            "max_wait": datetime.timedelta(milliseconds=100),
            "min_bytes": 1,
            "max_bytes": 4 << 20,
            "isolation_level": isolation,
            "topics": (schema.FetchTopic(topic=topic, partitions=(schema.FetchPartition(**partition_fields),)),),
        }
        if version >= 7:
            request_fields["forgotten_topics_data"] = ()
        response = kafka_call(bootstrap, schema.FetchRequest(**request_fields), correlation_id)
        (topic_response,) = response.responses
        (part,) = topic_response.partitions
        assert part.error_code == 0, part
        aborted += [(a.producer_id, a.first_offset) for a in part.aborted_transactions or ()]
        raw = bytes(part.records or b"")
        raws.append(raw)
        fetched = decode_batches(raw)
        batches += [b for b in fetched if b.next_offset > offset]
        if fetched:
            offset = max(offset, fetched[-1].next_offset)
        # read_committed consumers may only read up to the last stable offset.
        end = part.last_stable_offset if isolation == READ_COMMITTED and part.last_stable_offset >= 0 else part.high_watermark
        if offset >= end:
            return RawPartition(b"".join(raws), batches, part.high_watermark, part.last_stable_offset, aborted)
        if not fetched:
            break
    raise AssertionError(f"fetching {topic} stopped at offset {offset} below the high watermark")


def data_records(batches: list[RecordBatch]) -> list[tuple[bytes | None, bytes | None]]:
    return [(r.key, r.value) for b in batches if not b.is_control for r in b.records]


def expected_records(prefix: str, n: int) -> list[tuple[bytes, bytes]]:
    # Repetitive values so every codec actually compresses (librdkafka sends
    # uncompressed when compression does not pay off).
    return [(f"{prefix}-k{i}".encode(), (f"{prefix}-value-{i}-" * 20).encode()) for i in range(n)]


def produce_confluent(bootstrap: str, topic: str, records: list[tuple[bytes, bytes]], **config: Any) -> None:
    from confluent_kafka import Producer

    producer = Producer({"bootstrap.servers": bootstrap, "linger.ms": 20, **config})
    for key, value in records:
        producer.produce(topic, key=key, value=value, partition=0)
    assert producer.flush(15) == 0


@pytest.mark.parametrize("codec", CLIENT_CODECS)
def test_librdkafka_batches_decode_with_their_codec(broker: Any, topic_name: str, codec: str) -> None:
    create_topic(broker.bootstrap, topic_name)
    sent = expected_records(codec, 40)
    produce_confluent(broker.bootstrap, topic_name, sent, **{"compression.type": codec, "enable.idempotence": True})
    fetched = fetch_raw(broker.bootstrap, topic_name)
    assert data_records(fetched.batches) == sent
    assert {b.compression for b in fetched.batches} == {codec}
    offsets = [r.offset for b in fetched.batches for r in b.records]
    assert offsets == list(range(len(sent)))
    # Idempotent producer: a real producer id and sequences that follow the offsets.
    assert all(b.producer_id >= 0 for b in fetched.batches)
    assert [b.sequence_of(r) for b in fetched.batches for r in b.records] == offsets


@pytest.mark.parametrize("codec", CLIENT_CODECS)
def test_kafka_python_batches_decode_with_their_codec(broker: Any, topic_name: str, codec: str) -> None:
    import kafka.codec
    from kafka import KafkaProducer

    if not getattr(kafka.codec, f"has_{codec}")():
        pytest.skip(f"kafka-python has no {codec} codec library installed")
    create_topic(broker.bootstrap, topic_name)
    sent = expected_records(f"kp-{codec}", 30)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type=codec, linger_ms=20)
    try:
        for key, value in sent:
            producer.send(topic_name, key=key, value=value, partition=0)
        producer.flush(15)
    finally:
        producer.close(5)
    fetched = fetch_raw(broker.bootstrap, topic_name, version=4)
    assert data_records(fetched.batches) == sent
    assert {b.compression for b in fetched.batches} == {codec}


def test_kafka_python_snappy_uses_the_xerial_framing(broker: Any, topic_name: str) -> None:
    """kafka-python writes xerial-framed snappy, the Java client's format; it must decode too."""
    import kafka.codec
    from kafka import KafkaProducer

    if not kafka.codec.has_snappy():
        pytest.skip("kafka-python has no snappy library installed")
    create_topic(broker.bootstrap, topic_name)
    sent = expected_records("xerial", 10)
    producer = KafkaProducer(bootstrap_servers=broker.bootstrap, compression_type="snappy", linger_ms=20)
    try:
        for key, value in sent:
            producer.send(topic_name, key=key, value=value, partition=0)
        producer.flush(15)
    finally:
        producer.close(5)
    raw = fetch_raw(broker.bootstrap, topic_name).raw
    first = next(scan_batches(raw))
    assert raw[first.start + 61 : first.start + 69] == b"\x82SNAPPY\x00"
    assert data_records(decode_batches(raw)) == sent
    assert compression.decompress("snappy", raw[first.start + 61 : first.end])  # framed block decodes on its own


def test_transaction_markers_decode_as_commit_and_abort(broker: Any, topic_name: str) -> None:
    from confluent_kafka import Producer

    create_topic(broker.bootstrap, topic_name)
    producer = Producer(
        {
            "bootstrap.servers": broker.bootstrap,
            "transactional.id": f"txn-{topic_name}",
            "compression.type": "zstd",
            "linger.ms": 5,
        }
    )
    producer.init_transactions(15)
    committed = expected_records("committed", 5)
    aborted = expected_records("aborted", 4)
    for records, finish in ((committed, producer.commit_transaction), (aborted, producer.abort_transaction)):
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic_name, key=key, value=value, partition=0)
        assert producer.flush(15) == 0
        finish(15)

    fetched = fetch_raw(broker.bootstrap, topic_name)
    data = [b for b in fetched.batches if not b.is_control]
    markers = [b for b in fetched.batches if b.is_control]
    assert data_records(fetched.batches) == committed + aborted
    assert all(b.is_transactional and b.compression == "zstd" for b in data)
    assert [m.control_type for m in markers] == ["commit", "abort"]
    assert all(m.is_transactional and m.compression == "none" for m in markers)
    producer_ids = {b.producer_id for b in fetched.batches}
    assert len(producer_ids) == 1 and producer_ids.pop() >= 0
    # Each marker follows the records of its own transaction.
    assert markers[0].base_offset == len(committed)
    assert markers[1].base_offset == len(committed) + 1 + len(aborted)
    assert fetched.high_watermark == markers[1].next_offset



def test_read_committed_fetch_stops_at_the_open_transaction(broker: Any, topic_name: str) -> None:
    """Offsets, LSO and the aborted-transactions list as the embedded Tansu broker reports them.

    Kafka would list the aborted transaction (producer id, first offset 4) in
    a read_committed Fetch so that clients can drop its records. Tansu sends
    an empty list, which is why read_committed clients read aborted records
    from it (docs/records.md). If this assertion ever fails, Tansu changed:
    update the note.
    """
    from confluent_kafka import Producer

    create_topic(broker.bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"txn-{topic_name}"})
    producer.init_transactions(15)
    for records, finish in (
        (expected_records("c", 3), producer.commit_transaction),
        (expected_records("a", 2), producer.abort_transaction),
    ):
        producer.begin_transaction()
        for key, value in records:
            producer.produce(topic_name, key=key, value=value, partition=0)
        assert producer.flush(15) == 0
        finish(15)
    producer.begin_transaction()
    producer.produce(topic_name, key=b"open", value=b"open", partition=0)
    assert producer.flush(15) == 0
    try:
        for version in (4, 12):
            everything = fetch_raw(broker.bootstrap, topic_name, version=version, isolation=READ_UNCOMMITTED)
            committed = fetch_raw(broker.bootstrap, topic_name, version=version, isolation=READ_COMMITTED)
            layout = [(b.base_offset, b.control_type, len(b.records)) for b in everything.batches]
            assert layout == [(0, None, 3), (3, "commit", 1), (4, None, 2), (6, "abort", 1), (7, None, 1)]
            assert (everything.high_watermark, everything.last_stable_offset) == (8, 7)
            # read_committed stops at the last stable offset, before the open transaction...
            assert [b.base_offset for b in committed.batches] == [0, 3, 4, 6]
            # ...but gets no aborted-transactions entry for offsets 4-5 (Kafka would send one).
            assert committed.aborted_transactions == []
            assert everything.aborted_transactions == []
    finally:
        producer.abort_transaction(15)
