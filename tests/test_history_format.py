"""The client history format: writing, reading, and validation errors that name file:line."""

from __future__ import annotations

import threading
from pathlib import Path

import orjson
import pytest

from kproxy.workload.history import HistoryFormatError, HistoryWriter, Op, read_history, validate_history


def write_lines(path: Path, ops: list[dict]) -> Path:
    path.write_bytes(b"".join(orjson.dumps(op) + b"\n" for op in ops))
    return path


def op(index: int, process: int, type_: str, f: str, value, time: int | None = None, **extra) -> dict:
    return {"index": index, "time": index * 10 if time is None else time, "process": process,
            "type": type_, "f": f, "value": value, **extra}


GOOD = [
    op(0, 0, "ok", "create", [1, "t-1", 0]),
    op(1, 0, "invoke", "assign", [1]),
    op(2, 0, "ok", "assign", [1]),
    op(3, 0, "invoke", "send", [["send", 1, 7]]),
    op(4, 1, "invoke", "txn", [["send", 1, 8], ["poll"]]),
    op(5, 0, "ok", "send", [["send", 1, [0, 7]]]),
    op(6, 1, "fail", "txn", [["send", 1, 8], ["poll"]], error="aborted"),
    op(7, 0, "invoke", "poll", [["poll"]]),
    op(8, 0, "ok", "poll", [["poll", {"1": [[0, 7]]}]]),
    op(9, 2, "invoke", "crash", None),
    op(10, 2, "info", "crash", None),
]


def test_writer_assigns_contiguous_indices_and_monotonic_time(tmp_path: Path) -> None:
    ticks = iter(range(1000, 100000, 7))
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path, clock_ns=lambda: next(ticks)) as w:
        w.append(0, "invoke", "send", [["send", 1, 2]])
        w.append(0, "ok", "send", [["send", 1, [5, 2]]])
        w.append(0, "invoke", "poll", [["poll"]])
        w.append(0, "fail", "poll", [["poll"]], error="UNKNOWN_TOPIC_OR_PART")
    ops = list(read_history(path))
    assert [o.index for o in ops] == [0, 1, 2, 3]
    assert [o.time for o in ops] == [7, 14, 21, 28]  # nanoseconds since the writer started
    assert ops[1] == Op(1, 14, 0, "ok", "send", [["send", 1, [5, 2]]])
    assert ops[3].error == "UNKNOWN_TOPIC_OR_PART"
    assert b'"error"' not in path.read_bytes().splitlines()[1]  # error is omitted when absent


def test_writer_is_safe_to_share_between_threads(tmp_path: Path) -> None:
    path = tmp_path / "h.jsonl"
    with HistoryWriter(path) as w:
        def run(p: int) -> None:
            for v in range(200):
                w.append(p, "invoke", "send", [["send", p, v]])
                w.append(p, "ok", "send", [["send", p, [v, v]]])
        threads = [threading.Thread(target=run, args=(p,)) for p in range(4)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    stats = validate_history(path)
    assert stats.ops == 1600 and stats.processes == 4 and stats.by_type["ok"] == 800


def test_every_line_is_on_disk_before_the_writer_closes(tmp_path: Path) -> None:
    # A run killed mid-way must leave a readable history up to its last op.
    path = tmp_path / "h.jsonl"
    w = HistoryWriter(path)
    w.append(0, "invoke", "poll", [["poll"]])
    w.append(0, "ok", "poll", [["poll", {"3": [[0, 1], [1, 2]]}]])
    assert [o.type for o in read_history(path)] == ["invoke", "ok"]
    w.close()


def test_writer_refuses_malformed_values(tmp_path: Path) -> None:
    with HistoryWriter(tmp_path / "h.jsonl") as w:
        with pytest.raises(ValueError, match="send"):
            w.append(0, "invoke", "send", [["send", 1, [0, 2]]])  # invokes carry no offsets
        with pytest.raises(ValueError, match="create"):
            w.append(0, "ok", "create", [1, 2, 3])
        assert w.count == 0


def test_a_good_history_validates(tmp_path: Path) -> None:
    stats = validate_history(write_lines(tmp_path / "h.jsonl", GOOD))
    assert stats.ops == len(GOOD)
    assert stats.processes == 3
    assert stats.keys == 1
    assert stats.by_type == {"invoke": 5, "ok": 4, "fail": 1, "info": 1}


@pytest.mark.parametrize(
    ("line", "replacement", "message"),
    [
        (4, b"{not json", "not valid JSON"),
        (3, op(2, 0, "ok", "assign", [1], colour="red"), "unknown field"),
        (3, {"index": 2, "time": 20, "process": 0, "type": "ok", "f": "assign"}, "missing field"),
        (4, op(3, 0, "invoke", "send", [["send", "1", 7]]), "send micro-op"),
        (4, op(3, 0, "invoke", "send", [["write", 1, 7]]), "unknown micro-op"),
        (9, op(8, 0, "ok", "poll", [["poll", {"one": [[0, 7]]}]]), "decimal text"),
        (9, op(8, 0, "ok", "poll", [["poll", {"1": [[0]]}]]), "offset, value"),
        # JSON's true is a Python bool, an int subclass: never an offset or a value.
        (9, op(8, 0, "ok", "poll", [["poll", {"1": [[True, 7]]}]]), "offset, value"),
        (9, op(8, 0, "ok", "poll", [["poll", {"1": [[0, False]]}]]), "offset, value"),
        (9, op(8, 0, "ok", "poll", [["poll", {"1": [[-1, 7]]}]]), "offset, value"),
        (9, op(8, 0, "ok", "poll", [["poll", {"1": [[0, 7.0]]}]]), "offset, value"),
        (4, op(3, 0, "invoke", "send", [["send", 1, True]]), "plain integer value"),
        (3, op(2, 0, "ok", "assign", [True]), "integer keys"),
        (4, op(3, 0, "maybe", "send", [["send", 1, 7]]), "type must be one of"),
        (4, op(3, 0, "invoke", "produce", [["send", 1, 7]]), "f must be one of"),
        (6, op(5, 0, "ok", "send", [["send", 1, [0, 7]]], error="x"), "carries no error"),
        (1, op(0, 0, "invoke", "create", [1, "t-1", 0]), "create ops are always type ok"),
        (4, op(7, 0, "invoke", "send", [["send", 1, 7]]), "index 7 out of sequence"),
        (4, op(3, 0, "invoke", "send", [["send", 1, 7]], time=1), "goes backwards"),
        (6, op(5, 3, "ok", "send", [["send", 1, [0, 7]]]), "completes nothing"),
        (6, op(5, 0, "ok", "poll", [["poll", {}]]), "does not match its open send"),
        (6, op(5, 1, "invoke", "poll", [["poll"]]), "still open"),
    ],
)
def test_validation_errors_name_file_and_line(tmp_path: Path, line: int, replacement, message: str) -> None:
    lines = [orjson.dumps(o) for o in GOOD]
    lines[line - 1] = replacement if isinstance(replacement, bytes) else orjson.dumps(replacement)
    path = tmp_path / "bad.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.raises(HistoryFormatError) as info:
        validate_history(path)
    assert str(info.value).startswith(f"{path}:{line}: ")
    assert message in str(info.value)


def test_read_history_names_the_line_it_stops_at(tmp_path: Path) -> None:
    lines = [orjson.dumps(o) for o in GOOD[:3]] + [b'{"index": 3}']
    path = tmp_path / "h.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    reader = read_history(path)
    assert [next(reader).index for _ in range(3)] == [0, 1, 2]
    with pytest.raises(HistoryFormatError, match=rf"^{path}:4: missing field"):
        next(reader)


def test_history_validate_command(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kproxy.cli import main

    good = write_lines(tmp_path / "good.jsonl", GOOD)
    result = CliRunner().invoke(main, ["history", "validate", str(good)])
    assert result.exit_code == 0, result.output
    assert "valid: 11 ops" in result.output
    bad = write_lines(tmp_path / "bad.jsonl", GOOD[:5] + [op(5, 9, "ok", "send", [["send", 1, [0, 7]]])])
    result = CliRunner().invoke(main, ["history", "validate", str(bad)])
    assert result.exit_code == 1
    assert f"{bad}:6:" in result.output
