"""The exactly-once check's two grouped passes on literal tables: no Spark, no trace."""

from __future__ import annotations

import random
from typing import Any

import pyarrow as pa

from kproxy_spark.wire.exactly_once_pass import (
    COMMIT,
    DECIDED,
    END,
    LINK,
    LOGGED,
    OUTPUT,
    READ,
    by_partition,
    by_producer,
)

TID, PID = "etl", 7

PRODUCER_ROWS = pa.schema([
    ("kind", pa.int32()), ("txn_id", pa.string()), ("txn_pid", pa.int64()), ("txn_epoch", pa.int32()),
    ("txn_client", pa.int64()), ("group_id", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
    ("committed_offset", pa.int64()), ("mono_ns", pa.int64()), ("conn_id", pa.int64()),
    ("correlation_id", pa.int32()), ("at_ns", pa.int64()), ("ok", pa.bool_()), ("copy", pa.int32()),
    ("taken", pa.bool_()), ("commit", pa.bool_()), ("rule", pa.string()), ("committed_records", pa.int64()),
    ("aborted_records", pa.int64()), ("output_rules", pa.list_(pa.string())),
])
PARTITION_ROWS = pa.schema([
    ("kind", pa.int32()), ("group_id", pa.string()), ("topic", pa.string()), ("partition", pa.int32()),
    ("offset", pa.int64()), ("at_ns", pa.int64()), ("decided_commit", pa.bool_()), ("decided_rule", pa.string()),
    ("mono_ns", pa.int64()), ("conn_id", pa.int64()), ("correlation_id", pa.int32()), ("txn_id", pa.string()),
    ("txn_client", pa.int64()), ("listed", pa.bool_()),
])


def txn(client: int, epoch: int = 0) -> dict[str, Any]:
    return {"txn_id": TID, "txn_pid": PID, "txn_epoch": epoch, "txn_client": client}


def commit(client: int, at: int | None, offset: int, ok: bool = True, epoch: int = 0, **more: Any) -> dict:
    return {"kind": COMMIT, **txn(client, epoch), "group_id": "g", "topic": "in", "partition": 0,
            "committed_offset": offset, "mono_ns": (at or 0) - 1, "conn_id": 1, "correlation_id": client * 10,
            "at_ns": at, "ok": ok, **more}


def end(client: int, at: int | None, commit: bool, taken: bool = True, copy: int = 0, rule: str | None = None,
        epoch: int = 0, mono: int | None = None) -> dict:
    return {"kind": END, **txn(client, epoch), "mono_ns": mono if mono is not None else (at or 0) - 1,
            "conn_id": 1, "correlation_id": client * 10 + 1, "copy": copy, "at_ns": at, "taken": taken,
            "commit": commit, "rule": rule}


def output(client: int, committed: int, aborted: int = 0, rules: tuple[str, ...] = ()) -> dict:
    return {"kind": OUTPUT, **txn(client), "committed_records": committed, "aborted_records": aborted,
            "output_rules": list(rules), "mono_ns": client * 100, "conn_id": 2, "correlation_id": client}


def producer(*rows: dict) -> list[dict]:
    return by_producer(pa.Table.from_pylist(list(rows), PRODUCER_ROWS)).to_pylist()


def decisions(*rows: dict) -> list[tuple]:
    return [(r["to_offset"], r["decided_ns"], r["decided_commit"], r["decided_rule"])
            for r in producer(*rows) if r["kind"] == DECIDED]


def test_an_offset_commit_is_decided_by_the_first_end_txn_of_its_session_the_broker_took_at_or_after_it():
    rows = (commit(1, 100, 10), end(1, 90, True), end(1, 110, True, taken=False), end(1, 120, True, epoch=1),
            end(1, 150, False, copy=1, rule="dup"), end(2, 200, True))
    # Not the one before, not the refused one, not another session's: the stale copy at 150, whatever
    # transaction the client meant it for.
    assert decisions(*rows) == [(10, 150, False, "dup")]
    shuffled = list(rows)
    random.Random(3).shuffle(shuffled)
    assert decisions(*shuffled) == [(10, 150, False, "dup")]


def test_at_one_instant_the_first_sent_decides_and_undecided_or_refused_commits_are_no_link():
    assert decisions(commit(1, 100, 10), end(1, 150, True, mono=9, rule="late"),
                     end(1, 150, False, mono=5, copy=1, rule="stale")) == [(10, 150, False, "stale")]
    # At the same instant as the commit.
    assert decisions(commit(1, 100, 10), end(1, 100, True), end(1, 150, False)) == [(10, 100, True, None)]
    assert decisions(commit(1, 100, 10, ok=False), end(1, 150, True)) == []
    assert decisions(commit(1, None, 10), end(1, 150, True)) == []
    assert decisions(commit(1, 200, 10), end(1, 150, True)) == []
    # Nor does a later session's.
    assert decisions(commit(1, 200, 10), end(1, 150, True), end(1, 250, True, epoch=1)) == []


def cases(rows: list[dict]) -> list[tuple]:
    return sorted((r["kind"], r["txn_client"], r["topic"], r["to_offset"], r["missing"], r["rules"])
                  for r in rows if r["kind"] != DECIDED)


def test_output_and_offsets_that_did_not_commit_together_are_cases():
    found = cases(producer(
        # 1: the offsets' transaction was aborted by a stale copy, its output committed.
        commit(1, 100, 10), end(1, 110, False, copy=1, rule="stale"), output(1, 3, rules=("early",)),
        # 2: the offsets committed, every output record aborted.
        commit(2, 200, 20), end(2, 210, True), output(2, 0, aborted=4),
        # 3: both committed: no case.
        commit(3, 300, 30), end(3, 310, True), output(3, 5)))
    assert found == [("offsets-without-output", 2, "in", 20, 4, []),
                     ("output-without-offsets", 1, "in", 10, 3, ["early", "stale"])]


def test_output_of_a_transaction_its_client_aborted_before_sending_offsets_is_a_case_of_the_producer_s_group():
    rows = [commit(1, 100, 10), end(1, 110, True),
            output(2, 2, rules=("stale",)), end(2, 190, True, taken=False, copy=1), end(2, 200, False)]
    [case] = [r for r in producer(*rows) if r["kind"] != DECIDED]
    assert (case["kind"], case["group_id"], case["topic"], case["txn_client"], case["missing"], case["rules"]) == (
        "output-without-offsets", "g", None, 2, 2, ["stale"])
    # The client's last word was a commit: no case.
    rows[-1] = end(2, 200, True)
    assert cases(producer(*rows)) == []


def link(offset: int, decided: int, committed: bool = True, rule: str | None = None, group: str = "g",
         partition: int = 0) -> dict:
    return {"kind": LINK, "group_id": group, "topic": "in", "partition": partition, "offset": offset,
            "at_ns": decided, "decided_commit": committed, "decided_rule": rule, "mono_ns": decided - 5,
            "conn_id": 1, "correlation_id": decided, "txn_id": TID, "txn_client": decided // 100}


def logged(*offsets: int, partition: int = 0) -> list[dict]:
    return [{"kind": LOGGED, "topic": "in", "partition": partition, "offset": o} for o in offsets]


def read(at: int, *offsets: int, listed: bool = False, partition: int = 0) -> list[dict]:
    return [{"kind": READ, "topic": "in", "partition": partition, "offset": o, "at_ns": at, "listed": listed}
            for o in offsets]


def chain(rows: list[dict], members: frozenset[str] = frozenset()) -> list[tuple]:
    shuffled = list(rows)
    random.Random(5).shuffle(shuffled)
    found = by_partition(pa.Table.from_pylist(shuffled, PARTITION_ROWS), members).to_pylist()
    return sorted((r["kind"], r["partition"], r["from_offset"], r["to_offset"], r["offsets"], r["missing"],
                   r["rules"], r["causes"]) for r in found)


def test_a_committed_offset_that_goes_back_is_an_overlap_the_clients_doing_only_in_a_group_without_members():
    rows = [link(10, 100, rule="first"), link(5, 200), link(7, 150, committed=False)]
    assert chain(rows) == [("overlap", 0, 5, 10, [], 0, ["first"], ["unowned-partitions"])]
    assert chain(rows, frozenset({"g"})) == [("overlap", 0, 5, 10, [], 0, ["first"], [])]


def test_input_no_consumer_was_delivered_while_its_transaction_was_made_is_a_gap():
    rows = [link(0, 100), link(4, 300), *logged(0, 1, 2, 3, 4), *read(150, 0, 1, 3), *read(350, 2)]
    # Offset 2 came only after the commit at 300; offset 4 is the next link's.
    assert chain(rows) == [("gap", 0, 0, 4, [2], 1, [], [])]
    assert chain(rows + read(300, 2)) == []  # at the instant of the commit's decision: in time
    # Served, but listed as aborted to a read_committed consumer: the broker's list explains it.
    assert chain(rows + read(160, 2, listed=True)) == [("gap", 0, 0, 4, [2], 1, [], ["listed-as-aborted"])]
    # The same on another partition, and a link of another group, are chains of their own.
    other = [link(0, 100, partition=1), link(4, 300, partition=1), *logged(0, 1, 2, 3, partition=1),
             *read(150, 0, 1, 2, 3, partition=1), link(0, 100, group="h"), link(4, 300, group="h")]
    assert chain(rows + other) == [("gap", 0, 0, 4, [2], 1, [], []), ("gap", 0, 0, 4, [2], 1, [], [])]


def test_after_an_aborted_transaction_the_input_below_its_offset_must_be_delivered_again():
    rows = [link(0, 100), link(6, 400, rule="late"), link(3, 200, committed=False, rule="stale"),
            link(5, 400, committed=False, rule="at-the-commit"), link(9, 100, committed=False, rule="at-the-prev"),
            *logged(0, 1, 2, 3, 4, 5), *read(150, 0, 1, 2, 3),
            *read(250, 0, 4, 5)]
    # 1 and 2 lie below the aborted transaction's offset 3 and came only before the abort at 200.
    assert chain(rows) == [("gap", 0, 0, 6, [1, 2], 2, ["late", "stale"], ["not-back-after-abort"])]
    assert chain(rows + read(200, 1, 2)) == chain(rows)  # at the abort's instant: not after it
    assert chain(rows + read(400, 1, 2)) == []  # at the commit's decision: in time
    # A consumer that fetches ahead is not held to more: 3 and above need not come again; aborts decided at
    # the instant of either commit are not between them.
    assert chain(rows + read(260, 1, 2)) == []
