"""The history pass's input: operations' events per key, packed in Python (kproxy_spark.checks.op_events)."""

import json

import pyarrow as pa
import pytest

from kproxy_spark.checks.op_events import OP_COLUMNS, events_of, pack_batches
from tests.fixtures.spark import op, write_history


def batch(*ops: dict) -> pa.RecordBatch:
    """Operations as load_history gives them: the value as its JSON text."""
    rows = [{**o, "value": None if o.get("value") is None else json.dumps(o["value"])} for o in ops]
    types = [pa.int64()] * 3 + [pa.string()] * 4
    return pa.RecordBatch.from_arrays([pa.array([r.get(c) for r in rows], t) for c, t in zip(OP_COLUMNS, types)],
                                      names=list(OP_COLUMNS))


def events(*ops: dict) -> dict[int, list[tuple]]:
    """key -> its Events as plain tuples, through the packing and the pass's unpacking."""
    table = pa.Table.from_batches(list(pack_batches(iter([batch(*ops)]))))
    keys = sorted(set(table.column("key").to_pylist()))
    return {key: [tuple(e) for e in events_of(table.filter(pa.compute.equal(table.column("key"), key)))]
            for key in keys}


def numbered(*ops: dict) -> list[dict]:
    """Index and time by position, as write_history numbers them (time = (index + 1) ms)."""
    return [{"index": i, "time": (i + 1) * 1_000_000, **o} for i, o in enumerate(ops)]


MS = 1_000_000


# Each expected Event: kind, index, time, process, type, f, mop_index, pos, offset, value, error, op_writes, op_reads.
@pytest.mark.parametrize(("ops", "expected"), [
    # A transaction's sends (with and without an offset) and a poll of two keys; op_writes counts its sends.
    ([op(0, "ok", "txn", [["send", 1, [0, 10]], ["send", 2, 20], ["poll", {"1": [[0, 10], [1, 11]], "2": []}]])],
     {1: [("send", 0, MS, 0, "ok", "txn", 0, 0, 0, 10, None, 2, True),
          ("poll", 0, MS, 0, "ok", "txn", 2, 0, 0, 10, None, 2, True),
          ("poll", 0, MS, 0, "ok", "txn", 2, 1, 1, 11, None, 2, True)],
      2: [("send", 0, MS, 0, "ok", "txn", 1, 0, None, 20, None, 2, True)]}),
    # Invocations have no events; a failed send has events but counts no write; an info send counts.
    ([op(0, "invoke", "send", [["send", 1, 5]]), op(0, "fail", "send", [["send", 1, 5]], error="timeout"),
      op(1, "info", "send", [["send", 1, 6]])],
     {1: [("send", 1, 2 * MS, 0, "fail", "send", 0, 0, None, 5, "timeout", 0, False),
          ("send", 2, 3 * MS, 1, "info", "send", 0, 0, None, 6, None, 1, False)]}),
    # A poll's record without a value is an event, not a read; a poll of nothing has no events.
    ([op(2, "ok", "poll", [["poll", {"3": [[4, None]]}]]), op(2, "ok", "poll", [["poll", {}]]),
      op(2, "ok", "poll", [["poll"]])],
     {3: [("poll", 0, MS, 2, "ok", "poll", 0, 0, 4, None, None, 0, False)]}),
    # An ok or info assign keeps each key it lists; a failed one and a crash keep nothing.
    ([op(1, "ok", "assign", [4, 5]), op(1, "info", "subscribe", [5]), op(1, "fail", "assign", [6]),
      op(1, "info", "crash", None)],
     {4: [("kept", 0, MS, 1, "ok", "assign", 0, 0, None, None, None, 0, False)],
      5: [("kept", 0, MS, 1, "ok", "assign", 0, 0, None, None, None, 0, False),
          ("kept", 1, 2 * MS, 1, "info", "subscribe", 0, 0, None, None, None, 0, False)]}),
    # A value that is not a list of micro-ops has no events; a null key has none (its send still counts).
    ([op(0, "ok", "send", {"not": "mops"}), op(0, "ok", "send", [["send", None, 1], ["send", 7, 2]])],
     {7: [("send", 1, 2 * MS, 0, "ok", "send", 1, 0, None, 2, None, 2, False)]}),
])
def test_each_operation_gives_its_events_per_key(ops, expected):
    assert events(*numbered(*ops)) == expected


def test_a_keys_events_come_ordered_by_index_then_micro_op_then_position():
    first, second = numbered(op(0, "ok", "poll", [["poll", {"1": [[7, 1], [8, 2]]}], ["send", 1, 3]]),
                             op(1, "ok", "send", [["send", 1, 9]]))
    got = events({**first, "index": 5}, {**second, "index": 2})[1]
    assert [(e[1], e[6], e[7]) for e in got] == [(2, 0, 0), (5, 0, 0), (5, 0, 1), (5, 1, 0)]


@pytest.mark.parametrize("value", [[["send", "x", 1]], [["poll", {"x": [[0, 1]]}]], [["send", 1.5, 1]]])
def test_a_key_that_is_not_an_integer_fails_the_task(value):
    with pytest.raises(ValueError, match="history key is not an integer"):
        events(*numbered(op(0, "ok", "txn", value)))


def test_integer_keys_written_as_text_are_read_as_integers():
    assert list(events(*numbered(op(0, "ok", "send", [["send", "12", 3]])))) == [12]


@pytest.mark.spark
def test_the_packed_events_are_the_micro_ops_spark_flattens(spark, tmp_path):
    """The same sends and polled records as kproxy_spark.history.flatten_mops, Spark's own reading."""
    from kproxy_spark.checks.op_events import key_events
    from kproxy_spark.history import flatten_mops, load_history

    path = write_history(tmp_path / "h.jsonl", [
        op(0, "invoke", "txn", [["send", 1, 10], ["poll"]]),
        op(0, "ok", "txn", [["send", 1, [0, 10]], ["send", 2, 20], ["poll", {"1": [[0, 10], [1, 11]], "2": []}]]),
        op(1, "invoke", "poll", [["poll"]]),
        op(1, "ok", "poll", [["poll", {"2": [[0, 20], [1, None]], "3": [[5, 50]]}]]),
        op(2, "invoke", "send", [["send", 3, 50]]),
        op(2, "fail", "send", [["send", 3, 50]], error="timeout"),
    ])
    ops = load_history(spark, path)
    flattened = sorted(
        (r["key"], r["mop"], r["index"], r["mop_index"], r["pos"], r["offset"], r["value"])
        for r in flatten_mops(ops).where("type != 'invoke'").collect()
    )
    table = key_events(ops).toArrow()
    packed = sorted(
        (key, e.kind, e.index, e.mop_index, e.pos, e.offset, e.value)
        for key in set(table.column("key").to_pylist())
        for e in events_of(table.filter(pa.compute.equal(table.column("key"), key)))
    )
    assert packed == flattened and len(packed) == 8
