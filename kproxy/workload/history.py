"""The client history format as code: one Jepsen-style operation per JSON line.

The format is the contract between the workload (which writes it), the EDN
importer and the Spark analysis (which read it); docs/history.md describes it
field by field. Everything that reads or writes a history goes through this
module so the rules live in one place.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import orjson

TYPES = ("invoke", "ok", "fail", "info")
FUNCTIONS = ("send", "poll", "txn", "assign", "subscribe", "crash", "create")
MICRO_OP_FUNCTIONS = ("send", "poll", "txn")
FIELDS = ("index", "time", "process", "type", "f", "value", "error")
REQUIRED_FIELDS = ("index", "time", "process", "type", "f", "value")
_FIELD_SET, _REQUIRED_SET = frozenset(FIELDS), frozenset(REQUIRED_FIELDS)


class HistoryFormatError(ValueError):
    """A history line that breaks the format; the message starts with file:line."""


@dataclass(frozen=True)
class Op:
    """One operation of a history: an invocation or its completion."""

    index: int
    time: int
    process: int
    type: str
    f: str
    value: Any
    error: str | None = None

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "index": self.index,
            "time": self.time,
            "process": self.process,
            "type": self.type,
            "f": self.f,
            "value": self.value,
        }
        if self.error is not None:
            d["error"] = self.error
        return d

    def to_json(self) -> bytes:
        return orjson.dumps(self.to_dict())


# --- value checks -----------------------------------------------------------------


def _is_int(x: object) -> bool:
    # bool is an int in Python, never a key, value or offset here. A decoded
    # line's integers are exactly int: that test comes first (the validation of
    # a large history spends much of its time here).
    return type(x) is int or (isinstance(x, int) and not isinstance(x, bool))


_NAMED_KEYS = ("keys are integers; a history with named keys (Jepsen's :x or \"a\") is numbered by "
               "`kproxy history import`")


def _check_send(mop: list[Any], invoke: bool) -> str | None:
    if len(mop) == 3 and isinstance(mop[1], str):
        return f"send micro-op key {mop[1]!r} is not an integer: {_NAMED_KEYS}"
    if len(mop) != 3 or not _is_int(mop[1]):
        return f"send micro-op must be [\"send\", key, value], got {mop!r}"
    v = mop[2]
    if _is_int(v):
        return None
    if invoke:
        return f"an invoked send carries a plain integer value, got {v!r}"
    if isinstance(v, list) and len(v) == 2 and _is_int(v[0]) and v[0] >= 0 and _is_int(v[1]):
        return None
    return f"send value must be an integer or [offset, value], got {v!r}"


def _check_poll(mop: list[Any], invoke: bool) -> str | None:
    if len(mop) == 1:
        return None
    if invoke or len(mop) != 2 or not isinstance(mop[1], dict):
        return f"poll micro-op must be [\"poll\"] (invoke) or [\"poll\", {{key: [[offset, value], ...]}}], got {mop!r}"
    for key, records in mop[1].items():
        if not (isinstance(key, str) and key.lstrip("-").isascii() and key.lstrip("-").isdigit()):
            return f"poll keys are the decimal text of integer keys, got {key!r}: {_NAMED_KEYS}"
        if not isinstance(records, list):
            return f"poll records of key {key} must be a list, got {records!r}"
        for rec in records:
            # The common shape settled with exact type tests, the rest with _is_int.
            if type(rec) is list and len(rec) == 2 and type(rec[0]) is int and rec[0] >= 0 \
                    and type(rec[1]) is int:
                continue
            if not (isinstance(rec, list) and len(rec) == 2 and _is_int(rec[0]) and rec[0] >= 0 and _is_int(rec[1])):
                return f"poll record of key {key} must be [offset, value], got {rec!r}"
    return None


def check_micro_ops(value: Any, invoke: bool, f: str) -> str | None:
    if not isinstance(value, list) or not value:
        return f"{f} value must be a non-empty list of micro-ops, got {value!r}"
    for mop in value:
        if not isinstance(mop, list) or not mop:
            return f"micro-op must be a non-empty list, got {mop!r}"
        if mop[0] == "send":
            problem = _check_send(mop, invoke)
        elif mop[0] == "poll":
            problem = _check_poll(mop, invoke)
        else:
            problem = f"unknown micro-op {mop[0]!r} (send or poll)"
        if problem:
            return problem
        if f == "send" and mop[0] != "send":
            return "a send operation holds only send micro-ops"
        if f == "poll" and mop[0] != "poll":
            return "a poll operation holds only poll micro-ops"
    return None


def check_value(f: str, type_: str, value: Any) -> str | None:
    """The problem with an op's value, or None when it is well-formed."""
    if f in MICRO_OP_FUNCTIONS:
        return check_micro_ops(value, type_ == "invoke", f)
    if f in ("assign", "subscribe"):
        if not isinstance(value, list) or not all(_is_int(k) for k in value):
            return f"{f} value must be a list of integer keys, got {value!r}: {_NAMED_KEYS}"
        return None
    if f == "crash":
        return None if value is None else f"crash value must be null, got {value!r}"
    if f == "create":
        if not (isinstance(value, list) and len(value) == 3 and _is_int(value[0])
                and isinstance(value[1], str) and _is_int(value[2]) and value[2] >= 0):
            return f"create value must be [key, \"topic\", partition], got {value!r}"
        return None
    return None


def op_from_dict(d: Any) -> Op:
    """Build an Op from one decoded line; raises ValueError describing the problem."""
    if not isinstance(d, dict):
        raise ValueError(f"each line must be a JSON object, got {type(d).__name__}")
    if not d.keys() <= _FIELD_SET:
        raise ValueError(f"unknown field(s) {', '.join(sorted(set(d) - _FIELD_SET))}")
    if not d.keys() >= _REQUIRED_SET:
        raise ValueError(f"missing field(s) {', '.join(k for k in REQUIRED_FIELDS if k not in d)}")
    for k in ("index", "time", "process"):
        if not _is_int(d[k]) or d[k] < 0:
            raise ValueError(f"{k} must be a non-negative integer, got {d[k]!r}")
    if d["type"] not in TYPES:
        raise ValueError(f"type must be one of {', '.join(TYPES)}, got {d['type']!r}")
    if d["f"] not in FUNCTIONS:
        raise ValueError(f"f must be one of {', '.join(FUNCTIONS)}, got {d['f']!r}")
    error = d.get("error")
    if error is not None:
        if not isinstance(error, str):
            raise ValueError(f"error must be a string, got {error!r}")
        if d["type"] in ("invoke", "ok"):
            raise ValueError(f"an {d['type']} op carries no error")
    if d["f"] == "create" and d["type"] != "ok":
        raise ValueError("create ops are always type ok")
    if d["f"] == "crash" and d["type"] not in ("invoke", "info"):
        raise ValueError("crash ops are an invoke and an info completion")
    problem = check_value(d["f"], d["type"], d["value"])
    if problem:
        raise ValueError(problem)
    return Op(d["index"], d["time"], d["process"], d["type"], d["f"], d["value"], error)


# --- writing ----------------------------------------------------------------------


class HistoryWriter:
    """Appends ops to a JSON Lines history; safe to share between threads.

    The writer assigns `index` and `time` under one lock, so the file order is
    the order ops happened and indices are contiguous. Every line is flushed to
    the OS at once, so a killed run leaves a file readable up to its last op.
    """

    def __init__(self, path: str | Path, clock_ns: Callable[[], int] = time.monotonic_ns) -> None:
        self.path = Path(path)
        self._clock_ns = clock_ns
        self._start = clock_ns()
        self._lock = threading.Lock()
        self._next_index = 0
        self._file: BinaryIO = open(self.path, "wb")

    def append(self, process: int, type_: str, f: str, value: Any, error: str | None = None) -> Op:
        problem = check_value(f, type_, value)
        if problem:  # a workload bug: refuse it rather than write a history nobody can read
            raise ValueError(f"refusing to write a malformed {type_} {f}: {problem}")
        with self._lock:
            op = Op(self._next_index, self._clock_ns() - self._start, process, type_, f, value, error)
            self._file.write(op.to_json() + b"\n")
            self._file.flush()
            self._next_index += 1
        return op

    def write_op(self, op: Op) -> Op:
        """Append an op built elsewhere (an import), re-indexed to stay contiguous."""
        with self._lock:
            written = Op(self._next_index, op.time, op.process, op.type, op.f, op.value, op.error)
            self._file.write(written.to_json() + b"\n")
            self._file.flush()
            self._next_index += 1
        return written

    @property
    def count(self) -> int:
        return self._next_index

    def close(self) -> None:
        with self._lock:
            if not self._file.closed:
                self._file.close()

    def __enter__(self) -> HistoryWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- reading and validation -------------------------------------------------------


def read_history(path: str | Path) -> Iterator[Op]:
    """Yield the ops of a history file, checking each line; errors name file:line."""
    path = Path(path)
    with open(path, "rb") as fh:
        for lineno, line in enumerate(fh, 1):
            if not line.strip():
                continue
            yield _op_of_line(path, lineno, line)


def _op_of_line(path: Path, lineno: int, line: bytes) -> Op:
    """One line's op; HistoryFormatError naming path:lineno if it breaks the format."""
    try:
        d = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise HistoryFormatError(f"{path}:{lineno}: not valid JSON: {exc}") from None
    try:
        op = op_from_dict(d)
    except ValueError as exc:
        # A repeated key may be why the op looks wrong: say that first.
        raise HistoryFormatError(f"{path}:{lineno}: {_repeated_key(line) or exc}") from None
    # Most lines (no poll results, no error text) are settled by the first comparison: a line
    # with no more colons than keys at its top cannot name any key twice, escapes or not.
    colons = line.count(b":")
    if colons != len(d) and _may_repeat_a_key(line, d, colons):
        repeated = _repeated_key(line)
        if repeated:
            raise HistoryFormatError(f"{path}:{lineno}: {repeated}")
    return op


# --- repeated keys ------------------------------------------------------------------
#
# JSON leaves an object that names a key twice to the reader: orjson, Python
# and Spark keep the last one, others the first, so `{"type":"ok",...,
# "type":"fail"}` is an ok op to one checker and a failed one to the next.
# Such a line is refused. orjson cannot report repeats, and reading every
# line with Python's json (which can) took 75 % more CPU than orjson and the
# op checks together, so each line is first counted: in an op that passed
# op_from_dict, the only colons outside its error text follow keys (of the
# op, and of its polls' {key: records} maps), so a line with more colons
# than its decoded objects have keys names one twice, or hides a colon in an
# escape; only such a line is parsed again, exactly. The count costs about
# 10 % (docs/reliability.md).


_POLLING = ("poll", "txn")


class _RepeatedKey(ValueError):
    pass


def _refuse_repeats(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(key)
            seen.add(key)
    return obj


def _repeated_key(line: bytes) -> str | None:
    """What is wrong if an object in `line` names a key twice, else None (exact, slow)."""
    try:
        json.loads(line, object_pairs_hook=_refuse_repeats)
    except _RepeatedKey as exc:
        return (f"the key {json.dumps(exc.args[0])} appears twice in one object: JSON readers disagree on "
                "which one counts, so the line is ambiguous")
    except (ValueError, RecursionError):
        return None
    return None


def _may_repeat_a_key(line: bytes, d: dict[str, Any], colons: int) -> bool:
    """Whether `line` (decoded to `d`, a well-formed op, with `colons` colons) may name a key
    twice; cheap, errs towards yes."""
    if b"\\u" in line:  # an escaped colon would not be counted
        return True
    keys = len(d)
    error = d.get("error")
    if error:
        keys += error.count(":")
    if d["f"] in _POLLING:
        for mop in d["value"]:
            if len(mop) == 2:  # a completed poll: ["poll", {key: records}]
                keys += len(mop[1])
    return colons != keys


@dataclass(frozen=True)
class HistoryStats:
    ops: int
    processes: int
    keys: int
    by_type: dict[str, int]


def _keys_of(op: Op) -> Iterable[int]:
    if op.f in MICRO_OP_FUNCTIONS:
        for mop in op.value:
            if mop[0] == "send":
                yield mop[1]
            elif len(mop) == 2:
                yield from (int(k) for k in mop[1])
    elif op.f in ("assign", "subscribe"):
        yield from op.value
    elif op.f == "create":
        yield op.value[0]


def validate_history(path: str | Path) -> HistoryStats:
    """Check a whole history: every line, and the rules that span lines.

    Beyond each line's shape (and no key named twice in one object):
    indices run 0, 1, 2, ...; time never goes backwards; a process has at
    most one open invocation, and a completion matches its process's open
    invocation (same f); and there is at least one op. Raises
    HistoryFormatError naming file:line of the first problem.
    """
    path = Path(path)
    with open(path, "rb") as fh:  # read line by line: a history may be larger than memory
        stats = _validate_lines(path, fh)
    if not stats.ops:
        # `kproxy analyze` refuses it too: there is nothing to judge, and no verdict to give.
        raise HistoryFormatError(f"{path}:1: the history holds no operation (an empty file, or blank lines "
                                 "only): there is nothing to check")
    return stats


def _validate_lines(path: Path, fh: BinaryIO) -> HistoryStats:
    open_invokes: dict[int, Op] = {}
    processes: set[int] = set()
    keys: set[int] = set()
    by_type = dict.fromkeys(TYPES, 0)
    last_time = 0
    count = 0
    for lineno, line in enumerate(fh, 1):
        if not line.strip():
            continue
        op = _op_of_line(path, lineno, line)

        def fail(msg: str) -> None:
            raise HistoryFormatError(f"{path}:{lineno}: {msg}")

        if op.index != count:
            fail(f"index {op.index} out of sequence (expected {count})")
        if op.time < last_time:
            fail(f"time {op.time} goes backwards (previous {last_time})")
        pending = open_invokes.get(op.process)
        if op.type == "invoke":
            if pending is not None:
                fail(f"process {op.process} invokes {op.f} while its {pending.f} (index {pending.index}) is still open")
            open_invokes[op.process] = op
        elif op.f == "create" or (op.f == "crash" and pending is None):
            pass  # creates are notes, not invocations; an imported crash may stand alone
        elif pending is None:
            fail(f"{op.type} {op.f} of process {op.process} completes nothing (no open invocation)")
        elif pending.f != op.f:
            fail(f"{op.type} {op.f} of process {op.process} does not match its open {pending.f} (index {pending.index})")
        else:
            del open_invokes[op.process]
        last_time = op.time
        count += 1
        processes.add(op.process)
        keys.update(_keys_of(op))
        by_type[op.type] += 1
    return HistoryStats(count, len(processes), len(keys), by_type)
