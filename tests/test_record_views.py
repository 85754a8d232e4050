"""Records-level trace views of Produce and Fetch payloads: unit tests and a real-broker run."""

from __future__ import annotations

import base64
import datetime
import importlib
import uuid
from typing import Any

import orjson
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode

from kproxy.obs.trace_schema import PARTITION, RECORD
from kproxy.protocol.record_views import (
    SeenBatches,
    fetch_response_partitions,
    payload_text,
    produce_request_partitions,
    produce_response_partitions,
    side_batch_records,
    side_batches,
)
from kproxy.protocol.records import Record, encode_batch, make_batch, make_control_batch
from tests.fixtures.broker import create_topic
from tests.test_compression_clients import kafka_call
from tests.test_response_faults import TOPIC_IDS, TOPIC_NAMES, build, fetch_response, produce_response, topic_fields

PARTITION_KEYS = {f.name for f in PARTITION}
RECORD_KEYS = {f.name for f in RECORD}


def produce_request(version: int, partitions: dict[str, list[tuple[int, bytes | None]]]) -> Any:
    m = importlib.import_module(f"kio.schema.produce.v{version}.request")
    return build(
        m.ProduceRequest,
        transactional_id=None,
        acks=-1,
        timeout=datetime.timedelta(seconds=10),
        topic_data=tuple(
            build(
                m.TopicProduceData,
                **topic_fields(topic),
                partition_data=tuple(m.PartitionProduceData(index=i, records=r) for i, r in parts),
            )
            for topic, parts in partitions.items()
        ),
    )


def records_at(offset: int, values: list[bytes | None]) -> list[Record]:
    return [Record(offset + i, 1_700_000_000_000 + i, f"key-{offset + i}".encode(), v) for i, v in enumerate(values)]


def assert_schema_shape(views: list[dict[str, Any]]) -> None:
    for view in views:
        assert set(view) == PARTITION_KEYS
        for record in view["records"] or ():
            assert set(record) == RECORD_KEYS
        for aborted in view["aborted_transactions"] or ():
            assert set(aborted) == {"producer_id", "first_offset"}
    orjson.dumps(views)  # a trace line must serialise as is


@given(data=st.binary(max_size=40))
def test_payload_text_is_utf8_or_tagged_base64(data: bytes) -> None:
    text = payload_text(data)
    assert text is not None
    if text.startswith("b64:") and not _is_utf8(data):
        assert base64.b64decode(text[4:]) == data
    else:
        assert text.encode("utf-8") == data
    assert payload_text(None) is None


def _is_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


@pytest.mark.parametrize("version", [3, 9, 13])
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_request_records_without_offsets(version: int, codec: str) -> None:
    batch = make_batch(
        records_at(0, [b"one", b"\xff\xfe", None]), compression=codec, producer_id=11, producer_epoch=2, base_sequence=40
    )
    req = produce_request(version, {"orders": [(0, encode_batch(batch)), (3, None)]})
    views = produce_request_partitions(req, TOPIC_NAMES)
    assert_schema_shape(views)
    first, empty = views
    assert (first["topic"], first["partition"], first["compression"]) == ("orders", 0, codec)
    assert [r["value"] for r in first["records"]] == ["one", "b64://4=", None]
    assert [r["key"] for r in first["records"]] == ["key-0", "key-1", "key-2"]
    assert [r["offset"] for r in first["records"]] == [None] * 3
    assert [r["sequence"] for r in first["records"]] == [40, 41, 42]
    assert {(r["producer_id"], r["producer_epoch"], r["transactional"]) for r in first["records"]} == {(11, 2, False)}
    assert first["error_code"] is None and first["base_offset"] is None
    assert empty["records"] == [] and empty["compression"] is None


def test_produce_v13_without_a_topic_map_names_the_topic_by_id() -> None:
    req = produce_request(13, {"audit": [(0, encode_batch(make_batch(records_at(0, [b"x"]))))]})
    (view,) = produce_request_partitions(req)
    assert view["topic"] == str(TOPIC_IDS["audit"])


@pytest.mark.parametrize("version", [3, 9, 13])
def test_produce_response_maps_the_base_offset_onto_each_record(version: int) -> None:
    req = produce_request(
        version,
        {
            "orders": [
                (0, encode_batch(make_batch(records_at(0, [b"a", b"b"]), compression="zstd"))),
                (1, encode_batch(make_batch(records_at(0, [b"c"])))),
            ],
            "audit": [(0, encode_batch(make_batch(records_at(0, [b"d"]))))],
        },
    )
    sent = produce_request_partitions(req, TOPIC_NAMES)
    resp = produce_response(version, {"orders": [(0, 0, 100), (1, 6, 0)], "audit": [(0, 0, 7)]})
    views = produce_response_partitions(resp, sent, TOPIC_NAMES)
    assert_schema_shape(views)
    ok, failed, audit = views
    assert [(r["offset"], r["value"]) for r in ok["records"]] == [(100, "a"), (101, "b")]
    assert (ok["base_offset"], ok["error_code"], ok["compression"]) == (100, 0, "zstd")
    # An error assigns no offsets, even with the spurious base offset 0 on the wire.
    assert (failed["error_code"], failed["base_offset"]) == (6, 0)
    assert [(r["offset"], r["value"]) for r in failed["records"]] == [(None, "c")]
    assert [r["offset"] for r in audit["records"]] == [7]
    assert ok["log_start_offset"] == (0 if version >= 5 else None)


def test_produce_response_without_its_request_has_null_records() -> None:
    resp = produce_response(9, {"orders": [(0, 0, 5)]})
    (view,) = produce_response_partitions(resp, None)
    assert view["records"] is None and view["base_offset"] == 5


@pytest.mark.parametrize("version", [4, 5, 12, 13, 17])
def test_fetch_response_lists_records_markers_and_offsets(version: int) -> None:
    data = make_batch(records_at(10, [b"p", b"q"]), compression="lz4", producer_id=3, producer_epoch=1, base_sequence=0, transactional=True)
    commit = make_control_batch("commit", offset=12, timestamp=1, producer_id=3, producer_epoch=1)
    aborted = make_batch(records_at(13, [b"r"]), producer_id=4, producer_epoch=0, base_sequence=0, transactional=True)
    abort = make_control_batch("abort", offset=14, timestamp=2, producer_id=4, producer_epoch=0)
    resp = fetch_response(
        version,
        {
            "orders": [
                {
                    "partition_index": 2,
                    "high_watermark": 20,
                    "last_stable_offset": 15,
                    "log_start_offset": 10,
                    "aborted_transactions": [(4, 13)],
                    "records": b"".join(encode_batch(b) for b in (data, commit, aborted, abort)),
                }
            ]
        },
    )
    (view,) = fetch_response_partitions(resp, TOPIC_NAMES)
    assert_schema_shape([view])
    assert (view["topic"], view["partition"], view["error_code"]) == ("orders", 2, 0)
    assert (view["high_watermark"], view["last_stable_offset"]) == (20, 15)
    assert view["log_start_offset"] == (10 if version >= 5 else None)
    assert view["aborted_transactions"] == [{"producer_id": 4, "first_offset": 13}]
    assert view["compression"] == "lz4"
    assert [(r["offset"], r["control"], r["producer_id"]) for r in view["records"]] == [
        (10, None, 3),
        (11, None, 3),
        (12, "commit", 3),
        (13, None, 4),
        (14, "abort", 4),
    ]
    assert [r["value"] for r in view["records"][:2]] == ["p", "q"]
    assert all(r["transactional"] for r in view["records"])


def test_fetch_v13_topic_id_is_text_without_a_map() -> None:
    resp = fetch_response(13, {"audit": [{"partition_index": 0, "high_watermark": 0}]})
    (view,) = fetch_response_partitions(resp)
    assert view["topic"] == str(TOPIC_IDS["audit"])
    assert view["records"] == [] and view["aborted_transactions"] is None


def test_undecodable_fetch_records_give_null_records_not_an_error() -> None:
    raw = bytearray(encode_batch(make_batch(records_at(0, [b"v"]))))
    raw[30] ^= 0xFF  # CRC no longer matches
    resp = fetch_response(12, {"orders": [{"partition_index": 0, "high_watermark": 1, "records": bytes(raw)}]})
    (view,) = fetch_response_partitions(resp)
    assert view["records"] is None and view["high_watermark"] == 1


def test_error_partitions_keep_their_error_code() -> None:
    resp = fetch_response(
        12, {"orders": [{"partition_index": 0, "high_watermark": -1, "error_code": ErrorCode.offset_out_of_range}]}
    )
    (view,) = fetch_response_partitions(resp)
    assert view["error_code"] == 1 and view["records"] == []


# --- against the real broker ------------------------------------------------------------


def topic_ids(bootstrap: str, topic: str) -> dict[uuid.UUID, str]:
    m = importlib.import_module("kio.schema.metadata.v12.request")
    request = m.MetadataRequest(
        topics=(m.MetadataRequestTopic(topic_id=None, name=topic),),
        allow_auto_topic_creation=False,
        include_topic_authorized_operations=False,
    )
    return {t.topic_id: t.name for t in kafka_call(bootstrap, request).topics}


def fetch_partition_zero(bootstrap: str, topic: str, version: int, names: dict[uuid.UUID, str]) -> Any:
    m = importlib.import_module(f"kio.schema.fetch.v{version}.request")
    id_by_name = {v: k for k, v in names.items()}
    partition = m.FetchPartition(partition=0, fetch_offset=0, partition_max_bytes=1 << 20)
    return kafka_call(
        bootstrap,
        m.FetchRequest(
            max_wait=datetime.timedelta(milliseconds=100),
            min_bytes=1,
            topics=(build(m.FetchTopic, topic=topic, topic_id=id_by_name[topic], partitions=(partition,)),),
            forgotten_topics_data=(),
        ),
        correlation_id=version,
    )


def test_encoded_batches_are_accepted_by_the_broker_and_traced_end_to_end(broker: Any, topic_name: str) -> None:
    """Batches kproxy encodes (every codec) are stored by the real broker and read by librdkafka."""
    from confluent_kafka import Consumer, TopicPartition

    create_topic(broker.bootstrap, topic_name)
    codecs = ["none", "gzip", "snappy", "lz4", "zstd"]
    batches = [
        make_batch([Record(i, 1_700_000_000_000 + n, f"{codec}-{i}".encode(), f"value-{codec}-{i}".encode() * 5) for i in range(3)], compression=codec)
        for n, codec in enumerate(codecs)
    ]
    expected: list[tuple[str, str]] = []
    for batch in batches:
        m = importlib.import_module("kio.schema.produce.v9.request")
        request = m.ProduceRequest(
            transactional_id=None,
            acks=-1,
            timeout=datetime.timedelta(seconds=10),
            topic_data=(m.TopicProduceData(name=topic_name, partition_data=(m.PartitionProduceData(index=0, records=encode_batch(batch)),)),),
        )
        sent = produce_request_partitions(request)
        response = kafka_call(broker.bootstrap, request)
        (acked,) = produce_response_partitions(response, sent)
        assert acked["error_code"] == 0, acked
        assert [r["offset"] for r in acked["records"]] == [len(expected) + i for i in range(3)]
        expected += [(r["key"], r["value"]) for r in acked["records"]]

    names = topic_ids(broker.bootstrap, topic_name)
    for version in (12, 13):
        (view,) = fetch_response_partitions(fetch_partition_zero(broker.bootstrap, topic_name, version, names), names)
        assert view["topic"] == topic_name
        assert [(r["key"], r["value"]) for r in view["records"]] == expected
        assert [r["offset"] for r in view["records"]] == list(range(len(expected)))
        assert view["high_watermark"] == len(expected) and view["compression"] == "none"

    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": f"g-{topic_name}", "enable.auto.commit": False})
    try:
        consumer.assign([TopicPartition(topic_name, 0, 0)])
        consumed = []
        deadline = datetime.datetime.now() + datetime.timedelta(seconds=15)
        while len(consumed) < len(expected) and datetime.datetime.now() < deadline:
            message = consumer.poll(0.5)
            if message is not None and message.error() is None:
                consumed.append((message.key().decode(), message.value().decode()))
    finally:
        consumer.close()
    assert consumed == expected


# A reader of a whole trace (the analysis) meets the same batches many times: every Fetch of a record
# returns the batch its Produce sent, with a base offset. SeenBatches decodes each once.
def _batch_at(base_offset: int, values: list[bytes], *, producer_id: int = 7, control: bool = False) -> bytes:
    records = [Record(base_offset + i, 1_700_000_000_000 + i, b"k", v) for i, v in enumerate(values)]
    if control:
        return encode_batch(make_control_batch("commit", offset=base_offset, timestamp=1_700_000_000_000,
                                               producer_id=producer_id, producer_epoch=0))
    return encode_batch(make_batch(records, producer_id=producer_id, producer_epoch=0, base_sequence=0,
                                   transactional=True))


def _with_base_offset(batch: bytes, base_offset: int) -> bytes:
    # What a broker does to a produced batch: the base offset and the leader epoch before the CRC change.
    return base_offset.to_bytes(8, "big", signed=True) + batch[8:12] + (3).to_bytes(4, "big") + batch[16:]


def test_seen_batches_give_what_a_fresh_decode_gives_and_decode_each_batch_once() -> None:
    produced = _batch_at(0, [b"1", b"2"])
    marker = _batch_at(0, [], control=True)
    fetched = _with_base_offset(produced, 40) + _with_base_offset(marker, 42)
    refetched = _with_base_offset(produced, 40)
    seen = SeenBatches()
    for api, direction, raw, part in (
        ("produce", "request", produced, {}),
        ("fetch", "response", fetched, {}),
        ("fetch", "response", refetched, {}),
        ("produce", "response", produced, {"base_offset": 40, "error_code": 0}),
    ):
        fresh = side_batch_records(side_batches(raw, api, direction, part), api, direction, part)
        memo = side_batch_records(side_batches(raw, api, direction, part, seen), api, direction, part, seen)
        assert memo == fresh, (api, direction)
    # The produced batch and its fetched copy are one entry (what differs is before the CRC), the marker another.
    assert len(seen.batches) == 2
    views = side_batch_records(side_batches(fetched, "fetch", "response", {}, seen), "fetch", "response", {}, seen)
    assert [v["offset"] for v in views] == [40, 41, 42]
    assert [v["control"] for v in views] == [None, None, "commit"]


def test_a_produce_response_s_offsets_never_reach_the_views_a_fetch_shares() -> None:
    produced = _batch_at(0, [b"1"])
    seen = SeenBatches()
    fetch = side_batch_records(side_batches(_with_base_offset(produced, 5), "fetch", "response", {}, seen),
                               "fetch", "response", {}, seen)
    part = {"base_offset": 9, "error_code": 0}
    answered = side_batch_records(side_batches(produced, "produce", "response", part, seen), "produce", "response",
                                  part, seen)
    assert [v["offset"] for v in answered] == [9]
    again = side_batch_records(side_batches(_with_base_offset(produced, 5), "fetch", "response", {}, seen),
                               "fetch", "response", {}, seen)
    assert [v["offset"] for v in fetch] == [v["offset"] for v in again] == [5]


def test_a_damaged_batch_is_refused_each_time_and_never_kept() -> None:
    produced = bytearray(_batch_at(0, [b"1"]))
    produced[-1] ^= 0xFF  # inside the CRC-covered records
    seen = SeenBatches()
    for _ in range(2):
        assert side_batches(bytes(produced), "fetch", "response", {}, seen) is None
    assert seen.batches == {}


def test_seen_batches_are_forgotten_whole_at_their_limit_in_bytes() -> None:
    raws = [_batch_at(0, [value]) for value in (b"1", b"2", b"3")]
    seen = SeenBatches(limit_bytes=2 * len(raws[0]))
    for raw, value in zip(raws, ("1", "2", "3"), strict=True):
        views = side_batch_records(side_batches(raw, "fetch", "response", {}, seen), "fetch", "response", {}, seen)
        assert [v["value"] for v in views] == [value]
    assert len(seen.batches) == 1
