"""The history reader under fuzzed files: every file is read whole or refused with FILE:LINE.

Hypothesis writes history files from valid operations, mutated ones (a field
dropped, replaced by any JSON value, a micro-op bent out of shape), raw bytes
and broken JSON, and hands them to `read_history` and `validate_history`. Each
call returns the operations or raises `HistoryFormatError` whose message
starts with the file's path and a line number that exists in the file; nothing
else escapes, and a file of valid operations in order always validates.
"""

from __future__ import annotations

import copy
import json
import re
import tempfile
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kproxy.workload.history import HistoryFormatError, read_history, validate_history

VALID_PAIRS = [
    ({"type": "invoke", "f": "send", "value": [["send", 1, 10]]},
     {"type": "ok", "f": "send", "value": [["send", 1, [0, 10]]]}),
    ({"type": "invoke", "f": "poll", "value": [["poll"]]},
     {"type": "ok", "f": "poll", "value": [["poll", {"1": [[0, 10]]}]]}),
    ({"type": "invoke", "f": "txn", "value": [["send", 2, 20], ["poll"]]},
     {"type": "fail", "f": "txn", "value": [["send", 2, 20], ["poll"]], "error": "aborted"}),
    ({"type": "invoke", "f": "assign", "value": [1, 2]}, {"type": "ok", "f": "assign", "value": [1, 2]}),
]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=4),
    max_leaves=15,
)

@st.composite
def valid_ops(draw: Any) -> list[dict[str, Any]]:
    ops: list[dict[str, Any]] = []
    time = 0
    for pair in draw(st.lists(st.sampled_from(VALID_PAIRS), max_size=6)):
        process = draw(st.integers(0, 3))
        for op in pair:
            time += draw(st.integers(0, 1000))
            ops.append({"index": len(ops), "time": time, "process": process, **op})
    return ops

@st.composite
def mutated(draw: Any, ops: list[dict[str, Any]]) -> list[dict[str, Any]]:
    if not ops:
        return ops
    ops = copy.deepcopy(ops)
    op = ops[draw(st.integers(0, len(ops) - 1))]
    field = draw(st.sampled_from(["index", "time", "process", "type", "f", "value", "error", "extra"]))
    how = draw(st.sampled_from(["drop", "replace", "bend"]))
    if how == "drop":
        op.pop(field, None)
    elif how == "replace":
        op[field] = draw(json_values)
    elif isinstance(op.get("value"), list) and op["value"] and isinstance(op["value"][0], list):
        mop = op["value"][0]
        op["value"][0] = draw(st.sampled_from([[], mop[:1], [*mop, 1], [mop[0], "k", mop[-1]], mop + mop]))
    return ops

def lines_of(ops: list[dict[str, Any]]) -> list[bytes]:
    return [json.dumps(op).encode() for op in ops]

histories = st.one_of(
    valid_ops().map(lines_of),
    valid_ops().flatmap(mutated).map(lines_of),
    st.lists(st.binary(max_size=40).map(lambda b: b.replace(b"\n", b"")), max_size=5),
    valid_ops().map(lines_of).flatmap(lambda lines: st.tuples(st.just(lines), st.integers(0, 60)).map(
        lambda t: [*t[0][:-1], t[0][-1][: t[1]]] if t[0] else [])),  # a torn last line
    st.lists(json_values.map(lambda v: json.dumps(v).encode()), max_size=4),
)

LINE = re.compile(r"^(?P<path>.+):(?P<line>\d+): ")

def check_refusal(exc: HistoryFormatError, path: Path, lines: int) -> None:
    match = LINE.match(str(exc))
    assert match and match["path"] == str(path), str(exc)
    assert 1 <= int(match["line"]) <= max(lines, 1), str(exc)

@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(lines=histories)
def test_histories_are_read_whole_or_refused_with_file_and_line(lines: list[bytes]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in lines))
        try:
            ops = list(read_history(path))
        except HistoryFormatError as exc:
            check_refusal(exc, path, len(lines))
        else:
            assert len(ops) <= len(lines)
        try:
            stats = validate_history(path)
        except HistoryFormatError as exc:
            check_refusal(exc, path, len(lines))
        else:
            assert stats.ops == len(ops)

@settings(max_examples=100, deadline=None)
@given(ops=valid_ops().filter(bool))  # a history without operations is refused: nothing to check
def test_valid_histories_always_validate(ops: list[dict[str, Any]]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "history.jsonl"
        path.write_bytes(b"".join(line + b"\n" for line in lines_of(ops)))
        assert validate_history(path).ops == len(ops) == len(list(read_history(path)))
