"""Jepsen EDN queue histories import into kproxy's JSON Lines history."""

from __future__ import annotations

import json
from pathlib import Path

import edn_format
import pytest
from click.testing import CliRunner

from kproxy.cli import main
from kproxy.workload.edn_import import EdnImportError, import_edn
from kproxy.workload.history import read_history, validate_history
from kproxy.workload.names import load_names, sidecar_path

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
    # A name (keyword, string) is numbered; a float is no key at all.
    bad.write_text("{:index 0, :time 1, :type :ok, :process 0, :f :send, :value [[:send 1.5 1]]}\n")
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


NAMED_KEYS_SIDECAR = {
    "format": 1,
    "keys": {"4": ":x", "5": '"y"'},
    "values": {"4": {"0": ":a", "1": '"a"'}, "5": {"0": ":b"}},
}


def test_keyword_and_string_keys_and_values_become_integers_with_their_names_beside(tmp_path: Path) -> None:
    out = tmp_path / "named.jsonl"
    summary = import_edn(DATA / "queue_named.edn", out)

    lines = [json.loads(line) for line in out.read_text().splitlines()]
    assert [(op["type"], op["f"], op["value"]) for op in lines] == [
        ("invoke", "txn", [["send", 4, 0], ["send", 5, 0]]),
        ("fail", "txn", [["send", 4, [0, 0]], ["send", 5, [0, 0]]]),
        ("invoke", "send", [["send", 3, 7], ["send", 4, 1]]),
        ("ok", "send", [["send", 3, [0, 7]], ["send", 4, [1, 1]]]),
        ("invoke", "assign", [4, 3]),
        ("ok", "assign", [4, 3]),
        ("invoke", "poll", [["poll"]]),
        ("ok", "poll", [["poll", {"4": [[0, 0], [1, 1]], "3": [[0, 7]]}]]),
    ]
    assert lines[1]["error"] == "abort"
    assert validate_history(out).keys == 3

    assert summary.names_path == sidecar_path(out) == tmp_path / "named.jsonl.names.json"
    assert (summary.named_keys, summary.named_values) == (2, 3)
    assert json.loads(summary.names_path.read_text()) == NAMED_KEYS_SIDECAR
    assert load_names(out) == {"keys": NAMED_KEYS_SIDECAR["keys"], "values": NAMED_KEYS_SIDECAR["values"]}


def test_the_numbering_is_the_same_on_every_import(tmp_path: Path) -> None:
    import_edn(DATA / "queue_named.edn", tmp_path / "a.jsonl")
    import_edn(DATA / "queue_named.edn", tmp_path / "b.jsonl")
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()
    assert sidecar_path(tmp_path / "a.jsonl").read_bytes() == sidecar_path(tmp_path / "b.jsonl").read_bytes()


def test_an_integer_history_has_no_sidecar_and_a_stale_one_goes(tmp_path: Path) -> None:
    out = tmp_path / "h.jsonl"
    import_edn(DATA / "queue_named.edn", out)
    assert sidecar_path(out).exists()
    summary = import_edn(DATA / "queue_small.edn", out)
    assert summary.names_path is None and (summary.named_keys, summary.named_values) == (0, 0)
    # The old names would rename this history's integer keys.
    assert not sidecar_path(out).exists()
    assert load_names(out) is None


def test_a_keyword_and_a_string_of_the_same_letters_are_different_keys(tmp_path: Path) -> None:
    source = tmp_path / "same.edn"
    source.write_text(
        '{:index 0, :time 1, :type :invoke, :process 0, :f :send, :value [[:send :k :v] [:send "k" "v"]]}\n'
        '{:index 1, :time 2, :type :ok, :process 0, :f :send, :value [[:send :k [0 :v]] [:send "k" [0 "v"]]]}\n'
    )
    out = tmp_path / "same.jsonl"
    import_edn(source, out)
    assert [op.value for op in read_history(out)][1] == [["send", 0, [0, 0]], ["send", 1, [0, 0]]]
    assert load_names(out) == {"keys": {"0": ":k", "1": '"k"'}, "values": {"0": {"0": ":v"}, "1": {"0": '"v"'}}}


def test_import_command_says_where_the_names_are(tmp_path: Path) -> None:
    out = tmp_path / "cli.jsonl"
    result = CliRunner().invoke(main, ["history", "import", str(DATA / "queue_named.edn"), "-o", str(out)])
    assert result.exit_code == 0, result.output
    assert f"2 named keys and 3 named values: originals in {sidecar_path(out)}" in result.output
