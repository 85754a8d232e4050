"""Jepsen EDN queue histories import into kproxy's JSON Lines history."""

from __future__ import annotations

from pathlib import Path

import edn_format
import pytest
from click.testing import CliRunner

from kproxy.cli import main
from kproxy.workload.edn_import import EdnImportError, import_edn
from kproxy.workload.history import read_history, validate_history

DATA = Path(__file__).parent / "data"
K = edn_format.Keyword


def test_round_trip_keeps_every_queue_op(tmp_path: Path) -> None:
    source = DATA / "queue_small.edn"
    out = tmp_path / "small.jsonl"
    summary = import_edn(source, out)

    edn_ops = edn_format.loads_all(source.read_text())
    kept = [m for m in edn_ops
            if isinstance(m[K("process")], int) and m[K("f")].name != "debug-topic-partitions"]
    assert summary.written == len(kept) == 20
    assert summary.skipped_nemesis == 2
    assert summary.skipped_unknown_f == {"debug-topic-partitions": 2}

    ops = list(read_history(out))
    assert [o.index for o in ops] == list(range(len(kept)))  # renumbered past the skipped ops
    for o, m in zip(ops, kept):
        assert (o.time, o.process, o.type, o.f) == (m[K("time")], m[K("process")], m[K("type")].name, m[K("f")].name)
    stats = validate_history(out)
    assert stats.processes == 5 and stats.keys == 2
    assert stats.by_type == {"invoke": 10, "ok": 7, "fail": 1, "info": 2}


def test_micro_ops_keywords_and_errors_convert(tmp_path: Path) -> None:
    out = tmp_path / "small.jsonl"
    import_edn(DATA / "queue_small.edn", out)
    by_index = {o.index: o for o in read_history(out)}
    assert by_index[5].value == [["send", 1, 2], ["send", 2, 1], ["poll"]]
    assert by_index[7].value == [["send", 1, [1, 2]], ["send", 2, [0, 1]], ["poll", {"1": [[0, 1]]}]]
    assert by_index[9].value == [["poll", {"1": [[0, 1], [1, 2]]}]]
    assert (by_index[11].type, by_index[11].error) == ("fail", "abort")  # [:abort :invalid-txn-state]
    assert (by_index[13].type, by_index[13].error) == ("info", "timeout")
    assert (by_index[15].f, by_index[15].type, by_index[15].value) == ("crash", "info", None)
    assert (by_index[2].f, by_index[2].value) == ("subscribe", [1])
    assert by_index[0].error is None


def test_a_vector_history_with_nil_offsets(tmp_path: Path) -> None:
    out = tmp_path / "vector.jsonl"
    summary = import_edn(DATA / "queue_vector.edn", out)
    ops = list(read_history(out))
    assert summary.written == 4
    assert ops[1].value == [["send", 5, [0, 1]], ["poll", {"5": [[0, 1]]}]]
    assert ops[3].value == [["send", 5, 2]]  # an unknown offset keeps the plain value
    assert ops[3].error == "timeout"  # {:type :timeout}
    validate_history(out)


def test_bad_input_names_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.edn"
    bad.write_text("{:index 0, :time 1, :type :ok, :process 0, :f :send, :value [[:send :k 1]]}\n")
    with pytest.raises(EdnImportError, match=rf"^{bad}: op 0 \(index 0\): send micro-op"):
        import_edn(bad, tmp_path / "out.jsonl")
    bad.write_text("[1 2 3]")
    with pytest.raises(EdnImportError, match="not an op map"):
        import_edn(bad, tmp_path / "out.jsonl")
    bad.write_text("{:index 0 :value [")
    with pytest.raises(EdnImportError, match="not readable as EDN"):
        import_edn(bad, tmp_path / "out.jsonl")


def test_history_import_command(tmp_path: Path) -> None:
    out = tmp_path / "cli.jsonl"
    result = CliRunner().invoke(main, ["history", "import", str(DATA / "queue_small.edn"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert "wrote 20 ops" in result.output and "debug-topic-partitions: 2" in result.output
    assert validate_history(out).ops == 20
    result = CliRunner().invoke(main, ["history", "validate", str(out)])
    assert result.exit_code == 0 and "valid: 20 ops" in result.output
