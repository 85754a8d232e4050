"""The log's two grouped passes, in plain pyarrow and numpy: what
kproxy_spark.wire.landings.landings runs in each group (no Spark here, so
each pass is tested on literal tables).

Each pass's group holds many whole keys (a call into Python per key costs
more than its work).

* ``decide_attempts``, per producer session (TXN_KEY): each landed Produce
  attempt gets the EndTxn that decides it. The first EndTxn of its producer
  delivered at or after the attempt is the one the broker applies to it,
  whatever transaction the client meant it for; when that one carries no
  commit flag, the first EndTxn delivered for the attempt's broker-side
  transaction number.
* ``fold_partitions``, per partition (topic, partition): the landed attempts
  and fetched records fold into one row per offset (the earliest delivered
  attempt first, then the fetches, each column its first known value), and
  each offset gets its fate from the log: the next transaction marker of its
  producer at or after it, else an aborted-transaction start with no marker
  between it and the record.

Both replace what Spark did in windows and joins: about twenty stages, each
a class of generated code the JVM compiled anew in every analysis
(docs/performance-analysis.md).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kproxy_spark.wire.arrow_groups import TXN_KEY, joint, numbers, session_ids, take_or_null

#: What an EndTxn carries onto the records it decides (each prefixed `end_`).
END_TXN_ATTRIBUTION = (
    "conn_id",
    "correlation_id",
    "copy",
    "txn_client",
    "txn_broker",
    "end_txn_commit",
    "hazard",
    "rule",
    "action",
    "outcome",
)
#: When and through which proxy the EndTxn reached the broker, carried with
#: the attribution (as `end_proxy_id`, `end_delivery_ns`) so a Fetch served
#: after it can be told from one served while the transaction was open.
END_TXN_TIMING = ("proxy_id", "delivery_ns")
END_COLUMNS = (*END_TXN_ATTRIBUTION, *END_TXN_TIMING)

#: The rows fold_partitions reads, by their `kind`.
START, PRODUCED, FETCHED, MARKER = 0, 1, 2, 3

#: A producer id for the records that have none: they form one producer of
#: their own, as they did in a window partitioned by producer_id.
NO_PRODUCER = np.iinfo(np.int64).min

def decide_attempts(attempts: pa.Table, ends: pa.Table) -> pa.Table:
    """Landed attempts (every column kept), each with the END_COLUMNS of the
    EndTxn that decides it, prefixed `end_` (null when none does).

    Both tables hold any number of whole producer sessions (TXN_KEY);
    `attempts` carries `produce_delivery_ns` and `txn_broker`, `ends` the
    EndTxns that reached the broker and were not refused (END_COLUMNS and
    mono_ns, each prefixed `end_`). A group without attempts gives a table
    without columns (Spark's cogroup asks for every key of either side)."""
    if attempts.num_rows == 0:
        return pa.table({})
    chosen = np.full(attempts.num_rows, -1, dtype=np.int64)
    if ends.num_rows:
        mine, theirs = session_ids(attempts, ends)
        ends = ends.append_column("_session", pa.array(theirs))
        # The next EndTxn of the session: at the same instant, the least by
        # its attribution, so the choice does not depend on row order.
        order = numbers(pc.sort_indices(ends, sort_keys=[
            ("_session", "ascending"), ("end_delivery_ns", "ascending"),
            *[(f"end_{c}", "ascending") for c in END_COLUMNS]])).astype(np.int64)
        wanted, offered = joint((mine, numbers(attempts.column("produce_delivery_ns"))),
                                 (theirs[order], numbers(ends.column("end_delivery_ns"))[order]))
        at = np.minimum(np.searchsorted(offered, wanted, side="left"), len(order) - 1)
        nxt = np.where((offered[at] >= wanted) & (offered[at] >> 32 == mine), order[at], -1)
        commit = numbers(pc.is_valid(ends.column("end_end_txn_commit")))
        use_next = (nxt >= 0) & commit[np.maximum(nxt, 0)]
        chosen = np.where(use_next, nxt, -1)
        # Else the first EndTxn delivered for the record's broker-side number.
        numbered = numbers(pc.is_valid(ends.column("end_txn_broker")))
        needed = ~use_next & numbers(pc.is_valid(attempts.column("txn_broker")))
        if numbered.any() and needed.any():
            order = numbers(pc.sort_indices(ends, sort_keys=[
                ("end_delivery_ns", "ascending"), ("end_mono_ns", "ascending"),
                ("end_copy", "ascending")])).astype(np.int64)
            order = order[numbered[order]]
            deciders, asked = joint(
                (theirs[order], numbers(ends.column("end_txn_broker"))[order].astype(np.int64)),
                (mine[needed], numbers(attempts.column("txn_broker").filter(pa.array(needed))).astype(np.int64)))
            firsts, where = np.unique(deciders, return_index=True)  # the first of each, in delivery order
            at = np.minimum(np.searchsorted(firsts, asked), len(firsts) - 1)
            chosen[needed] = np.where(firsts[at] == asked, order[where[at]], -1)
    decided = attempts
    for name in (f"end_{c}" for c in END_COLUMNS):
        decided = decided.append_column(name, take_or_null(ends.column(name), chosen) if ends.num_rows else
                                        pa.nulls(attempts.num_rows, ends.schema.field(name).type))
    return decided


def _first_known(column: pa.ChunkedArray, starts: np.ndarray, rows: int) -> pa.Array:
    """Per run of rows beginning at `starts`, the run's first non-null value of `column`."""
    valid = numbers(pc.is_valid(column))
    candidate = np.where(valid, np.arange(rows), rows)
    first = np.minimum.reduceat(candidate, starts)
    return take_or_null(column, np.where(first == rows, -1, first))


def _producers(column: pa.ChunkedArray) -> np.ndarray:
    return numbers(pc.fill_null(column.cast(pa.int64()), NO_PRODUCER))


#: Marker fates, in the order of the codes `_marker_fates` gives them.
COMMITTED, ABORTED = "committed", "aborted"


def _marker_fates(part: np.ndarray, offsets: np.ndarray, producers: np.ndarray,
                  kinds: np.ndarray, controls: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """Per timeline row (its partition's number, offset, producer, kind:
    START, the log's record as PRODUCED, or MARKER, and the marker's control),
    marker_fate and next_marker_fate as codes (0 none, 1 committed, 2
    aborted); only the records' are meant."""
    control = controls.to_pylist()
    # 1 commit, 2 abort, 3 any other control record.
    code = np.array([0 if k != MARKER else 1 if c == "commit" else 2 if c == "abort" else 3
                     for k, c in zip(kinds.tolist(), control)], dtype=np.int8)
    order = np.lexsort((kinds, offsets, producers, part))  # a start before a record at its offset, a marker after
    pid, kind, code, group = producers[order], kinds[order], code[order], part[order]
    size = len(order)
    at = np.arange(size)
    same = lambda other: (pid[other] == pid) & (group[other] == group)  # noqa: E731 - same producer, partition
    # The first marker at or after each row, and the last boundary (marker or start) before it.
    ahead = np.minimum.accumulate(np.where(kind == MARKER, at, size)[::-1])[::-1]
    ahead_at = np.minimum(ahead, size - 1)
    behind = np.concatenate([[-1], np.maximum.accumulate(np.where(kind != PRODUCED, at, -1))[:-1]])
    behind_at = np.maximum(behind, 0)
    next_code = np.where((ahead < size) & same(ahead_at), code[ahead_at], 0)
    next_fate = np.where(next_code == 3, 0, next_code)
    after_start = (behind >= 0) & same(behind_at) & (kind[behind_at] == START)
    marker_fate = np.where(next_fate > 0, next_fate, np.where(after_start, 2, 0))
    fates, nexts = np.empty(size, np.int8), np.empty(size, np.int8)
    fates[order], nexts[order] = marker_fate, next_fate
    return fates, nexts


def _changes(*columns: pa.ChunkedArray) -> np.ndarray:
    """Where any of the (sorted) columns changes value: True at row 0 and at every change."""
    size = len(columns[0])
    changed = np.zeros(size, bool)
    changed[:1] = True
    for column in columns:
        if size > 1:
            changed[1:] |= numbers(pc.fill_null(pc.not_equal(column[1:], column[:-1]), True))
    return changed


def fold_partitions(rows: pa.Table, names: list[str]) -> pa.Table:
    """The log of any number of whole partitions: a row per offset that an
    attempt landed at or a Fetch returned, with `seen_in_fetch`,
    marker_fate and next_marker_fate.

    `rows`: `kind` (START, PRODUCED, FETCHED, MARKER), topic, partition,
    offset, producer_id and control, and the attempts' columns (with the
    deciding EndTxn's, from decide_attempts); the fetched rows carry what a
    Fetch shows of a record. `names`: the result's columns, in order (each
    of `rows`'s type)."""
    if rows.num_rows == 0:
        return pa.table({})
    rows = rows.take(pc.sort_indices(rows, sort_keys=[
        ("topic", "ascending"), ("partition", "ascending"), ("offset", "ascending"), ("kind", "ascending"),
        ("produce_delivery_ns", "ascending"), ("produce_copy", "ascending")]))
    kinds = numbers(rows.column("kind")).astype(np.int8)
    part = np.cumsum(_changes(rows.column("topic"), rows.column("partition")))
    is_record = (kinds == PRODUCED) | (kinds == FETCHED)
    records = rows.filter(pa.array(is_record))
    if records.num_rows == 0:
        return pa.table({})
    size = records.num_rows
    record_kind = kinds[is_record]
    starts = np.flatnonzero(_changes(records.column("topic"), records.column("partition"),
                                     records.column("offset")))
    # The deciding EndTxn travels whole with the earliest delivered attempt.
    attempt = np.where(record_kind[starts] == PRODUCED, starts, -1)
    columns: dict[str, pa.Array] = {}
    for name in names:
        if name == "seen_in_fetch":
            columns[name] = pa.array(np.maximum.reduceat(record_kind == FETCHED, starts))
        elif name.startswith("end_"):
            columns[name] = take_or_null(records.column(name), attempt)
        elif name not in ("marker_fate", "next_marker_fate"):
            columns[name] = _first_known(records.column(name), starts, size)
    # The timeline: the log's records (one per offset), the markers and the aborted-transaction starts.
    bounds = ~is_record
    logged = len(starts)
    timeline_kinds = np.concatenate([np.full(logged, PRODUCED, np.int8), kinds[bounds]])
    fates, nexts = _marker_fates(
        np.concatenate([part[is_record][starts], part[bounds]]),
        np.concatenate([numbers(columns["offset"]), numbers(rows.column("offset"))[bounds]]).astype(np.int64),
        np.concatenate([_producers(columns["producer_id"]), _producers(rows.column("producer_id").filter(
            pa.array(bounds)))]),
        timeline_kinds,
        pa.chunked_array([pa.nulls(logged, rows.schema.field("control").type),
                          *rows.column("control").filter(pa.array(bounds)).chunks],
                         rows.schema.field("control").type))
    words = np.array([None, COMMITTED, ABORTED], dtype=object)
    text = rows.schema.field("control").type
    columns["marker_fate"] = pa.array(words[fates[:logged]], text)
    columns["next_marker_fate"] = pa.array(words[nexts[:logged]], text)
    return pa.table([columns[name] for name in names], names=names)
