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

from collections.abc import Callable, Collection
from dataclasses import replace
from typing import Any

from kio.schema.errors import ErrorCode

from kproxy.protocol.records import RecordDecodeError, decode_batches, scan_batches
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
