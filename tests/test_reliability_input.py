"""Input that is ambiguous or empty is refused, or judged `unknown`, never taken for something it is not.

- A history line or an admin API body that names a key twice: JSON leaves
  which one counts to the reader (an `ok` op became `fail`), so it is refused
  with FILE:LINE (history) or a 400 (admin API). Rule files in YAML already
  refused a repeated key with its line.
- A history without operations: `kproxy history validate` refuses it (exit
  1) as `kproxy analyze` does (exit 2). A history that reads and writes
  nothing (Jepsen's `empty-history`) validates, and its verdict is `unknown`
  (tests/test_reliability_input_spark.py runs it through the analysis).
- A rule file that is not UTF-8, or larger than the limit, is refused at the
  line where it breaks, not at a byte offset.
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
import trio
from click.testing import CliRunner
from kproxy_spark.report import EXIT_UNKNOWN, build_report, exit_code, format_summary

from kproxy.cli import main
from kproxy.faults.errors import RuleFileError
from kproxy.faults.json_source import read_json
from kproxy.faults.limits import MAX_DOCUMENT_BYTES
from kproxy.faults.loader import load_rule_file, load_rule_text
from kproxy.workload.history import HistoryFormatError, read_history, validate_history

INVOKE_SEND = '{"index":0,"time":1,"process":0,"type":"invoke","f":"send","value":[["send",1,5]]}'
OK_SEND = '{"index":1,"time":2,"process":0,"type":"ok","f":"send","value":[["send",1,[0,5]]]}'
INVOKE_POLL = '{"index":0,"time":1,"process":0,"type":"invoke","f":"poll","value":[["poll"]]}'


def write(path: Path, *lines: str) -> Path:
    path.write_text("".join(line + "\n" for line in lines))
    return path


# --- history lines ------------------------------------------------------------------

REPEATED = {
    # The case: read by orjson (last wins) this ok op was a fail.
    "type": (INVOKE_SEND, OK_SEND[:-1] + ',"type":"fail","error":"aborted"}', '"type"'),
    "index": (INVOKE_SEND, OK_SEND.replace('"index":1,', '"index":1,"index":1,'), '"index"'),
    "poll map key": (INVOKE_POLL, ('{"index":1,"time":2,"process":0,"type":"ok","f":"poll",'
                                   '"value":[["poll",{"1":[[0,5]],"1":[[1,6]]}]]}'), '"1"'),
    "in a txn's poll": ('{"index":0,"time":1,"process":0,"type":"invoke","f":"txn","value":[["send",2,0],["poll"]]}',
                        ('{"index":1,"time":2,"process":0,"type":"ok","f":"txn",'
                         '"value":[["send",2,[0,0]],["poll",{"2":[[0,0]],"3":[],"2":[[0,0]]}]]}'), '"2"'),
    # A repeat that also breaks the op: the repeat is named, as the likely cause.
    "value, breaking the op": (INVOKE_SEND, OK_SEND[:-1] + ',"value":7}', '"value"'),
    # Colons in the error text and escapes do not hide a repeat.
    "beside an error with colons and escapes": (
        INVOKE_SEND, ('{"index":1,"time":2,"process":0,"type":"info","f":"send","value":[["send",1,5]],'
                      '"error":"a:b\\u003ac","error":"x"}'), '"error"'),
}


@pytest.mark.parametrize("name", list(REPEATED))
def test_a_history_line_naming_a_key_twice_is_refused_with_file_and_line(tmp_path: Path, name: str) -> None:
    first, second, key = REPEATED[name]
    history = write(tmp_path / "h.jsonl", first, second)
    expected = f"{history}:2: the key {key} appears twice in one object"
    with pytest.raises(HistoryFormatError, match=expected):
        validate_history(history)
    with pytest.raises(HistoryFormatError, match=expected):
        list(read_history(history))
    validated = CliRunner().invoke(main, ["history", "validate", str(history)])
    assert validated.exit_code == 1 and expected in validated.output
    analysed = CliRunner().invoke(main, ["analyze", "--history", str(history), "--out", str(tmp_path / "r")])
    assert analysed.exit_code == 2 and expected in analysed.output
    assert not (tmp_path / "r").exists()  # refused before Spark started


@pytest.mark.parametrize("line", [
    # Colons in text, written plainly or escaped, are not keys.
    '{"index":1,"time":2,"process":0,"type":"fail","f":"send","value":[["send",1,[0,5]]],"error":"a: b: c"}',
    '{"index":1,"time":2,"process":0,"type":"fail","f":"send","value":[["send",1,[0,5]]],"error":"a\\u003a b"}',
    '{"index":1, "time" : 2, "process":0, "type":"ok", "f":"send", "value":[["send",1,[0,5]]]}',
])
def test_lines_with_colons_that_are_not_keys_still_validate(tmp_path: Path, line: str) -> None:
    history = write(tmp_path / "h.jsonl", INVOKE_SEND, line)
    assert validate_history(history).ops == 2
    assert [op.type for op in read_history(history)] == ["invoke", json.loads(line)["type"]]


@pytest.mark.parametrize("content", ["", "\n\n  \n"])
def test_validate_refuses_a_history_without_operations_as_analyze_does(tmp_path: Path, content: str) -> None:
    history = tmp_path / "empty.jsonl"
    history.write_text(content)
    expected = f"{history}:1: the history holds no operation"
    validated = CliRunner().invoke(main, ["history", "validate", str(history)])
    assert validated.exit_code == 1 and expected in validated.output
    analysed = CliRunner().invoke(main, ["analyze", "--history", str(history), "--out", str(tmp_path / "r")])
    assert analysed.exit_code == 2 and expected in analysed.output


def test_a_history_that_reads_and_writes_nothing_validates(tmp_path: Path) -> None:
    # Jepsen's empty-history test: well-formed; that nothing was judged is the verdict's to say.
    history = write(tmp_path / "h.jsonl",
                    '{"index":0,"time":0,"process":0,"type":"invoke","f":"assign","value":[0]}',
                    '{"index":1,"time":1,"process":0,"type":"ok","f":"assign","value":[0]}')
    validated = CliRunner().invoke(main, ["history", "validate", str(history)])
    assert validated.exit_code == 0 and validated.output.startswith("valid: 2 ops")


# --- the verdict when nothing was sent or polled ----------------------------------------


def stats(ops: dict, **extra: object) -> dict:
    return {"completed_ops": sum(n for by_type in ops.values() for t, n in by_type.items() if t != "invoke"),
            "ops": ops, "final_reads": False, "sends_acknowledged": 0, "sends_unknown": 0, "sends_failed": 0,
            "records_polled": 0, **extra}


def test_a_history_without_a_completed_send_or_poll_is_unknown_with_the_reason() -> None:
    report = build_report({"G1a": [], "lost-write": []}, {}, stats({"assign": {"invoke": 1, "ok": 1}}))
    assert report["valid"] == "unknown" and exit_code(report) == EXIT_UNKNOWN
    assert report["stats"]["unknown_reason"].startswith("no send and no poll completed")
    summary = format_summary(report).splitlines()
    assert summary[0] == "kproxy analyze: UNKNOWN"
    assert summary[1].startswith("  why unknown: no send and no poll completed")
    # Invoked and never completed: nothing judged either.
    pending = stats({"send": {"invoke": 3}, "poll": {"invoke": 2}, "crash": {"invoke": 1, "info": 1}})
    assert build_report({}, {}, pending)["valid"] == "unknown"


@pytest.mark.parametrize(("ops", "extra"), [
    ({"send": {"invoke": 1, "ok": 1}}, {"sends_acknowledged": 1, "final_reads": True}),
    ({"send": {"invoke": 1, "fail": 1}}, {"sends_failed": 1}),
    ({"send": {"invoke": 1, "info": 1}}, {"sends_unknown": 1}),
    ({"poll": {"invoke": 1, "ok": 1}}, {}),  # a poll that read nothing still judged the log
    ({"txn": {"invoke": 1, "fail": 1}}, {}),  # a transaction of polls that aborted
])
def test_a_completed_send_or_poll_keeps_the_verdict_it_had(ops: dict, extra: dict) -> None:
    report = build_report({"G1a": []}, {}, stats(ops, **extra))
    assert report["valid"] is True and "unknown_reason" not in report["stats"]


def test_the_other_unknown_verdicts_say_why() -> None:
    sent = {"send": {"invoke": 1, "ok": 1}}
    unseen = build_report({"unseen": [{"key": 0, "value": 0}]}, {}, stats(sent, sends_acknowledged=1))
    assert unseen["valid"] == "unknown" and "no final reads" in unseen["stats"]["unknown_reason"]
    # With final reads the unseen write is lost: an error, as before.
    lost = build_report({"unseen": [{"key": 0, "value": 0}]}, {}, stats(sent, sends_acknowledged=1, final_reads=True))
    assert lost["valid"] is False and "unknown_reason" not in lost["stats"]
    incomplete = build_report({"cycle-search-incomplete": [{"edges": 1}]}, {}, stats(sent, sends_acknowledged=1))
    assert "cycle search" in incomplete["stats"]["unknown_reason"]
    nothing = build_report({}, {}, stats({"send": {"invoke": 1}}, completed_ops=0))
    assert nothing["stats"]["unknown_reason"] == "no operation completed: nothing could be judged"
    # An error found on the wire still makes it invalid, whatever the history holds.
    torn = build_report({}, {"torn-transaction": [{"index": 0}]}, stats({"assign": {"invoke": 1, "ok": 1}}))
    assert torn["valid"] is False and "unknown_reason" not in torn["stats"]


# --- admin API bodies -------------------------------------------------------------------


@pytest.mark.parametrize(("body", "key"), [
    (b'{"action": {"type": "delay", "ms": 5}, "action": {"type": "drop"}}', '"action"'),
    (b'{"action": {"type": "delay", "ms": 5, "ms": 50}}', '"ms"'),
    (b'{"match": {"api": "produce", "api": "fetch"}, "action": {"type": "drop"}}', '"api"'),
])
def test_an_admin_body_naming_a_key_twice_is_refused(body: bytes, key: str) -> None:
    with pytest.raises(RuleFileError, match=f"rule 'x': the key {key} appears twice in one object"):
        read_json(body, "rule 'x'")


def test_a_put_naming_a_key_twice_gets_400_and_installs_nothing() -> None:
    from tests.test_admin_fuzz import make_app

    proxy, app = make_app()
    headers = {"Authorization": "Bearer fuzz-token-0123456789abcdef", "Content-Type": "application/json"}

    async def main_() -> tuple[httpx.Response, httpx.Response]:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://127.0.0.1:19080") as c:
            refused = await c.put("/rules/r", headers=headers,
                                  content=b'{"action": {"type": "drop"}, "action": {"type": "delay", "ms": 5}}')
            accepted = await c.put("/rules/r", headers=headers, content=b'{"action": {"type": "delay", "ms": 5}}')
            return refused, accepted

    refused, accepted = trio.run(main_)
    assert refused.status_code == 400
    assert 'the key "action" appears twice in one object' in refused.json()["error"]
    assert accepted.status_code == 200
    assert [r["action"]["type"] for r in proxy.engine.list_rules()] == ["delay"]


# --- rule files -----------------------------------------------------------------------------


def test_a_yaml_rule_file_naming_a_key_twice_is_refused_with_its_line(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("version: 1\nrules:\n  - id: r\n    action: {type: delay, ms: 5}\n    action: {type: drop}\n")
    with pytest.raises(RuleFileError) as refused:
        load_rule_file(path)
    assert str(refused.value) == f"{path}:5: rules[0].action: duplicate key 'action'"


def test_a_rule_file_that_is_not_utf8_is_refused_at_its_line(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_bytes(b"version: 1\nrules:\n  - id: caf\xe9\n    action: {type: drop}\n")
    with pytest.raises(RuleFileError) as refused:
        load_rule_file(path)
    assert str(refused.value) == (f"{path}:3: not UTF-8: byte 0xe9 at byte 12 of the line (invalid continuation "
                                  "byte); a rule file is UTF-8 text")
    result = CliRunner().invoke(main, ["rules", "validate", str(path)])
    assert result.exit_code == 1 and result.stderr.startswith(f"{path}:3: not UTF-8")


def test_a_rule_file_over_the_size_limit_is_refused_at_the_line_the_limit_falls_on(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    comment = "# " + "x" * 1000 + "\n"
    lines = MAX_DOCUMENT_BYTES // len(comment) + 2
    path.write_text("version: 1\nrules: []\n" + comment * lines)
    line = (MAX_DOCUMENT_BYTES - len("version: 1\nrules: []\n")) // len(comment) + 3
    with pytest.raises(RuleFileError, match=f"^{path}:{line}: the rule file is larger than {MAX_DOCUMENT_BYTES}"):
        load_rule_file(path)
    # Text given whole (kproxy rules add, the admin API's YAML readers) names the line the same way.
    with pytest.raises(RuleFileError, match=f"^text:{line}: the document is larger than {MAX_DOCUMENT_BYTES}"):
        load_rule_text(path.read_text(), "text")
