"""Extraction from real kio requests and responses, encoded and decoded by kio.

Every request is written to bytes with kio's writer and read back with its
reader before extraction, so the tests see exactly what the proxy's decoder
hands over. Produce record batches are built by kafka-python's batch
builder, as a real transactional producer writes them.
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
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from kproxy.txn import ResponseUpdate, TxnRequest, peek_produce_transactional_id, response_update, txn_requests
from kproxy.txn.extract import batch_producer

TIMEOUT = datetime.timedelta(seconds=30)


def schema(api: str, version: int, kind: str = "request") -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def build(cls: type, **values: Any) -> Any:
    """Instantiate a kio dataclass with the fields this version has."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def encode(entity: Any) -> bytes:
    buffer = io.BytesIO()
    entity_writer(type(entity))(buffer, entity)
    return buffer.getvalue()


def wire(entity: Any) -> Any:
    """What the proxy sees: the entity after a trip through Kafka bytes."""
    decoded, size = entity_reader(type(entity))(encode(entity), 0)
    assert size == len(encode(entity))
    return decoded


def record_batch(producer_id: int, epoch: int) -> bytes:
    builder = DefaultRecordBatchBuilder(
        magic=2,
        compression_type=0,
        is_transactional=True,
        producer_id=producer_id,
        producer_epoch=epoch,
        base_sequence=0,
        batch_size=1 << 16,
    )
    builder.append(0, timestamp=1_700_000_000_000, key=b"k", value=b"v", headers=[])
    return bytes(builder.build())


def produce_request(version: int, transactional_id: str | None, records: bytes | None) -> Any:
    module = schema("produce", version)
    topic_key = {"topic_id": uuid.UUID(int=7)} if version >= 13 else {"name": "orders"}
    topics = (
        module.TopicProduceData(
            **topic_key,
            partition_data=(
                module.PartitionProduceData(index=0, records=records),
                module.PartitionProduceData(index=2, records=records),
            ),
        ),
    )
    return module.ProduceRequest(transactional_id=transactional_id, acks=-1, timeout=TIMEOUT, topic_data=topics)


@pytest.mark.parametrize("version", range(3, 14))
def test_transactional_produce_yields_partitions_and_batch_identity(version: int) -> None:
    payload = wire(produce_request(version, "tx-a", record_batch(9001, 4)))
    (req,) = txn_requests(0, payload)
    topic = str(uuid.UUID(int=7)) if version >= 13 else "orders"
    assert req == TxnRequest("produce", "tx-a", 9001, 4, partitions=((topic, 0), (topic, 2)))


@pytest.mark.parametrize("version", [3, 8, 9, 13])
def test_non_transactional_produce_yields_nothing(version: int) -> None:
    assert txn_requests(0, wire(produce_request(version, None, record_batch(5, 0)))) == ()


def test_produce_without_readable_batch_has_unknown_identity() -> None:
    (req,) = txn_requests(0, wire(produce_request(9, "tx-a", None)))
    assert (req.producer_id, req.producer_epoch) == (-1, -1)
    assert batch_producer(b"\x00" * 10) == (-1, -1)


@pytest.mark.parametrize("version", range(0, 7))
def test_init_producer_id(version: int) -> None:
    module = schema("init_producer_id", version)
    payload = wire(build(module.InitProducerIdRequest, transactional_id="tx-a", transaction_timeout=TIMEOUT,
                         producer_id=12, producer_epoch=3))
    (req,) = txn_requests(22, payload)
    expected_identity = (12, 3) if version >= 3 else (-1, -1)  # KIP-360 added them in v3
    assert (req.kind, req.transactional_id, req.producer_id, req.producer_epoch) == (
        "init_producer_id",
        "tx-a",
        *expected_identity,
    )
    idempotent_only = wire(build(module.InitProducerIdRequest, transactional_id=None, transaction_timeout=TIMEOUT))
    assert txn_requests(22, idempotent_only) == ()


@pytest.mark.parametrize("version", range(0, 4))
def test_add_partitions_single_transaction_form(version: int) -> None:
    module = schema("add_partitions_to_txn", version)
    topics = (module.AddPartitionsToTxnTopic(name="orders", partitions=(0, 1)),
              module.AddPartitionsToTxnTopic(name="audit", partitions=(4,)))
    payload = wire(
        module.AddPartitionsToTxnRequest(
            v3_and_below_transactional_id="tx-a",
            v3_and_below_producer_id=77,
            v3_and_below_producer_epoch=2,
            v3_and_below_topics=topics,
        )
    )
    assert txn_requests(24, payload) == (
        TxnRequest("add_partitions", "tx-a", 77, 2, partitions=(("orders", 0), ("orders", 1), ("audit", 4))),
    )


@pytest.mark.parametrize("version", [4, 5])
def test_add_partitions_batched_form_skips_verify_only(version: int) -> None:
    module = schema("add_partitions_to_txn", version)

    def txn(tid: str, pid: int, verify_only: bool) -> Any:
        return module.AddPartitionsToTxnTransaction(
            transactional_id=tid,
            producer_id=pid,
            producer_epoch=1,
            verify_only=verify_only,
            topics=(module.AddPartitionsToTxnTopic(name="orders", partitions=(pid % 3,)),),
        )

    payload = wire(module.AddPartitionsToTxnRequest(transactions=(txn("a", 10, False), txn("b", 11, True),
                                                                  txn("c", 12, False))))
    assert txn_requests(24, payload) == (
        TxnRequest("add_partitions", "a", 10, 1, partitions=(("orders", 1),)),
        TxnRequest("add_partitions", "c", 12, 1, partitions=(("orders", 0),)),
    )


@pytest.mark.parametrize("version", range(0, 5))
def test_add_offsets(version: int) -> None:
    module = schema("add_offsets_to_txn", version)
    payload = wire(module.AddOffsetsToTxnRequest(transactional_id="tx-a", producer_id=5, producer_epoch=0,
                                                 group_id="g"))
    assert txn_requests(25, payload) == (TxnRequest("add_offsets", "tx-a", 5, 0),)


@pytest.mark.parametrize("version", range(0, 6))
def test_txn_offset_commit(version: int) -> None:
    module = schema("txn_offset_commit", version)
    partition = build(module.TxnOffsetCommitRequestPartition, partition_index=3, committed_offset=42,
                      committed_metadata=None)
    topic = module.TxnOffsetCommitRequestTopic(name="orders", partitions=(partition,))
    payload = wire(build(module.TxnOffsetCommitRequest, transactional_id="tx-a", group_id="g", producer_id=5,
                         producer_epoch=1, topics=(topic,)))
    assert txn_requests(28, payload) == (TxnRequest("txn_offset_commit", "tx-a", 5, 1, partitions=(("orders", 3),)),)


@pytest.mark.parametrize("version", range(0, 6))
@pytest.mark.parametrize("committed", [True, False])
def test_end_txn(version: int, committed: bool) -> None:
    module = schema("end_txn", version)
    payload = wire(module.EndTxnRequest(transactional_id="tx-a", producer_id=5, producer_epoch=2, committed=committed))
    assert txn_requests(26, payload) == (TxnRequest("end_txn", "tx-a", 5, 2, committed=committed),)


def test_other_apis_are_not_transactional() -> None:
    module = schema("api_versions", 3)
    payload = wire(module.ApiVersionsRequest(client_software_name="x", client_software_version="1"))
    assert txn_requests(18, payload) == ()


# --- responses -------------------------------------------------------------------

END = TxnRequest("end_txn", "tx-a", 5, 2, committed=True)
NO_THROTTLE = datetime.timedelta(0)


def test_init_producer_id_response_hands_out_identity() -> None:
    module = schema("init_producer_id", 4, "response")
    payload = wire(module.InitProducerIdResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode(0), producer_id=88,
                                                 producer_epoch=6))
    init = TxnRequest("init_producer_id", "tx-a", -1, -1)
    assert response_update(22, init, payload) == ResponseUpdate(0, False, 88, 6)


def test_init_producer_id_error_is_recorded_without_identity() -> None:
    module = schema("init_producer_id", 4, "response")
    payload = wire(module.InitProducerIdResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode(90), producer_id=-1,
                                                 producer_epoch=-1))
    init = TxnRequest("init_producer_id", "tx-a", 5, 1)
    assert response_update(22, init, payload) == ResponseUpdate(90, True, None, None)


def test_end_txn_v5_response_carries_bumped_epoch_and_v4_does_not() -> None:
    v5 = schema("end_txn", 5, "response")
    payload = wire(v5.EndTxnResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode(0), producer_id=5,
                                     producer_epoch=3))
    assert response_update(26, END, payload) == ResponseUpdate(0, False, 5, 3)
    v4 = schema("end_txn", 4, "response")
    v4_payload = wire(v4.EndTxnResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode(0)))
    assert response_update(26, END, v4_payload) is None


@pytest.mark.parametrize(("code", "fenced"), [(90, True), (47, True), (49, True), (48, False), (53, False)])
def test_end_txn_errors(code: int, fenced: bool) -> None:
    v3 = schema("end_txn", 3, "response")
    payload = wire(v3.EndTxnResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode(code)))
    update = response_update(26, END, payload)
    assert update == ResponseUpdate(code, fenced, None, None)


def test_produce_response_fencing_error_wins_over_others() -> None:
    module = schema("produce", 9, "response")

    def partition(index: int, code: int) -> Any:
        return module.PartitionProduceResponse(
            index=index, error_code=ErrorCode(code), base_offset=-1, record_errors=()
        )

    payload = wire(
        module.ProduceResponse(
            responses=(module.TopicProduceResponse(name="orders", partition_responses=(partition(0, 6),
                                                                                       partition(1, 47))),),
            throttle_time=NO_THROTTLE,
        )
    )
    req = TxnRequest("produce", "tx-a", 5, 2)
    assert response_update(0, req, payload) == ResponseUpdate(47, True)
    ok = wire(module.ProduceResponse(responses=(module.TopicProduceResponse(
        name="orders", partition_responses=(partition(0, 0),)),), throttle_time=NO_THROTTLE))
    assert response_update(0, req, ok) is None


def test_batched_add_partitions_response_reads_own_transaction_only() -> None:
    module = schema("add_partitions_to_txn", 4, "response")

    def result(tid: str, code: int) -> Any:
        return module.AddPartitionsToTxnResult(
            transactional_id=tid,
            topic_results=(module.AddPartitionsToTxnTopicResult(
                name="orders",
                results_by_partition=(module.AddPartitionsToTxnPartitionResult(partition_index=0,
                                                                               partition_error_code=ErrorCode(code)),),
            ),),
        )

    payload = wire(module.AddPartitionsToTxnResponse(throttle_time=NO_THROTTLE, error_code=ErrorCode(0),
                                                     results_by_transaction=(result("a", 0), result("b", 90))))
    assert response_update(24, TxnRequest("add_partitions", "a", 1, 0), payload) is None
    assert response_update(24, TxnRequest("add_partitions", "b", 2, 0), payload) == ResponseUpdate(90, True)


def test_txn_offset_commit_response_error() -> None:
    module = schema("txn_offset_commit", 3, "response")
    payload = wire(module.TxnOffsetCommitResponse(
        throttle_time=NO_THROTTLE,
        topics=(module.TxnOffsetCommitResponseTopic(name="orders", partitions=(
            module.TxnOffsetCommitResponsePartition(partition_index=0, error_code=ErrorCode(48)),)),),
    ))
    assert response_update(28, TxnRequest("txn_offset_commit", "tx-a", 5, 2), payload) == ResponseUpdate(48)


# --- the cheap Produce peek ---------------------------------------------------------

transactional_ids = st.one_of(st.none(), st.text(min_size=0, max_size=300))


@settings(max_examples=150, deadline=None)
@given(version=st.integers(min_value=3, max_value=13), transactional_id=transactional_ids,
       with_records=st.booleans())
def test_peek_agrees_with_kio_decoder(version: int, transactional_id: str | None, with_records: bool) -> None:
    request = produce_request(version, transactional_id, record_batch(1, 0) if with_records else None)
    body = encode(request)
    decoded, _ = entity_reader(type(request))(body, 0)
    assert peek_produce_transactional_id(body, version) == decoded.transactional_id
    assert peek_produce_transactional_id(memoryview(body), version) == decoded.transactional_id


def test_peek_before_v3_has_no_transactional_id() -> None:
    assert peek_produce_transactional_id(b"\x00\x01", 2) is None


@pytest.mark.parametrize(
    ("body", "version"),
    [(b"", 3), (b"\x00", 8), (b"\x00\x05ab", 3), (b"", 9), (b"\x80\x80\x80\x80\x80\x01", 9), (b"\x06ab", 9)],
)
def test_peek_rejects_truncated_fields(body: bytes, version: int) -> None:
    with pytest.raises(ValueError):
        peek_produce_transactional_id(body, version)
