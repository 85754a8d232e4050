"""Extraction from real kio requests and responses, encoded and decoded by kio.

Every request is written to bytes with kio's writer and read back with its
reader before extraction, so the tests see exactly what the proxy's decoder
hands over. Produce record batches are built by kafka-python's batch
builder, as a real transactional producer writes them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import importlib
import io
import socket
import threading
import time
import uuid
from typing import Any

import pytest
from kafka.record.default_records import DefaultRecordBatchBuilder
from kio.schema.errors import ErrorCode
from kio.serial import entity_reader, entity_writer

from kproxy.txn import (
    ResponseUpdate,
    TxnRequest,
    TxnTracker,
    response_update,
    txn_requests,
)
from kproxy.protocol.produce_peek import produce_transactional_id
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


# --- real client bytes ----------------------------------------------------------------


class RecordingRelay:
    """A byte-for-byte TCP relay that keeps a copy of every frame in each direction.

    The broker advertises the relay's address (same port, another loopback
    address), so a real client talks to the broker only through it.
    """

    def __init__(self, listen: tuple[str, int], upstream: tuple[str, int]) -> None:
        self.upstream = upstream
        # Correlation ids are per connection, so both are keyed by connection number.
        self.requests: list[tuple[int, bytes]] = []
        self.responses: dict[tuple[int, int], bytes] = {}
        self._lock = threading.Lock()
        self._server = socket.create_server(listen)
        self._server.settimeout(0.2)
        self._closing = threading.Event()
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def _accept(self) -> None:
        connection = 0
        while not self._closing.is_set():
            try:
                client, _ = self._server.accept()
            except TimeoutError:
                continue
            except OSError:
                return  # closed
            connection += 1
            upstream = socket.create_connection(self.upstream)
            for src, dst, keep in ((client, upstream, self._keep_request), (upstream, client, self._keep_response)):
                thread = threading.Thread(target=self._pump, args=(src, dst, keep, connection), daemon=True)
                thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket, keep: Any, connection: int) -> None:
        pending = b""
        try:
            while chunk := src.recv(65536):
                # Each frame is kept before its last bytes go on: nothing the other side does about it can
                # be kept before it, so the requests of all connections are kept in an order that could
                # have happened. (Kept after forwarding, a loaded machine once kept a Produce after the
                # EndTxn the client sent only once that Produce was answered.)
                pending += chunk
                while len(pending) >= 4 and len(pending) >= 4 + int.from_bytes(pending[:4], "big"):
                    size = int.from_bytes(pending[:4], "big")
                    keep(connection, pending[4 : 4 + size])
                    pending = pending[4 + size :]
                dst.sendall(chunk)
        except OSError:
            pass
        finally:
            for s in (src, dst):
                with contextlib.suppress(OSError):
                    s.shutdown(socket.SHUT_RDWR)

    def _keep_request(self, connection: int, payload: bytes) -> None:
        with self._lock:
            self.requests.append((connection, payload))

    def _keep_response(self, connection: int, payload: bytes) -> None:
        with self._lock:
            self.responses[(connection, int.from_bytes(payload[:4], "big", signed=True))] = payload

    def close(self) -> None:
        self._closing.set()
        self._server.close()


@pytest.fixture(scope="module")
def librdkafka_session(tmp_path_factory: pytest.TempPathFactory) -> RecordingRelay:
    """A confluent-kafka producer that commits one transaction and aborts the next."""
    from confluent_kafka import Producer

    from kproxy.brokers import running_broker
    from tests.fixtures.broker import create_topic

    log_path = tmp_path_factory.mktemp("txn-broker") / "tansu.log"
    with running_broker(host="127.0.0.1", advertise="127.0.0.2", log_path=log_path) as broker:
        relay = RecordingRelay(("127.0.0.2", broker.port), ("127.0.0.1", broker.port))
        try:
            bootstrap = f"127.0.0.2:{broker.port}"
            create_topic(bootstrap, "txn-orders", partitions=2)
            producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": "real-tx", "linger.ms": 0})
            producer.init_transactions(15)
            producer.begin_transaction()
            producer.produce("txn-orders", key=b"a", value=b"1", partition=0)
            producer.produce("txn-orders", key=b"b", value=b"2", partition=1)
            producer.commit_transaction(15)
            producer.begin_transaction()
            producer.produce("txn-orders", key=b"c", value=b"3", partition=0)
            producer.flush(15)
            producer.abort_transaction(15)
            deadline = time.monotonic() + 5
            while len(relay.responses) < len(relay.requests) and time.monotonic() < deadline:
                time.sleep(0.05)
        finally:
            relay.close()
    return relay


def decoded_txn_traffic(relay: RecordingRelay) -> list[tuple[int, Any, TxnRequest, Any]]:
    """(api_key, header, TxnRequest, decoded response) for every transactional request, in order."""
    from kproxy.protocol.codec import decode_request, decode_response, parse_request_header

    traffic = []
    for connection, payload in relay.requests:
        header = parse_request_header(payload)
        if header.api_key == 0:
            assert produce_transactional_id(payload, 0, header) == "real-tx"
        for req in txn_requests(header.api_key, decode_request(header, payload)):
            raw = relay.responses[(connection, header.correlation_id)]
            response = decode_response(header.api_key, header.api_version, raw)
            traffic.append((header.api_key, header, req, response))
    return traffic


def test_real_librdkafka_transactions_are_numbered_without_hazards(
    librdkafka_session: RecordingRelay,
) -> None:
    traffic = decoded_txn_traffic(librdkafka_session)
    kinds = [req.kind for _, _, req, _ in traffic]
    assert kinds[0] == "init_producer_id" and kinds.count("end_txn") == 2
    assert {"add_partitions", "produce"} <= set(kinds)

    tracker = TxnTracker()
    numbered = []
    for api_key, _, req, response in traffic:
        number = tracker.on_request(req)
        delivery = tracker.on_delivery(req, number)
        assert delivery.hazard is None and delivery.broker_number == number
        tracker.on_response(req, response_update(api_key, req, response))
        numbered.append((req.kind, req.committed, number))

    ends = [(committed, number) for kind, committed, number in numbered if kind == "end_txn"]
    assert ends == [(True, 1), (False, 2)]
    produce_numbers = [number for kind, _, number in numbered if kind == "produce"]
    assert produce_numbers[0] == 1 and produce_numbers[-1] == 2
    init_response = traffic[0][3]
    produce_req = next(req for _, _, req, _ in traffic if req.kind == "produce")
    # The identity in the batch header is the one InitProducerId handed out.
    assert (produce_req.producer_id, produce_req.producer_epoch) == (
        init_response.producer_id,
        init_response.producer_epoch,
    )
    (row,) = tracker.snapshot()
    assert (row["client_number"], row["broker_number"], row["hazards"]) == (2, 2, 0)


def test_real_commit_replayed_late_is_a_stale_end_txn(librdkafka_session: RecordingRelay) -> None:
    traffic = decoded_txn_traffic(librdkafka_session)
    tracker = TxnTracker()
    commit = None
    landing = None
    for api_key, header, req, response in traffic:
        number = tracker.on_request(req)
        tracker.on_delivery(req, number)
        tracker.on_response(req, response_update(api_key, req, response))
        if req.kind == "end_txn" and req.committed:
            commit = (header, req, number)
        elif commit is not None and number == 2 and landing is None:
            # Transaction 2's first request reached the broker: now the duplicate commit lands.
            landing = tracker.on_delivery(commit[1], commit[2])
    assert commit is not None and landing is not None
    hazard = landing.hazard
    assert hazard is not None
    if commit[0].api_version >= 5:
        assert hazard.kind == "fenced"  # KIP-890 client: the epoch bump protects it
    else:
        assert (hazard.kind, hazard.client_number, hazard.broker_number, hazard.committed) == (
            "stale_end_txn",
            1,
            2,
            True,
        )
