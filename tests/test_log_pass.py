"""The log's two grouped passes on literal tables: no Spark, no trace."""

from __future__ import annotations

import pyarrow as pa

from kproxy_spark.wire.log_pass import (
    END_COLUMNS,
    FETCHED,
    MARKER,
    PRODUCED,
    START,
    decide_attempts,
    fold_partitions,
)

ATTEMPT_TYPES = {
    "txn_id": pa.string(), "txn_pid": pa.int64(), "txn_epoch": pa.int32(), "offset": pa.int64(),
    "txn_broker": pa.int64(), "produce_delivery_ns": pa.int64(),
}
END_TYPES = {
    "conn_id": pa.int64(), "correlation_id": pa.int32(), "copy": pa.int32(), "txn_client": pa.int64(),
    "txn_broker": pa.int64(), "end_txn_commit": pa.bool_(), "hazard": pa.string(), "rule": pa.string(),
    "action": pa.string(), "outcome": pa.string(), "proxy_id": pa.string(), "delivery_ns": pa.int64(),
}


def attempts(*rows: tuple) -> pa.Table:
    """(txn_id, offset, txn_broker, delivery_ns) per attempt; producer 7, epoch 0."""
    return pa.table({
        "txn_id": pa.array([r[0] for r in rows], pa.string()),
        "txn_pid": pa.array([7] * len(rows), pa.int64()),
        "txn_epoch": pa.array([0] * len(rows), pa.int32()),
        "offset": pa.array([r[1] for r in rows], pa.int64()),
        "txn_broker": pa.array([r[2] for r in rows], pa.int64()),
        "produce_delivery_ns": pa.array([r[3] for r in rows], pa.int64()),
    })


def ends(*rows: dict) -> pa.Table:
    """EndTxns: txn_id, delivery_ns, txn_broker, end_txn_commit, correlation_id (the rest fixed)."""
    table = {
        "txn_id": pa.array([r["txn_id"] for r in rows], pa.string()),
        "txn_pid": pa.array([7] * len(rows), pa.int64()),
        "txn_epoch": pa.array([0] * len(rows), pa.int32()),
    }
    for name in (*END_COLUMNS, "mono_ns"):
        kind = END_TYPES.get(name, pa.int64())
        default = {"conn_id": 1, "copy": 0, "proxy_id": "p", "mono_ns": None}.get(name)
        values = [r.get(name, r["delivery_ns"] if name == "mono_ns" else default) for r in rows]
        table[f"end_{name}"] = pa.array(values, kind)
    return pa.table(table)


def decided(attempt_rows: pa.Table, end_rows: pa.Table) -> dict[tuple[str, int], tuple]:
    out = decide_attempts(attempt_rows, end_rows).to_pylist()
    return {(r["txn_id"], r["offset"]): (r["end_correlation_id"], r["end_end_txn_commit"]) for r in out}


def test_each_attempt_is_decided_by_its_sessions_next_end_txn_at_or_after_its_delivery():
    got = decided(
        attempts(("a", 0, 1, 10), ("a", 1, 1, 20), ("a", 2, 2, 30), ("b", 0, 1, 15)),
        ends({"txn_id": "a", "delivery_ns": 20, "txn_broker": 1, "end_txn_commit": True, "correlation_id": 5},
             {"txn_id": "a", "delivery_ns": 40, "txn_broker": 2, "end_txn_commit": False, "correlation_id": 6},
             {"txn_id": "b", "delivery_ns": 12, "txn_broker": 1, "end_txn_commit": True, "correlation_id": 7},
             {"txn_id": "b", "delivery_ns": 18, "txn_broker": 2, "end_txn_commit": False, "correlation_id": 8}),
    )
    # Session b's EndTxn at 12 came before its record: the next one, at 18, decides it.
    assert got == {("a", 0): (5, True), ("a", 1): (5, True), ("a", 2): (6, False), ("b", 0): (8, False)}


def test_at_one_instant_the_least_end_txn_by_its_attribution_decides_whatever_the_row_order():
    two = [{"txn_id": "a", "delivery_ns": 20, "txn_broker": 1, "end_txn_commit": c, "correlation_id": n}
           for n, c in ((9, False), (4, True))]
    for rows in (two, two[::-1]):
        assert decided(attempts(("a", 0, 1, 20)), ends(*rows)) == {("a", 0): (4, True)}


def test_after_every_end_txn_the_first_one_of_its_broker_side_number_decides():
    got = decided(
        attempts(("a", 0, 2, 99), ("a", 1, 5, 99), ("a", 2, None, 99), ("a", 3, 6, 99)),
        ends({"txn_id": "a", "delivery_ns": 30, "txn_broker": 2, "end_txn_commit": False, "correlation_id": 3},
             {"txn_id": "a", "delivery_ns": 10, "txn_broker": 2, "end_txn_commit": True, "correlation_id": 1},
             # Delivered at one instant: the first copy decides.
             {"txn_id": "a", "delivery_ns": 50, "txn_broker": 6, "end_txn_commit": False, "correlation_id": 8,
              "copy": 1},
             {"txn_id": "a", "delivery_ns": 50, "txn_broker": 6, "end_txn_commit": True, "correlation_id": 8}),
    )
    assert got == {("a", 0): (1, True), ("a", 1): (None, None), ("a", 2): (None, None), ("a", 3): (8, True)}


def test_a_next_end_txn_without_a_commit_flag_gives_way_to_the_numbered_one():
    got = decided(
        attempts(("a", 0, 2, 20)),
        ends({"txn_id": "a", "delivery_ns": 10, "txn_broker": 2, "end_txn_commit": False, "correlation_id": 1},
             {"txn_id": "a", "delivery_ns": 30, "txn_broker": 3, "end_txn_commit": None, "correlation_id": 2}),
    )
    assert got == {("a", 0): (1, False)}


def test_a_group_with_end_txns_only_gives_no_columns_and_one_without_end_txns_nulls():
    assert decide_attempts(attempts(), ends({"txn_id": "a", "delivery_ns": 1, "txn_broker": 1})).num_columns == 0
    assert decided(attempts(("a", 0, 1, 5)), ends()) == {("a", 0): (None, None)}


NAMES = ["topic", "partition", "offset", "key", "producer_id", "produce_delivery_ns", "produce_copy",
         "seen_in_fetch", "end_rule", "marker_fate", "next_marker_fate"]


def rows(*entries: tuple) -> pa.Table:
    """(kind, partition, offset, producer_id, control, key, delivery_ns, copy, end_rule) per row, topic 't'."""
    columns = list(zip(*entries)) if entries else [[]] * 9
    return pa.table({
        "kind": pa.array(columns[0], pa.int32()),
        "topic": pa.array(["t"] * len(entries), pa.string()),
        "partition": pa.array(columns[1], pa.int32()),
        "offset": pa.array(columns[2], pa.int64()),
        "producer_id": pa.array(columns[3], pa.int64()),
        "control": pa.array(columns[4], pa.string()),
        "key": pa.array(columns[5], pa.string()),
        "produce_delivery_ns": pa.array(columns[6], pa.int64()),
        "produce_copy": pa.array(columns[7], pa.int32()),
        "end_rule": pa.array(columns[8], pa.string()),
    })


def folded(table: pa.Table) -> dict[tuple[int, int], dict]:
    return {(r["partition"], r["offset"]): r for r in fold_partitions(table, NAMES).to_pylist()}


def test_one_row_per_offset_with_the_earliest_attempt_first_and_the_fetches_filling_in():
    log = folded(rows(
        (FETCHED, 0, 5, 7, None, "k5", None, None, None),
        (PRODUCED, 0, 5, 7, None, None, 30, 1, "late"),
        (PRODUCED, 0, 5, 7, None, None, 20, 0, "first"),
        (FETCHED, 0, 6, 7, None, "k6", None, None, None),
        (PRODUCED, 1, 5, 8, None, "other", 10, 0, None),
    ))
    assert set(log) == {(0, 5), (0, 6), (1, 5)}
    assert (log[0, 5]["key"], log[0, 5]["produce_delivery_ns"], log[0, 5]["end_rule"]) == ("k5", 20, "first")
    assert (log[0, 5]["seen_in_fetch"], log[0, 6]["seen_in_fetch"], log[1, 5]["seen_in_fetch"]) == (True, True, False)
    assert (log[0, 6]["end_rule"], log[1, 5]["key"]) == (None, "other")


def test_the_producers_next_marker_in_the_partition_is_the_fate_and_an_aborted_start_covers_the_rest():
    log = folded(rows(
        (PRODUCED, 0, 0, 7, None, "a", 1, 0, None),
        (PRODUCED, 0, 1, 8, None, "b", 1, 0, None),
        (MARKER, 0, 2, 7, "commit", None, None, None, None),
        (PRODUCED, 0, 3, 7, None, "c", 1, 0, None),
        (MARKER, 0, 4, 8, "abort", None, None, None, None),
        (START, 0, 5, 7, None, None, None, None, None),
        (PRODUCED, 0, 5, 7, None, "d", 1, 0, None),
        (PRODUCED, 0, 6, 7, None, "e", 1, 0, None),
        # The same producer id in another partition shares nothing with these.
        (MARKER, 1, 9, 7, "abort", None, None, None, None),
        (PRODUCED, 1, 10, 7, None, "f", 1, 0, None),
        (START, 1, 0, 8, None, None, None, None, None),
        (MARKER, 1, 3, 8, "commit", None, None, None, None),
        (PRODUCED, 1, 4, 8, None, "g", 1, 0, None),
        # Nor does the next partition's marker of the same producer.
        (PRODUCED, 2, 0, 9, None, "h", 1, 0, None),
        (MARKER, 3, 0, 9, "commit", None, None, None, None),
    ))
    fates = {at: (r["marker_fate"], r["next_marker_fate"]) for at, r in log.items()}
    assert fates == {
        (0, 0): ("committed", "committed"),
        (0, 1): ("aborted", "aborted"),
        (0, 3): (None, None),                  # no marker after it, no start before it
        (0, 5): ("aborted", None),             # a start at its own offset
        (0, 6): ("aborted", None),
        (1, 10): (None, None),                 # the abort marker came before it
        (1, 4): (None, None),                  # a commit marker stands between the start and it
        (2, 0): (None, None),
    }


def test_a_partition_with_markers_only_gives_no_columns():
    assert fold_partitions(rows((MARKER, 0, 2, 7, "commit", None, None, None, None)), NAMES).num_columns == 0
    assert fold_partitions(rows(), NAMES).num_columns == 0
