"""The records-level part of a trace event: per-partition records, offsets and markers.

Each function turns a decoded kio Produce or Fetch payload (any version kio
knows) into the event's `partitions` list, whose elements are dicts with
exactly the PARTITION fields of kproxy.obs.trace_schema, and records with
exactly the RECORD fields; a consumer's Fetch request, the offsets an
OffsetCommit or TxnOffsetCommit commits and their answers get entries with
only the fields that apply. Keys and values are UTF-8 text when they are valid
UTF-8, else 'b64:' + base64, so a trace line is always valid JSON.

Undecodable record bytes never fail the event: the partition's `records` is
null (the broker will answer the client about its own bad bytes).
"""

from __future__ import annotations

import base64
import logging
import uuid
from collections.abc import Iterable, Mapping
from typing import Any

from kproxy.obs.trace_schema import PARTITION, RECORD
from kproxy.protocol.compression import codec_name
from kproxy.protocol.records import (
    CONTROL_FLAG,
    NO_SEQUENCE,
    TRANSACTIONAL_FLAG,
    RecordDecodeError,
    RecordTuple,
    batch_tuples,
    control_type_of,
)

log = logging.getLogger(__name__)

PARTITION_KEYS = tuple(f.name for f in PARTITION)
RECORD_KEYS = tuple(f.name for f in RECORD)

TopicNames = Mapping[uuid.UUID, str]


def payload_text(data: bytes | None) -> str | None:
    """A key or value as trace text: UTF-8 when it is, else 'b64:' + base64."""
    if data is None:
        return None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return "b64:" + base64.b64encode(data).decode("ascii")


def payload_bytes(text: str | None) -> bytes | None:
    """The bytes of a key or value's trace text (the inverse of payload_text)."""
    if text is None:
        return None
    if text.startswith("b64:"):
        return base64.b64decode(text[4:])
    return text.encode("utf-8")


def topic_text(topic: Any, topic_names: TopicNames | None = None) -> str:
    """The topic of a kio topic entry: its name, or its id mapped to a name, or the id as text."""
    name = getattr(topic, "name", None) or getattr(topic, "topic", None)
    if name is not None:
        return name
    topic_id = topic.topic_id
    if topic_names and topic_id in topic_names:
        return topic_names[topic_id]
    return str(topic_id)


def _partition_view(**values: Any) -> dict[str, Any]:
    view = dict.fromkeys(PARTITION_KEYS)
    view.update(values)
    assert len(view) == len(PARTITION_KEYS), f"not PARTITION fields: {set(view) - set(PARTITION_KEYS)}"
    return view


def _record_views(batches: Iterable[tuple[tuple[int, ...], list[RecordTuple]]], with_offsets: bool) -> list[dict[str, Any]]:
    views = []
    append = views.append
    for header, records in batches:
        base_offset, attributes = header[0], header[5]
        producer_id, producer_epoch, base_sequence = header[9], header[10], header[11]
        control = attributes & CONTROL_FLAG
        transactional = bool(attributes & TRANSACTIONAL_FLAG)
        for offset_delta, _timestamp_delta, key, value, _headers in records:
            append(
                {
                    "offset": base_offset + offset_delta if with_offsets else None,
                    "key": payload_text(key),
                    "value": payload_text(value),
                    # A control record of a type data logs give no meaning (the no-op
                    # marker of fetch_hide_aborted) is still no data record.
                    "control": (control_type_of(key) or "unknown") if control else None,
                    "producer_id": producer_id,
                    "producer_epoch": producer_epoch,
                    # Sequences wrap to 0 after int32 max, as Kafka's do (RecordBatch.sequence_of).
                    "sequence": NO_SEQUENCE if base_sequence < 0 else (base_sequence + offset_delta) % (1 << 31),
                    "transactional": transactional,
                }
            )
    return views


def _decoded(
    records: bytes | None, where: str, seen: dict | None = None
) -> list[tuple[tuple[int, ...], list[RecordTuple]]] | None:
    try:
        return batch_tuples(records, seen=seen)
    except RecordDecodeError as exc:
        log.debug("records of %s not traced: %s", where, exc)
        return None


def _records_fields(records: bytes | None, where: str, with_offsets: bool) -> dict[str, Any]:
    batches = _decoded(records, where)
    if batches is None:
        return {"compression": None, "records": None}
    return {
        "compression": codec_name(batches[0][0][5]) if batches else None,
        "records": _record_views(batches, with_offsets),
    }


def produce_request_partitions(req: Any, topic_names: TopicNames | None = None) -> list[dict[str, Any]]:
    """Records a Produce request carries, per partition; offsets are null (not assigned yet)."""
    views = []
    for topic in req.topic_data:
        name = topic_text(topic, topic_names)
        for part in topic.partition_data:
            views.append(
                _partition_view(
                    topic=name,
                    partition=part.index,
                    **_records_fields(part.records, f"produce {name}-{part.index}", with_offsets=False),
                )
            )
    return views


def produce_response_partitions(
    resp: Any, request_partitions: list[dict[str, Any]] | None, topic_names: TopicNames | None = None
) -> list[dict[str, Any]]:
    """A Produce response per partition, with the request's records at the offsets it assigned.

    Record i of the partition's request gets base_offset + i, when the
    partition succeeded; an error response assigns no offsets, whatever its
    base_offset field says (that field is kept as sent, e.g. a spurious 0).
    A partition whose request is unknown has null records.
    """
    sent = {(p["topic"], p["partition"]): p for p in request_partitions or ()}
    views = []
    for topic in resp.responses:
        name = topic_text(topic, topic_names)
        for part in topic.partition_responses:
            request = sent.get((name, part.index))
            records = None
            compression = None
            if request is not None and request["records"] is not None:
                compression = request["compression"]
                assigned = part.error_code == 0 and part.base_offset >= 0
                records = [
                    {**record, "offset": part.base_offset + i if assigned else None}
                    for i, record in enumerate(request["records"])
                ]
            views.append(
                _partition_view(
                    topic=name,
                    partition=part.index,
                    error_code=int(part.error_code),
                    base_offset=part.base_offset,
                    log_start_offset=getattr(part, "log_start_offset", None),
                    compression=compression,
                    records=records,
                )
            )
    return views


def fetch_response_partitions(resp: Any, topic_names: TopicNames | None = None) -> list[dict[str, Any]]:
    """What a Fetch response returned per partition: records with offsets, markers and offsets.

    Fetch v13+ names topics by id: pass the id -> name map learnt from
    Metadata, or the id is written as text. Every record of every complete
    batch is listed, including records below the fetch offset that a broker
    returns because they share a batch with it (clients skip those).
    """
    views = []
    for topic in resp.responses:
        name = topic_text(topic, topic_names)
        for part in topic.partitions:
            aborted = getattr(part, "aborted_transactions", None)
            views.append(
                _partition_view(
                    topic=name,
                    partition=part.partition_index,
                    error_code=int(part.error_code),
                    high_watermark=part.high_watermark,
                    last_stable_offset=getattr(part, "last_stable_offset", None),
                    log_start_offset=getattr(part, "log_start_offset", None),
                    aborted_transactions=None
                    if aborted is None
                    else [{"producer_id": a.producer_id, "first_offset": a.first_offset} for a in aborted],
                    **_records_fields(part.records, f"fetch {name}-{part.partition_index}", with_offsets=True),
                )
            )
    return views


def _topic_name(topic: Any, topic_names: TopicNames | None) -> str:
    """topic_text for a request's or commit's topic entry, looked up once per topic."""
    name = getattr(topic, "name", None) or getattr(topic, "topic", None)
    if name is not None:
        return name
    return (topic_names or {}).get(topic.topic_id) or str(topic.topic_id)


# A consumer's requests and the commits' answers carry no records: their
# partition entries hold only the fields that apply (the others read as
# null), a fifth of the JSON of a full entry, for events as frequent as
# Fetch requests.


def fetch_request_partitions(req: Any, topic_names: TopicNames | None = None) -> list[dict[str, Any]]:
    """Where a Fetch request asked to read from: topic, partition and `fetch_offset` per partition it lists.

    An incremental request of a fetch session (KIP-227, v7+) lists only the
    partitions whose position changed; the others stay where the session's
    earlier requests put them. Forgotten topics are left out.
    """
    views = []
    for topic in req.topics:
        name = _topic_name(topic, topic_names)
        for part in topic.partitions:
            views.append({"topic": name, "partition": int(part.partition), "fetch_offset": int(part.fetch_offset)})
    return views


def offset_commit_partitions(req: Any, topic_names: TopicNames | None = None) -> list[dict[str, Any]]:
    """The offsets an OffsetCommit or TxnOffsetCommit request commits: topic, partition and `committed_offset`."""
    views = []
    for topic in req.topics:
        name = _topic_name(topic, topic_names)
        for part in topic.partitions:
            views.append({"topic": name, "partition": int(part.partition_index),
                          "committed_offset": int(part.committed_offset)})
    return views


def offset_commit_response_partitions(resp: Any, topic_names: TopicNames | None = None) -> list[dict[str, Any]]:
    """An OffsetCommit or TxnOffsetCommit response: topic, partition and `error_code` per partition."""
    views = []
    for topic in resp.topics:
        name = _topic_name(topic, topic_names)
        for part in topic.partitions:
            views.append({"topic": name, "partition": int(part.partition_index), "error_code": int(part.error_code)})
    return views


def delete_topics_partitions(req: Any, topic_names: TopicNames | None = None) -> list[dict[str, Any]]:
    """The topics a DeleteTopics request deletes: one entry per topic, `topic` only (by name before v6,
    by name or topic id since)."""
    names = getattr(req, "topic_names", None)
    if names is not None:
        return [{"topic": str(name)} for name in names]
    return [{"topic": _topic_name(topic, topic_names)} for topic in req.topics]


def delete_topics_response_partitions(resp: Any, topic_names: TopicNames | None = None) -> list[dict[str, Any]]:
    """A DeleteTopics response: `topic` and `error_code` per topic (0: deleted)."""
    return [{"topic": _topic_name(topic, topic_names), "error_code": int(topic.error_code)} for topic in resp.responses]


def side_records(raw: bytes | memoryview, api: str | None, direction: str | None, partition: Mapping[str, Any]) -> list[dict[str, Any]] | None:
    """The `records` of a version-3 partition from its raw batches (read from the side file).

    The same views a version-2 event carried: a Fetch response's records at
    their offsets, a Produce request's without, a Produce response's at
    base_offset + i when the partition succeeded. None when the bytes are not
    valid batches.
    """
    return side_batch_records(side_batches(raw, api, direction, partition), api, direction, partition)


class SeenBatches:
    """Record batches a reader of a trace decoded, by their bytes, and the record views of those a
    Fetch returned.

    A trace holds the same batches many times over: every Fetch of a record returns the batch its
    Produce sent (with a base offset), and consumers read a range again (after a rebalance or an
    abort; read_committed polls that wait on a transaction). In the bench's trace of 100,000
    operations four batches of five a reader meets are repeats. Cleared whole when the regions read
    since pass `limit_bytes` (the records and views kept with the batches are of the same order).

    A Fetch's views are shared by every response that returned the batch: never change one.
    """

    def __init__(self, limit_bytes: int = 16 << 20) -> None:
        self.limit_bytes = limit_bytes
        self.batches: dict[bytes, list[RecordTuple]] = {}
        # (id of a batch's records, its base offset) -> (the records, their views at their offsets): all
        # else a view holds is in the bytes the records were found by. The records are held so that
        # their id is never another's while the entry lives.
        self._views: dict[tuple[int, int], tuple[list[RecordTuple], list[dict[str, Any]]]] = {}
        self._held_bytes = 0

    def decoded(self, raw: bytes | memoryview, where: str) -> list[tuple[tuple[int, ...], list[RecordTuple]]] | None:
        # Counted by the regions read, an upper bound of the new batches kept (a found one adds nothing).
        self._held_bytes += len(raw)
        if self._held_bytes > self.limit_bytes:
            self.batches.clear()
            self._views.clear()
            self._held_bytes = len(raw)
        return _decoded(raw, where, self.batches)

    def fetched_views(self, batches: list[tuple[tuple[int, ...], list[RecordTuple]]]) -> list[dict[str, Any]]:
        views: list[dict[str, Any]] = []
        for batch in batches:
            key = id(batch[1]), batch[0][0]
            entry = self._views.get(key)
            if entry is None or entry[0] is not batch[1]:
                entry = self._views[key] = (batch[1], _record_views((batch,), with_offsets=True))
            views.extend(entry[1])
        return views


def side_batches(
    raw: bytes | memoryview, api: str | None, direction: str | None, partition: Mapping[str, Any],
    seen: SeenBatches | None = None,
) -> list[tuple[tuple[int, ...], list[RecordTuple]]] | None:
    """A side-file region's batches (kproxy.protocol.records.batch_tuples), or None, logged, when they
    are not valid batches. A Produce response points at its request's region: a reader may decode it once
    for both (side_batch_records). `seen`: the batches the reader decoded before."""
    where = f"{api} {direction} {partition.get('topic')}-{partition.get('partition')}"
    return _decoded(raw, where) if seen is None else seen.decoded(raw, where)


def side_batch_records(
    batches: list[tuple[tuple[int, ...], list[RecordTuple]]] | None, api: str | None, direction: str | None,
    partition: Mapping[str, Any], seen: SeenBatches | None = None,
) -> list[dict[str, Any]] | None:
    """side_records from the region's side_batches; `seen`, the reader's SeenBatches, shares a Fetch's
    views of a batch between the responses that returned it."""
    if batches is None:
        return None
    if api == "fetch" and seen is not None:
        return seen.fetched_views(batches)
    views = _record_views(batches, with_offsets=api == "fetch")
    if api == "produce" and direction == "response":
        base = partition.get("base_offset")
        assigned = partition.get("error_code") == 0 and base is not None and base >= 0
        for i, view in enumerate(views):
            view["offset"] = base + i if assigned else None
    return views
