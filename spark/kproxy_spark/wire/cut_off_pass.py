"""Records a rule's stale EndTxn cut off from their own transaction, as one
grouped pass per producer session in plain pyarrow and numpy
(kproxy_spark.wire.facts.cut_off_records runs it; no Spark here, so it is
tested on literal tables).

In each session (TXN_KEY), a record's transaction began when the session's
previous own EndTxn reached the broker (the latest before the record's
Produce did); a stale EndTxn answered after that and before the Produce
arrived ended the record's transaction early. The latest such stale EndTxn
is the one kept. It replaces two joins, a grouping and a `max_by` (about
twenty DataFrame operations, each analysed and compiled anew by the driver
in every analysis: docs/performance-analysis.md).
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kproxy_spark.wire.arrow_groups import TXN_KEY, joint, numbers, session_ids

#: The kinds of EndTxn the pass reads (`kind`): the session's own (no
#: hazard), and a stale copy a rule delivered.
OWN, STALE = 0, 1

#: The fields of the `stale` struct each cut-off record carries.
STALE_FIELDS = (
    ("answered_ns", pa.int64()), ("conn_id", pa.int64()), ("correlation_id", pa.int64()), ("copy", pa.int64()),
    ("commit", pa.bool_()), ("rule", pa.string()),
)


def _latest_before(side: tuple[np.ndarray, np.ndarray], asked: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Per asked (session, time), the index into `side` (session, time, already in the order wanted among
    equal times) of the last row of the same session strictly before that time; -1 where none."""
    if not len(side[0]):
        return np.full(len(asked[0]), -1, dtype=np.int64)
    order = np.lexsort((np.arange(len(side[0])), side[1], side[0]))
    offered, wanted = joint((side[0][order], side[1][order]), asked)
    at = np.searchsorted(offered, wanted, side="left") - 1
    found = (at >= 0) & ((offered[np.maximum(at, 0)] >> 32) == asked[0])
    return np.where(found, order[np.maximum(at, 0)], -1)


def _values_at(values: np.ndarray, index: np.ndarray, missing: int) -> np.ndarray:
    """values[index], `missing` where index is -1."""
    if not len(values):
        return np.full(len(index), missing, dtype=np.int64)
    return np.where(index >= 0, values[np.maximum(index, 0)], missing)


def cut_off_by_stale_end_txns(records: pa.Table, ends: pa.Table) -> pa.Table:
    """Each record a stale EndTxn cut off, with every column of `records` but TXN_KEY and a `stale` struct
    (STALE_FIELDS) of the latest such EndTxn; records none cut off are left out.

    `records` carry TXN_KEY and `produce_delivery_ns`; `ends` are the EndTxns that reached the broker and
    were not refused: TXN_KEY, `kind` (OWN or STALE), `delivery_ns`, and for STALE ones `response_ns`,
    `conn_id`, `correlation_id`, `copy`, `end_txn_commit`, `rule`. Both hold any number of whole sessions.
    A group without records gives a table without columns (Spark's cogroup asks for every key of either
    side)."""
    if records.num_rows == 0:
        return pa.table({})
    kept = [name for name in records.column_names if name not in TXN_KEY]
    if ends.num_rows == 0:
        return _with_stale(records.select(kept).slice(0, 0), ends, np.zeros(0, dtype=np.int64))
    mine, theirs = session_ids(records, ends)
    produced = numbers(records.column("produce_delivery_ns")).astype(np.int64)
    kinds = numbers(ends.column("kind"))
    own = np.flatnonzero(kinds == OWN)
    stale = np.flatnonzero(kinds == STALE)
    # When the record's transaction began: its session's last own EndTxn before the Produce.
    delivered = numbers(pc.fill_null(ends.column("delivery_ns"), 0)).astype(np.int64)
    began_at = _latest_before((theirs[own], delivered[own]), (mine, produced))
    began = _values_at(delivered[own], began_at, np.iinfo(np.int64).min)
    # The last stale EndTxn answered before the Produce arrived (at the same instant, the last by its
    # connection, correlation id and copy, so the choice does not depend on row order).
    answered = numbers(pc.fill_null(ends.column("response_ns"), 0)).astype(np.int64)
    by = np.lexsort(tuple(numbers(pc.fill_null(ends.column(c), -1)).astype(np.int64)[stale]
                          for c in ("copy", "correlation_id", "conn_id")) + (answered[stale], theirs[stale]))
    chosen_at = _latest_before((theirs[stale][by], answered[stale][by]), (mine, produced))
    chosen = _values_at(stale[by], chosen_at, -1)
    cut = (chosen >= 0) & (answered[np.maximum(chosen, 0)] > began)
    rows = np.flatnonzero(cut)
    return _with_stale(records.select(kept).take(pa.array(rows)), ends, chosen[rows])


def _with_stale(records: pa.Table, ends: pa.Table, chosen: np.ndarray) -> pa.Table:
    sources = {"answered_ns": "response_ns", "commit": "end_txn_commit"}
    index = pa.array(chosen, pa.int64())
    fields = [pc.take(ends.column(sources.get(name, name)), index).cast(kind) if ends.num_rows
              else pa.nulls(0, kind) for name, kind in STALE_FIELDS]
    fields = [f.combine_chunks() if isinstance(f, pa.ChunkedArray) else f for f in fields]
    return records.append_column("stale", pa.StructArray.from_arrays(fields, [name for name, _ in STALE_FIELDS]))
