"""Turn decoded kio requests and responses into the tracker's vocabulary.

The shell decodes only what it must: non-transactional Produce requests, the
commonest by far, are told apart without decoding by
kproxy.protocol.produce_peek and never reach here.
"""

from __future__ import annotations

from typing import Any

from kproxy.protocol.apis import (
    ADD_OFFSETS_TO_TXN,
    ADD_PARTITIONS_TO_TXN,
    END_TXN,
    INIT_PRODUCER_ID,
    PRODUCE,
    TXN_OFFSET_COMMIT,
)
from kproxy.txn.events import ResponseUpdate, TopicPartition, TxnRequest

# Errors that say the request's (producer id, epoch) no longer owns its
# transactional id: a newer producer took over, or the coordinator moved the
# epoch on (a timed-out transaction, KIP-588, or a KIP-890 bump).
FENCING_ERRORS = frozenset(
    {
        47,  # INVALID_PRODUCER_EPOCH
        49,  # INVALID_PRODUCER_ID_MAPPING
        90,  # PRODUCER_FENCED
    }
)

# Offsets into a v2 record batch (magic 2), the only format Produce v3+ carries.
_BATCH_MAGIC = 16
_BATCH_PRODUCER_ID = 43
_BATCH_PRODUCER_EPOCH = 51
_BATCH_HEADER_END = 53


def txn_requests(api_key: int, payload: Any) -> tuple[TxnRequest, ...]:
    """The transactional requests inside one decoded kio request payload."""
    if api_key == PRODUCE:
        return _produce(payload)
    if api_key == INIT_PRODUCER_ID:
        if payload.transactional_id is None:
            return ()  # an idempotent, non-transactional producer
        return (
            TxnRequest(
                "init_producer_id",
                payload.transactional_id,
                int(getattr(payload, "producer_id", -1)),
                int(getattr(payload, "producer_epoch", -1)),
            ),
        )
    if api_key == ADD_PARTITIONS_TO_TXN:
        return _add_partitions(payload)
    if api_key == ADD_OFFSETS_TO_TXN:
        return (
            TxnRequest("add_offsets", payload.transactional_id, int(payload.producer_id), int(payload.producer_epoch)),
        )
    if api_key == TXN_OFFSET_COMMIT:
        partitions = tuple((t.name, int(p.partition_index)) for t in payload.topics for p in t.partitions)
        return (
            TxnRequest(
                "txn_offset_commit",
                payload.transactional_id,
                int(payload.producer_id),
                int(payload.producer_epoch),
                partitions=partitions,
            ),
        )
    if api_key == END_TXN:
        return (
            TxnRequest(
                "end_txn",
                payload.transactional_id,
                int(payload.producer_id),
                int(payload.producer_epoch),
                committed=bool(payload.committed),
            ),
        )
    return ()


def _produce(payload: Any) -> tuple[TxnRequest, ...]:
    transactional_id = getattr(payload, "transactional_id", None)
    if transactional_id is None:
        return ()
    partitions: list[TopicPartition] = []
    producer_id, epoch = -1, -1
    for topic in payload.topic_data:
        # v13 names topics by id only; the tracker just needs a stable label.
        name = getattr(topic, "name", None) or str(topic.topic_id)
        for data in topic.partition_data:
            partitions.append((name, int(data.index)))
            if producer_id < 0 and data.records:
                producer_id, epoch = batch_producer(data.records)
    return (TxnRequest("produce", transactional_id, producer_id, epoch, partitions=tuple(partitions)),)


def batch_producer(records: bytes | memoryview) -> tuple[int, int]:
    """(producer id, epoch) from the first v2 record batch header, or (-1, -1)."""
    if len(records) < _BATCH_HEADER_END or records[_BATCH_MAGIC] != 2:
        return -1, -1
    producer_id = int.from_bytes(records[_BATCH_PRODUCER_ID:_BATCH_PRODUCER_EPOCH], "big", signed=True)
    epoch = int.from_bytes(records[_BATCH_PRODUCER_EPOCH:_BATCH_HEADER_END], "big", signed=True)
    return producer_id, epoch


def _add_partitions(payload: Any) -> tuple[TxnRequest, ...]:
    if hasattr(payload, "transactions"):
        # v4+: the batched form brokers use to verify partitions; verify_only
        # entries add nothing to a transaction, so they are not the producer's.
        return tuple(
            TxnRequest(
                "add_partitions",
                txn.transactional_id,
                int(txn.producer_id),
                int(txn.producer_epoch),
                partitions=_topic_partitions(txn.topics),
            )
            for txn in payload.transactions
            if not txn.verify_only
        )
    return (
        TxnRequest(
            "add_partitions",
            payload.v3_and_below_transactional_id,
            int(payload.v3_and_below_producer_id),
            int(payload.v3_and_below_producer_epoch),
            partitions=_topic_partitions(payload.v3_and_below_topics),
        ),
    )


def _topic_partitions(topics: Any) -> tuple[TopicPartition, ...]:
    return tuple((t.name, int(p)) for t in topics for p in t.partitions)


def response_update(api_key: int, request: TxnRequest, payload: Any) -> ResponseUpdate | None:
    """What the response to `request` teaches the tracker, or None if nothing.

    None means: no identity handed out and no error worth recording.
    """
    codes = _error_codes(api_key, request, payload)
    error = next((c for c in codes if c in FENCING_ERRORS), next((c for c in codes if c), 0))
    fenced = error in FENCING_ERRORS
    producer_id = producer_epoch = None
    if error == 0 and api_key in (INIT_PRODUCER_ID, END_TXN):
        # EndTxn before v5 carries no identity; v5+ carries the bumped one.
        pid = getattr(payload, "producer_id", None)
        epoch = getattr(payload, "producer_epoch", None)
        if pid is not None and epoch is not None and int(pid) >= 0:
            producer_id, producer_epoch = int(pid), int(epoch)
    if producer_id is None and error == 0 and api_key != INIT_PRODUCER_ID:
        return None
    return ResponseUpdate(int(error), fenced, producer_id, producer_epoch)


def _error_codes(api_key: int, request: TxnRequest, payload: Any) -> list[int]:
    if api_key in (INIT_PRODUCER_ID, ADD_OFFSETS_TO_TXN, END_TXN):
        return [int(payload.error_code)]
    if api_key == PRODUCE:
        return [int(p.error_code) for t in payload.responses for p in t.partition_responses]
    if api_key == TXN_OFFSET_COMMIT:
        return [int(p.error_code) for t in payload.topics for p in t.partitions]
    if api_key == ADD_PARTITIONS_TO_TXN:
        if hasattr(payload, "results_by_transaction"):
            codes = [int(payload.error_code)]
            for result in payload.results_by_transaction:
                if result.transactional_id == request.transactional_id:
                    codes += _partition_codes(result.topic_results)
            return codes
        return _partition_codes(payload.results_by_topic_v3_and_below)
    return []


def _partition_codes(topic_results: Any) -> list[int]:
    return [int(p.partition_error_code) for t in topic_results for p in t.results_by_partition]
