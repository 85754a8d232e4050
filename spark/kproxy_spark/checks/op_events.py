"""The history pass's input: each completed operation's events on each key, packed.

The pass (kproxy_spark.checks.keypass) needs, per key, every completed send
micro-op, every polled record and every membership change that kept the key,
as kproxy_spark.checks.keyview.Event rows. They are made in Python from the
operation's JSON value, one row per (operation, key) with that key's events
packed as JSON text, and unpacked by the pass's own task. Spark's JSON
functions made the same events one row each: three parses of the value and
a shuffle of ten times the rows (a million events for 100,000 operations,
wider than the operations themselves), which cost more than the pass's
checks (docs/performance-analysis.md, "The history pass's input packed per
operation and key").

The rules are those of kproxy_spark.history.flatten_mops:

* a send micro-op ``["send", key, value]`` or ``["send", key, [offset, value]]``;
* a poll micro-op ``["poll", {"key": [[offset, value], ...]}]``, one event
  per record, ``pos`` its place in the key's list;
* an ok or info assign or subscribe, one ``kept`` event per key it lists;
* an operation whose value is not such JSON has no events, and a key that
  is not an integer fails the task (``kproxy analyze`` refuses such a local
  history before Spark starts; this guards histories Spark opens itself).
"""

from __future__ import annotations

from collections.abc import Iterator
from functools import partial
from typing import Any

import orjson
from pyspark.sql import DataFrame

from kproxy_spark.checks.keyview import Event
from kproxy_spark.history import DATA_FS, MEMBERSHIP_FS

#: One row per (completed operation, key): the operation's own fields, then
#: the key's part of its micro-ops as a JSON array of ["send", mop_index, arg],
#: ["poll", mop_index, [[offset, value], ...]] and ["kept"].
PACKED_SCHEMA = (
    "key long, index long, time long, process long, type string, f string, error string, "
    "op_writes int, op_reads boolean, events string"
)
#: What kproxy_spark.history.load_history gives, the columns read here.
OP_COLUMNS = ("index", "time", "process", "type", "f", "value", "error")

_COMPLETED = frozenset({"ok", "info"})
_WRITES = frozenset({"send", "txn"})
_DATA = frozenset(DATA_FS)
_MEMBERSHIP = frozenset(MEMBERSHIP_FS)
_NOT_AN_INTEGER = "history key is not an integer (kproxy history import numbers named keys): "


def integer_key(key: Any) -> int:
    """A micro-op's key as an int: an integer, or an integer's decimal text (a poll map's keys are text)."""
    number = _number(key)
    if number is None:
        raise ValueError(_NOT_AN_INTEGER + (key if type(key) is str else orjson.dumps(key).decode()))
    return number


def _number(value: Any) -> int | None:
    """An offset or value: an integer, its decimal text, or null (what a cast to long reads)."""
    if type(value) is int:
        return value
    if type(value) is str:
        try:
            return int(value)
        except ValueError:
            return None
    return None


def _parsed(text: str | None) -> Any:
    if text is None:
        return None
    try:
        return orjson.loads(text)
    except orjson.JSONDecodeError:
        return None


def _data_events(mops: list) -> tuple[dict[int, list], int, bool]:
    """A send, poll or txn operation's micro-ops by key, its send micro-ops and whether it read a record.

    Each key gets its part of the micro-ops as they are: ``["send", mop_index, arg]`` or
    ``["poll", mop_index, pairs]``; `events_of` reads the records out of them, so a poll's
    records are touched once, in the pass."""
    by_key: dict[int, list] = {}
    writes = 0
    read = False
    for mop_index, mop in enumerate(mops):
        if type(mop) is not list or len(mop) < 2:
            continue
        name = mop[0]
        if name == "send":
            writes += 1
            if mop[1] is not None:  # a null key has no events (Spark's flattening drops it too)
                by_key.setdefault(integer_key(mop[1]), []).append(("send", mop_index, mop[2] if len(mop) > 2 else None))
        elif name == "poll" and type(mop[1]) is dict:
            for key_text, pairs in mop[1].items():
                parts = by_key.setdefault(integer_key(key_text), [])
                if type(pairs) is list and pairs:
                    parts.append(("poll", mop_index, pairs))
                    # Usually settled by the first record.
                    read = read or any(type(pair) is list and len(pair) > 1 and pair[1] is not None for pair in pairs)
    return by_key, writes, read


def pack_batches(batches: Iterator[Any]) -> Iterator[Any]:
    """mapInArrow: batches of operations (OP_COLUMNS) -> batches of PACKED_SCHEMA rows."""
    import pyarrow as pa

    dumps = orjson.dumps
    types = (pa.int64(), pa.int64(), pa.int64(), pa.int64(), pa.string(), pa.string(), pa.string(), pa.int32(),
             pa.bool_(), pa.string())
    names = ("key", "index", "time", "process", "type", "f", "error", "op_writes", "op_reads", "events")
    for batch in batches:
        out: tuple[list, ...] = tuple([] for _ in names)
        keys, indexes, times, processes, kinds, fs, errors, op_writes, op_reads, packed = out
        for index, time, process, type_, f, value, error in zip(*(batch.column(c).to_pylist() for c in OP_COLUMNS)):
            if type_ == "invoke" or type_ is None or f is None:
                continue
            completed = type_ in _COMPLETED
            if f in _DATA:
                mops = _parsed(value)
                if type(mops) is not list:
                    continue
                by_key, writes, read = _data_events(mops)
                writes = writes if completed and f in _WRITES else 0
                read = completed and read
            elif f in _MEMBERSHIP and completed:
                listed = _parsed(value)
                kept = [("kept",)]
                by_key = {key: kept for key in listed if type(key) is int} if type(listed) is list else {}
                writes, read = 0, False
            else:
                continue
            for key, events in by_key.items():
                if not events:
                    continue
                keys.append(key)
                indexes.append(index)
                times.append(time)
                processes.append(process)
                kinds.append(type_)
                fs.append(f)
                errors.append(error)
                op_writes.append(writes)
                op_reads.append(read)
                packed.append(dumps(events).decode())
        yield pa.RecordBatch.from_arrays([pa.array(column, kind) for column, kind in zip(out, types)], names=names)


def key_events(ops: DataFrame) -> DataFrame:
    """Every completed operation's events on each key it touched (PACKED_SCHEMA), for a groupBy("key")."""
    return ops.select(*OP_COLUMNS).mapInArrow(pack_batches, PACKED_SCHEMA)


_new_event = partial(tuple.__new__, Event)


def _record(pair: Any) -> tuple[int | None, int | None]:
    """A polled [offset, value], or a send's: each an integer or null, as a cast to long reads them."""
    if type(pair) is not list:
        return None, None
    return (_number(pair[0]) if pair else None), (_number(pair[1]) if len(pair) > 1 else None)


def events_of(table: Any) -> list[Event]:
    """One key's packed rows (a pyarrow.Table) as Events ordered by (index, mop_index, pos), as KeyView expects."""
    table = table.sort_by([("index", "ascending")])
    loads = orjson.loads
    events: list[Event] = []
    add = events.append
    columns = ("index", "time", "process", "type", "f", "error", "op_writes", "op_reads", "events")
    for index, time, process, type_, f, error, writes, read, packed in zip(
        *(table.column(c).to_pylist() for c in columns)
    ):
        # Packed in micro-op order; one row per operation and key.
        for part in loads(packed):
            kind = part[0]
            if kind == "poll":
                mop_index = part[1]
                for pos, pair in enumerate(part[2]):
                    if type(pair) is not list:
                        continue
                    if len(pair) == 2 and type(pair[0]) is int and type(pair[1]) is int:
                        offset, value = pair
                    else:
                        offset, value = _record(pair)
                    add(_new_event((kind, index, time, process, type_, f, mop_index, pos, offset, value, error,
                                    writes, read)))
            elif kind == "send":
                arg = part[2]
                offset, value = _record(arg) if type(arg) is list else (None, _number(arg))
                add(_new_event((kind, index, time, process, type_, f, part[1], 0, offset, value, error, writes, read)))
            else:
                add(_new_event((kind, index, time, process, type_, f, 0, 0, None, None, error, writes, read)))
    return events
