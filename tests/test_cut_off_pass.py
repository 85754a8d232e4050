"""The cut-off records' grouped pass on literal tables: no Spark, no trace."""

from __future__ import annotations

import pyarrow as pa

from kproxy_spark.wire.cut_off_pass import OWN, STALE, cut_off_by_stale_end_txns


def records(*rows: tuple) -> pa.Table:
    """(txn_id, offset, produce_delivery_ns) per record; producer 7, epoch 0."""
    return pa.table({
        "txn_id": pa.array([r[0] for r in rows], pa.string()),
        "txn_pid": pa.array([7] * len(rows), pa.int64()),
        "txn_epoch": pa.array([0] * len(rows), pa.int32()),
        "offset": pa.array([r[1] for r in rows], pa.int64()),
        "produce_delivery_ns": pa.array([r[2] for r in rows], pa.int64()),
    })


def ends(*rows: tuple) -> pa.Table:
    """(txn_id, kind, delivery_ns, response_ns, correlation_id, rule) per EndTxn; producer 7, epoch 0."""
    return pa.table({
        "txn_id": pa.array([r[0] for r in rows], pa.string()),
        "txn_pid": pa.array([7] * len(rows), pa.int64()),
        "txn_epoch": pa.array([0] * len(rows), pa.int32()),
        "kind": pa.array([r[1] for r in rows], pa.int32()),
        "delivery_ns": pa.array([r[2] for r in rows], pa.int64()),
        "response_ns": pa.array([r[3] for r in rows], pa.int64()),
        "conn_id": pa.array([1] * len(rows), pa.int64()),
        "correlation_id": pa.array([r[4] for r in rows], pa.int64()),
        "copy": pa.array([1 if r[1] == STALE else 0 for r in rows], pa.int64()),
        "end_txn_commit": pa.array([True] * len(rows), pa.bool_()),
        "rule": pa.array([r[5] for r in rows], pa.string()),
    })


def cut(record_rows: pa.Table, end_rows: pa.Table) -> dict[int, tuple]:
    out = cut_off_by_stale_end_txns(record_rows, end_rows).to_pylist()
    return {r["offset"]: (r["stale"]["correlation_id"], r["stale"]["rule"]) for r in out}


def test_a_stale_end_txn_answered_after_the_own_one_and_before_the_produce_cuts_the_record_off():
    found = cut(records(("a", 0, 100), ("a", 1, 300)),
                ends(("a", OWN, 50, 55, 1, None), ("a", STALE, 60, 70, 2, "dup"), ("a", OWN, 200, 210, 3, None)))
    # Offset 0: began at 50, the stale copy answered at 70, before its Produce at 100. Offset 1: began at
    # 200, after the stale copy was answered: not cut off.
    assert found == {0: (2, "dup")}


def test_the_latest_stale_end_txn_before_the_produce_is_the_one_kept():
    found = cut(records(("a", 0, 100)),
                ends(("a", STALE, 10, 20, 2, "first"), ("a", STALE, 30, 40, 3, "second"),
                     ("a", STALE, 90, 100, 4, "at-the-produce")))
    # No own EndTxn before: the transaction began with the session. The one answered at 100 is not before.
    assert found == {0: (3, "second")}
    shuffled = ends(("a", STALE, 30, 40, 3, "second"), ("a", STALE, 90, 100, 4, "at-the-produce"),
                    ("a", STALE, 10, 20, 2, "first"))
    assert cut(records(("a", 0, 100)), shuffled) == {0: (3, "second")}


def test_at_the_same_instant_the_last_by_connection_correlation_and_copy_is_kept_whatever_the_row_order():
    one = ends(("a", STALE, 10, 40, 5, "late-id"), ("a", STALE, 10, 40, 3, "early-id"))
    other = ends(("a", STALE, 10, 40, 3, "early-id"), ("a", STALE, 10, 40, 5, "late-id"))
    assert cut(records(("a", 0, 100)), one) == cut(records(("a", 0, 100)), other) == {0: (5, "late-id")}


def test_another_sessions_end_txns_neither_begin_nor_cut_a_record():
    rows = cut_off_by_stale_end_txns(records(("a", 0, 100), ("b", 0, 100)), ends(
        ("b", STALE, 10, 20, 2, "dup"), ("a", OWN, 30, 35, 1, None), ("b", OWN, 5, 6, 9, None))).to_pylist()
    # Session a has no stale EndTxn; session b's began at 5 and its stale copy was answered at 20. The
    # session's key is not among the output's columns.
    assert [(r["produce_delivery_ns"], r["stale"]["rule"]) for r in rows] == [(100, "dup")]
    assert "txn_id" not in rows[0]
    # A session that sorts before the record's, with a stale EndTxn before the record's Produce (answered at
    # 20, its own record's Produce at 10): it cuts off nothing of another session.
    rows = cut_off_by_stale_end_txns(records(("b", 1, 10), ("a", 0, 100)), ends(("b", STALE, 15, 20, 2, "dup")))
    assert rows.num_rows == 0


def test_no_records_give_no_columns_and_no_end_txns_no_rows():
    assert cut_off_by_stale_end_txns(records(), ends(("a", STALE, 10, 20, 2, "dup"))).num_columns == 0
    none = cut_off_by_stale_end_txns(records(("a", 0, 100)), ends())
    assert none.num_rows == 0 and none.column_names == ["offset", "produce_delivery_ns", "stale"]
