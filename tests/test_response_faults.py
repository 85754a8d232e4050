"""Response-field rewrites on kio Produce and Fetch payloads of several versions.

Every rewritten payload is also encoded and decoded again with kio, because
the proxy has to send it to a real client.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import io
import uuid
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from kproxy.protocol.records import Record, RecordBatch, decode_batches, encode_batch, make_batch, make_control_batch
from kproxy.protocol.response_faults import (
    fetch_drop_aborted_transactions,
    fetch_drop_control_batches,
    fetch_drop_records,
    fetch_stale_high_watermark,
    fetch_stale_last_stable_offset,
    produce_error_with_offset,
    without_control_batches,
)

PRODUCE_VERSIONS = (3, 5, 9, 11, 13)
FETCH_VERSIONS = (4, 5, 7, 12, 13, 17)
TOPIC_IDS = {"orders": uuid.UUID(int=1), "audit": uuid.UUID(int=2)}
TOPIC_NAMES = {v: k for k, v in TOPIC_IDS.items()}


def build(cls: type, **values: Any) -> Any:
    """A kio entity from the values its version has (others are dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def topic_fields(name: str) -> dict[str, Any]:
    # Names up to v12 (Fetch) / v12 (Produce); ids from v13 on. Both are offered, build() keeps one.
    return {"name": name, "topic": name, "topic_id": TOPIC_IDS[name]}


def produce_response(version: int, partitions: dict[str, list[tuple[int, int, int]]]) -> Any:
    """partitions: topic -> [(index, error_code, base_offset)]."""
    m = importlib.import_module(f"kio.schema.produce.v{version}.response")
    return build(
        m.ProduceResponse,
        throttle_time=datetime.timedelta(0),
        responses=tuple(
            build(
                m.TopicProduceResponse,
                **topic_fields(topic),
                partition_responses=tuple(
                    build(
                        m.PartitionProduceResponse,
                        index=index,
                        error_code=ErrorCode(error),
                        base_offset=base,
                        log_start_offset=0,
                        record_errors=(),
                    )
                    for index, error, base in parts
                ),
            )
            for topic, parts in partitions.items()
        ),
    )


def fetch_response(version: int, partitions: dict[str, list[dict[str, Any]]]) -> Any:
    """partitions: topic -> [PartitionData fields]; aborted_transactions given as [(pid, first_offset)]."""
    m = importlib.import_module(f"kio.schema.fetch.v{version}.response")

    def partition(fields: dict[str, Any]) -> Any:
        fields = {
            "error_code": ErrorCode.none,
            "log_start_offset": 0,
            "last_stable_offset": -1,
            "aborted_transactions": None,
            "records": None,
            **fields,
        }
        aborted = fields.get("aborted_transactions")
        if aborted is not None:
            fields["aborted_transactions"] = tuple(
                m.AbortedTransaction(producer_id=p, first_offset=o) for p, o in aborted
            )
        return build(m.PartitionData, **fields)

    return build(
        m.FetchResponse,
        throttle_time=datetime.timedelta(0),
        error_code=ErrorCode.none,
        responses=tuple(
            build(m.FetchableTopicResponse, **topic_fields(topic), partitions=tuple(partition(p) for p in parts))
            for topic, parts in partitions.items()
        ),
    )


def wire_round_trip(payload: Any) -> Any:
    out = io.BytesIO()
    entity_writer(type(payload))(out, payload)
    decoded, size = entity_reader(type(payload))(out.getvalue(), 0)
    assert size == len(out.getvalue())
    return decoded


def partitions_of(resp: Any) -> list[Any]:
    parts = []
    for topic in resp.responses:
        parts += list(getattr(topic, "partitions", None) or topic.partition_responses)
    return parts


def data_batch(offset: int, n: int, pid: int = 7, codec: str = "none") -> RecordBatch:
    records = [Record(offset + i, 1_700_000_000_000 + i, f"k{offset + i}".encode(), b"v" * 50) for i in range(n)]
    return make_batch(records, producer_id=pid, producer_epoch=0, base_sequence=offset, transactional=True, compression=codec)


def marker(kind: str, offset: int, pid: int = 7) -> RecordBatch:
    return make_control_batch(kind, offset=offset, timestamp=1_700_000_000_100, producer_id=pid, producer_epoch=0)


# --- Produce: error with offset 0 ---------------------------------------------------------


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_error_carries_offset_zero_on_every_partition(version: int) -> None:
    resp = produce_response(version, {"orders": [(0, 0, 120), (1, 0, 45)], "audit": [(0, 0, 9)]})
    rewritten = produce_error_with_offset(resp, ErrorCode.not_leader_or_follower)
    assert [(p.error_code, p.base_offset) for p in partitions_of(rewritten)] == [(6, 0)] * 3
    assert wire_round_trip(rewritten) == rewritten
    assert [p.base_offset for p in partitions_of(resp)] == [120, 45, 9]  # the input is untouched


@pytest.mark.parametrize("version", PRODUCE_VERSIONS)
def test_produce_error_touches_only_selected_topics_and_partitions(version: int) -> None:
    resp = produce_response(version, {"orders": [(0, 0, 120), (1, 0, 45)], "audit": [(0, 0, 9)]})
    rewritten = produce_error_with_offset(
        resp, 6, offset=0, topics={"orders"}, partitions={1}, topic_names=TOPIC_NAMES
    )
    assert [(int(p.error_code), p.base_offset) for p in partitions_of(rewritten)] == [(0, 120), (6, 0), (0, 9)]


def test_produce_topics_may_be_a_predicate_or_the_id_as_text() -> None:
    resp = produce_response(13, {"orders": [(0, 0, 1)], "audit": [(0, 0, 2)]})
    by_id = produce_error_with_offset(resp, 6, topics={str(TOPIC_IDS["audit"])})
    assert [int(p.error_code) for p in partitions_of(by_id)] == [0, 6]
    by_predicate = produce_error_with_offset(resp, 6, topics=lambda t: t.startswith("ord"), topic_names=TOPIC_NAMES)
    assert [int(p.error_code) for p in partitions_of(by_predicate)] == [6, 0]


def test_produce_error_with_a_chosen_offset() -> None:
    resp = produce_response(9, {"orders": [(0, 0, 500)]})
    (part,) = partitions_of(produce_error_with_offset(resp, 7, offset=499))
    assert (part.error_code, part.base_offset) == (ErrorCode.request_timed_out, 499)


# --- Fetch: stale offsets ----------------------------------------------------------------


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_stale_high_watermark_lags_but_stays_at_or_above_log_start(version: int) -> None:
    resp = fetch_response(
        version,
        {
            "orders": [
                {"partition_index": 0, "high_watermark": 100, "last_stable_offset": 90, "log_start_offset": 10},
                {"partition_index": 1, "high_watermark": 15, "last_stable_offset": 15, "log_start_offset": 10},
                {"partition_index": 2, "high_watermark": -1, "error_code": ErrorCode.unknown_topic_or_partition},
            ]
        },
    )
    rewritten = wire_round_trip(fetch_stale_high_watermark(resp, 20))
    hwms = [p.high_watermark for p in partitions_of(rewritten)]
    lsos = [p.last_stable_offset for p in partitions_of(rewritten)]
    if version >= 5:  # log start offset on the wire: the floor
        assert hwms == [80, 10, -1]
        assert lsos == [80, 10, -1]  # an LSO above the new HWM comes down with it
    else:
        assert hwms == [80, 0, -1]
        assert lsos == [80, 0, -1]


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_stale_last_stable_offset_leaves_the_high_watermark(version: int) -> None:
    resp = fetch_response(
        version,
        {"orders": [{"partition_index": 0, "high_watermark": 100, "last_stable_offset": 95, "log_start_offset": 50}]},
    )
    (part,) = partitions_of(wire_round_trip(fetch_stale_last_stable_offset(resp, 60)))
    assert part.high_watermark == 100
    assert part.last_stable_offset == (50 if version >= 5 else 35)


def test_negative_lag_is_refused() -> None:
    resp = fetch_response(12, {"orders": [{"partition_index": 0, "high_watermark": 1}]})
    with pytest.raises(ValueError, match="lag"):
        fetch_stale_high_watermark(resp, -1)
    with pytest.raises(ValueError, match="lag"):
        fetch_stale_last_stable_offset(resp, -1)


@given(hwm=st.integers(0, 10**9), lag=st.integers(0, 10**9), start=st.integers(0, 10**9))
@settings(max_examples=100, deadline=None)
def test_stale_high_watermark_arithmetic(hwm: int, lag: int, start: int) -> None:
    start = min(start, hwm)
    resp = fetch_response(12, {"orders": [{"partition_index": 0, "high_watermark": hwm, "log_start_offset": start}]})
    (part,) = partitions_of(fetch_stale_high_watermark(resp, lag))
    assert part.high_watermark == max(hwm - lag, start)


def test_stale_offsets_touch_only_selected_topics() -> None:
    resp = fetch_response(
        13,
        {
            "orders": [{"partition_index": 0, "high_watermark": 100, "last_stable_offset": 100}],
            "audit": [{"partition_index": 0, "high_watermark": 100, "last_stable_offset": 100}],
        },
    )
    rewritten = fetch_stale_last_stable_offset(resp, 5, topics=["audit"], topic_names=TOPIC_NAMES)
    assert [p.last_stable_offset for p in partitions_of(rewritten)] == [100, 95]


# --- Fetch: records, markers, aborted list ----------------------------------------------


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_drop_records_empties_records_and_keeps_offsets(version: int) -> None:
    records = encode_batch(data_batch(0, 3)) + encode_batch(marker("commit", 3))
    resp = fetch_response(
        version,
        {
            "orders": [{"partition_index": 0, "high_watermark": 4, "records": records, "aborted_transactions": []}],
            "audit": [{"partition_index": 0, "high_watermark": 4, "records": records, "aborted_transactions": []}],
        },
    )
    rewritten = wire_round_trip(fetch_drop_records(resp, topics={"orders"}, topic_names=TOPIC_NAMES))
    orders, audit = partitions_of(rewritten)
    assert decode_batches(orders.records) == [] and orders.high_watermark == 4
    assert audit.records == records


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_drop_control_batches_keeps_data_batches_byte_exact(version: int) -> None:
    # Includes a truncated trailing batch, as a broker cuts responses at the fetch size.
    kept = [encode_batch(data_batch(0, 3, codec="lz4")), encode_batch(data_batch(4, 2, codec="gzip"))]
    tail = encode_batch(data_batch(7, 2))[:40]
    records = kept[0] + encode_batch(marker("commit", 3)) + kept[1] + encode_batch(marker("abort", 6)) + tail
    resp = fetch_response(
        version, {"orders": [{"partition_index": 0, "high_watermark": 9, "records": records, "aborted_transactions": [(7, 4)]}]}
    )
    (part,) = partitions_of(wire_round_trip(fetch_drop_control_batches(resp)))
    assert part.records == kept[0] + kept[1] + tail
    assert [b.is_control for b in decode_batches(part.records)] == [False, False]
    assert [(a.producer_id, a.first_offset) for a in part.aborted_transactions] == [(7, 4)]


def test_drop_only_abort_markers() -> None:
    records = encode_batch(data_batch(0, 1)) + encode_batch(marker("commit", 1)) + encode_batch(marker("abort", 3))
    resp = fetch_response(12, {"orders": [{"partition_index": 0, "high_watermark": 4, "records": records}]})
    (part,) = partitions_of(fetch_drop_control_batches(resp, kinds=("abort",)))
    assert [b.control_type for b in decode_batches(part.records)] == [None, "commit"]
    with pytest.raises(ValueError, match="kinds"):
        fetch_drop_control_batches(resp, kinds=("rollback",))


def test_records_without_markers_are_left_as_the_same_object() -> None:
    records = encode_batch(data_batch(0, 2))
    resp = fetch_response(12, {"orders": [{"partition_index": 0, "high_watermark": 2, "records": records}]})
    (before,) = partitions_of(resp)
    (after,) = partitions_of(fetch_drop_control_batches(resp))
    assert after is before


def test_unreadable_records_pass_through_unchanged() -> None:
    garbage = b"\x00" * 8 + b"\x00\x00\x00\x03" + b"\x00" * 10
    assert without_control_batches(garbage) == garbage


@given(
    layout=st.lists(st.sampled_from(["data", "commit", "abort"]), min_size=1, max_size=8),
    codec=st.sampled_from(["none", "gzip", "snappy", "lz4", "zstd"]),
)
@settings(max_examples=60, deadline=None)
def test_dropping_markers_slices_out_exactly_the_marker_batches(layout: list[str], codec: str) -> None:
    encoded = []
    offset = 0
    for kind in layout:
        batch = data_batch(offset, 2, codec=codec) if kind == "data" else marker(kind, offset)
        encoded.append((kind, encode_batch(batch)))
        offset = batch.next_offset
    records = b"".join(raw for _, raw in encoded)
    assert without_control_batches(records) == b"".join(raw for kind, raw in encoded if kind == "data")
    assert without_control_batches(records, kinds=("commit",)) == b"".join(
        raw for kind, raw in encoded if kind != "commit"
    )


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_drop_aborted_transactions_empties_the_list_and_keeps_null(version: int) -> None:
    resp = fetch_response(
        version,
        {
            "orders": [
                {"partition_index": 0, "high_watermark": 9, "aborted_transactions": [(7, 4), (8, 6)]},
                {"partition_index": 1, "high_watermark": 9, "aborted_transactions": None},
            ]
        },
    )
    committed, uncommitted = partitions_of(wire_round_trip(fetch_drop_aborted_transactions(resp)))
    assert committed.aborted_transactions == ()
    assert uncommitted.aborted_transactions is None
