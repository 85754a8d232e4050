"""Response-field rewrites the fault rules apply to Produce and Fetch responses.

Each function takes a decoded kio response payload (any version) and returns
a new payload built with `dataclasses.replace`; the input is never changed.
They reproduce broker misbehaviour observed in the wild: an error that still
carries offset 0 (Bufstream), a stale high watermark or last stable offset
(consumers stall), records or transaction markers or the aborted index
missing from a Fetch (lost writes, aborted reads).

`topics` selects the topics a rewrite touches: None for all, a collection of
topic names, or a predicate on the name. Fetch and Produce v13+ name topics
by id; pass `topic_names` (id -> name, learnt from Metadata) to select them
by name, else they are matched by the id as text.

Record bytes are only ever sliced, never re-encoded: when control batches
are removed, the data batches that stay are byte-for-byte what the broker
sent, so their CRCs stay valid.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from kio.schema.errors import ErrorCode

from kproxy.protocol.compression import with_codec
from kproxy.protocol.records import (
    CONTROL_FLAG,
    NO_SEQUENCE,
    BatchSpan,
    Record,
    RecordBatch,
    RecordDecodeError,
    decode_batches,
    encode_batch,
    scan_batches,
)
from kproxy.protocol.record_views import TopicNames, topic_text

TopicSelector = Collection[str] | Callable[[str], bool] | None
CONTROL_KINDS = ("commit", "abort")


def _selected(topics: TopicSelector, name: str) -> bool:
    if topics is None:
        return True
    if callable(topics):
        return bool(topics(name))
    return name in topics


def _map_fetch_partitions(
    resp: Any, change: Callable[[Any], Any], topics: TopicSelector, topic_names: TopicNames | None
) -> Any:
    responses = tuple(
        replace(topic, partitions=tuple(change(p) for p in topic.partitions))
        if _selected(topics, topic_text(topic, topic_names))
        else topic
        for topic in resp.responses
    )
    return replace(resp, responses=responses)


def produce_error_with_offset(
    resp: Any,
    error_code: int,
    offset: int = 0,
    topics: TopicSelector = None,
    partitions: Collection[int] | None = None,
    topic_names: TopicNames | None = None,
) -> Any:
    """Selected partitions report `error_code` and still carry base_offset `offset` (default 0).

    A client that trusts the offset of a failed write records a write at
    offset 0 (the spurious zero offset seen in Bufstream).
    """
    code = ErrorCode(error_code)

    def change(part: Any) -> Any:
        if partitions is not None and part.index not in partitions:
            return part
        return replace(part, error_code=code, base_offset=offset)

    responses = tuple(
        replace(topic, partition_responses=tuple(change(p) for p in topic.partition_responses))
        if _selected(topics, topic_text(topic, topic_names))
        else topic
        for topic in resp.responses
    )
    return replace(resp, responses=responses)


def _offset_floor(part: Any) -> int:
    # Offsets below the log start do not exist; a stale offset never goes there.
    log_start = getattr(part, "log_start_offset", -1)
    return max(log_start, 0)


def _check_lag(lag: int) -> None:
    if lag < 0:
        raise ValueError(f"a stale offset lags behind, so lag must be >= 0, not {lag}")


def fetch_stale_high_watermark(
    resp: Any, lag: int, topics: TopicSelector = None, topic_names: TopicNames | None = None
) -> Any:
    """Report each high watermark `lag` offsets lower, never below the log start offset.

    The last stable offset is lowered with it where it would exceed the new
    high watermark (it never does on a real broker). Records are kept: add
    fetch_drop_records to hide them as well. Unknown offsets (-1) stay.
    """
    _check_lag(lag)

    def change(part: Any) -> Any:
        if part.high_watermark < 0:
            return part
        hwm = max(part.high_watermark - lag, _offset_floor(part))
        lso = getattr(part, "last_stable_offset", None)
        if lso is not None and lso > hwm:
            return replace(part, high_watermark=hwm, last_stable_offset=hwm)
        return replace(part, high_watermark=hwm)

    return _map_fetch_partitions(resp, change, topics, topic_names)


def fetch_stale_last_stable_offset(
    resp: Any, lag: int, topics: TopicSelector = None, topic_names: TopicNames | None = None
) -> Any:
    """Report each last stable offset `lag` offsets lower, never below the log start offset.

    Fetch v0-v3 carry no last stable offset; those responses come back unchanged.
    """
    _check_lag(lag)

    def change(part: Any) -> Any:
        lso = getattr(part, "last_stable_offset", -1)
        if lso < 0:
            return part
        return replace(part, last_stable_offset=max(lso - lag, _offset_floor(part)))

    return _map_fetch_partitions(resp, change, topics, topic_names)


def fetch_drop_records(resp: Any, topics: TopicSelector = None, topic_names: TopicNames | None = None) -> Any:
    """Selected partitions return no records (offsets and markers lists unchanged)."""

    def change(part: Any) -> Any:
        return part if part.records is None else replace(part, records=b"")

    return _map_fetch_partitions(resp, change, topics, topic_names)


def without_control_batches(records: bytes, kinds: Collection[str] = CONTROL_KINDS) -> bytes:
    """`records` with the control batches of the given kinds cut out, everything else byte-exact.

    Legacy message sets and a truncated trailing batch are kept as they are;
    bytes whose batch layout cannot be read are returned unchanged.
    """
    view = memoryview(records)
    try:
        spans = list(scan_batches(view))
        dropped = {
            s.start
            for s in spans
            if s.complete
            and s.is_control
            and decode_batches(view[s.start : s.end], verify_crc=False)[0].control_type in kinds
        }
    except RecordDecodeError:
        return records
    if not dropped:
        return records
    return b"".join(view[s.start : s.end] for s in spans if s.start not in dropped)


def fetch_drop_control_batches(
    resp: Any,
    kinds: Collection[str] = CONTROL_KINDS,
    topics: TopicSelector = None,
    topic_names: TopicNames | None = None,
) -> Any:
    """Remove transaction markers (commit and/or abort) from the records of a Fetch response.

    Without its ABORT marker, an aborted transaction's records look like they
    belong to a still-open transaction or, to some clients, like committed data.
    """
    unknown = set(kinds) - set(CONTROL_KINDS)
    if unknown:
        raise ValueError(f"control batch kinds are {CONTROL_KINDS}, not {sorted(unknown)}")

    def change(part: Any) -> Any:
        if not part.records:
            return part
        kept = without_control_batches(bytes(part.records), kinds)
        return part if len(kept) == len(part.records) else replace(part, records=kept)

    return _map_fetch_partitions(resp, change, topics, topic_names)


def fetch_drop_aborted_transactions(
    resp: Any, topics: TopicSelector = None, topic_names: TopicNames | None = None
) -> Any:
    """Empty the aborted-transactions list, so read_committed clients keep aborted records.

    A null list (read_uncommitted, or Fetch before v4) stays null.
    """

    def change(part: Any) -> Any:
        if getattr(part, "aborted_transactions", None) is None:
            return part
        return replace(part, aborted_transactions=())

    return _map_fetch_partitions(resp, change, topics, topic_names)


def _data_spans(spans: list[BatchSpan]) -> list[BatchSpan]:
    return [s for s in spans if s.complete and s.magic == 2 and not s.is_control]


def without_middle_batch(records: bytes) -> bytes:
    """`records` with one complete data batch cut out, one that has a later data batch after it.

    Of n >= 2 complete data batches the one at index (n - 1) // 2 goes: the
    middle one, or the first of two. The last data batch always stays, so a
    consumer reads past the gap and its position moves beyond records it
    never saw. Fewer than two data batches, or bytes whose layout cannot be
    read: returned unchanged. Everything kept is byte-exact.
    """
    view = memoryview(records)
    try:
        spans = list(scan_batches(view))
    except RecordDecodeError:
        return records
    data = _data_spans(spans)
    if len(data) < 2:
        return records
    gone = data[(len(data) - 1) // 2]
    return bytes(view[: gone.start]) + bytes(view[gone.end :])


def fetch_skip_batch(resp: Any, topics: TopicSelector = None, topic_names: TopicNames | None = None) -> Any:
    """Each selected partition loses one data batch from the middle of its records (see without_middle_batch).

    Offsets, high watermark and the later batches stay as the broker sent
    them: what Jepsen saw of Bufstream 0.1.0, whose Fetch responses left out
    acknowledged records that consumers then skipped.
    """

    def change(part: Any) -> Any:
        if not part.records:
            return part
        kept = without_middle_batch(bytes(part.records))
        return part if len(kept) == len(part.records) else replace(part, records=kept)

    return _map_fetch_partitions(resp, change, topics, topic_names)


# Kafka defines control record types 0 (abort) and 1 (commit) for data logs;
# consumers skip a control batch of any other type. Kafka has no "no-op"
# type, so the fix's marker takes one Kafka never defined.
NO_OP_CONTROL_TYPE = 0x7F00


def aborted_batch_starts(records: bytes | memoryview, aborted: Any) -> set[int]:
    """Byte offsets of the transactional data batches a read_committed consumer must skip.

    A batch is aborted when the response says so by either of the two means
    KIP-98 gives: its producer is in the aborted-transactions list with a
    first offset at or below the batch, and no ABORT marker of that producer
    came between; or an ABORT marker of its producer follows it in these
    records with no COMMIT marker of that producer in between (brokers that
    send no list, Tansu among them, still send the markers).
    """
    view = memoryview(records)
    batches = [(s, decode_batches(view[s.start : s.end], verify_crc=False)[0]) for s in scan_batches(view)
               if s.complete and s.magic == 2]
    pending = sorted(((a.producer_id, a.first_offset) for a in (aborted or ())), key=lambda a: a[1])
    listed: set[int] = set()
    starts: set[int] = set()
    open_batches: dict[int, list[int]] = {}  # producer -> data batches since its last marker
    for span, batch in batches:
        while pending and pending[0][1] <= batch.base_offset:
            listed.add(pending.pop(0)[0])
        pid = batch.producer_id
        if batch.is_control:
            kind = batch.control_type
            if kind == "abort":
                starts.update(open_batches.pop(pid, ()))
                listed.discard(pid)
            elif kind == "commit":
                open_batches.pop(pid, None)
            continue
        if not batch.is_transactional:
            continue
        if pid in listed:
            starts.add(span.start)
        open_batches.setdefault(pid, []).append(span.start)
    return starts


def _no_op_marker(batch: RecordBatch) -> bytes:
    """The aborted-only batch as a control batch holding one no-op record at its last offset."""
    last = batch.base_offset + batch.last_offset_delta
    record = Record(offset=last, timestamp=batch.max_timestamp, key=_NO_OP_KEY, value=_NO_OP_VALUE)
    marker = replace(
        batch,
        attributes=with_codec(batch.attributes, "none") | CONTROL_FLAG,
        base_sequence=NO_SEQUENCE,
        records=(record,),
    )
    return encode_batch(marker)


def _emptied(batch: RecordBatch) -> bytes:
    """The batch with its records taken out: header (offsets, producer) kept, record count 0."""
    return encode_batch(replace(batch, attributes=with_codec(batch.attributes, "none"), records=()))


_NO_OP_KEY = struct.pack(">hh", 0, NO_OP_CONTROL_TYPE)
_NO_OP_VALUE = struct.pack(">hi", 0, 0)


def hide_aborted(records: bytes, aborted: Any, end_marker: bool = False) -> bytes:
    """Records as a broker that filters transactions itself would serve them.

    Control batches go; a batch of aborted records (aborted_batch_starts)
    becomes an empty batch, or with `end_marker` a control batch with one
    no-op record at the batch's last offset (the fix WarpStream shipped:
    librdkafka moves past a control record). Committed and
    non-transactional batches are kept byte-exact. Unreadable bytes are
    returned unchanged.
    """
    view = memoryview(records)
    try:
        spans = list(scan_batches(view))
        hidden = aborted_batch_starts(view, aborted)
        out = []
        for span in spans:
            if span.complete and span.is_control:
                continue
            if span.start in hidden:
                (batch,) = decode_batches(view[span.start : span.end], verify_crc=False)
                out.append(_no_op_marker(batch) if end_marker else _emptied(batch))
                continue
            out.append(bytes(view[span.start : span.end]))
    except RecordDecodeError:
        return records
    return b"".join(out)


def fetch_hide_aborted(
    resp: Any, end_marker: bool = False, topics: TopicSelector = None, topic_names: TopicNames | None = None
) -> Any:
    """Filter transactions at the "broker": aborted batches emptied, markers removed, aborted list emptied.

    Reproduces WarpStream's first implementation of read_committed Fetch
    (its post "Kafka transactions explained (twice!)", 2025): a batch that
    held only aborted records came back as an empty batch, with an empty
    AbortedTransactions list. With `end_marker`, the fix: the batch carries
    one no-op control record at its end instead. A null aborted list
    (read_uncommitted, Fetch before v4) marks a response that must show
    aborted records: it is left unchanged.
    """

    def change(part: Any) -> Any:
        aborted = getattr(part, "aborted_transactions", None)
        if aborted is None:
            return part
        if not part.records:
            return part if not aborted else replace(part, aborted_transactions=())
        kept = hide_aborted(bytes(part.records), aborted, end_marker)
        return replace(part, records=kept, aborted_transactions=())

    return _map_fetch_partitions(resp, change, topics, topic_names)
