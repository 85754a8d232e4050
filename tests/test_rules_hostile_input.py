"""Hostile rule documents are refused with file and line, in bounded time and memory.

Every document here once ended `kproxy rules validate` with a traceback and,
written over a running proxy's rule file, made the proxy exit (or hang for
seconds on its event loop). tests/test_rule_reload.py writes the same
documents over a live proxy; here each goes through the command line and the
JSON reader of the admin API.
"""

from __future__ import annotations

import re
import time
import tracemalloc
from pathlib import Path

import pytest
from click.testing import CliRunner

from kproxy.cli import main
from kproxy.faults import RuleFileError, load_rule_text
from kproxy.faults.json_source import read_json
from kproxy.faults.limits import MAX_DOCUMENT_BYTES, MAX_NESTING_DEPTH, MAX_RULES, MAX_VALUES


def alias_bomb() -> str:
    """Nine levels of nine aliases each: 9**9 strings once expanded, in under 600 bytes."""
    text = 'version: 1\nrules: []\na: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]\n'
    for previous, name in zip("abcdefgh", "bcdefghi"):
        text += f"{name}: &{name} [" + ",".join([f"*{previous}"] * 9) + "]\n"
    return text


def rule_with(action: str, match: str = "{}", limits: str = "{}") -> str:
    return f"version: 1\nrules:\n  - id: r\n    match: {match}\n    action: {action}\n    limits: {limits}\n"


# name -> (document, line of the problem, a fragment of its message)
HOSTILE = {
    "recursive alias": ("version: 1\nrules: &r [*r]\n", 2, "alias *r is used inside the collection it names"),
    "recursive mapping alias": ("version: 1\nrules:\n  - &rule {id: a, action: *rule}\n", 3,
                                "alias *rule is used inside the collection it names"),
    "unknown tag on a scalar": ("version: 1\nrules: !foo x\n", 2, "rules: unknown tag !foo"),
    "unknown tag on a mapping": ("version: 1\nrules:\n  - !rule {id: a, action: {type: drop}}\n", 3,
                                 "rules[0]: unknown tag !rule"),
    "python object tag": ("version: 1\nrules: !!python/object/apply:os.system [true]\n", 2,
                          "unknown tag !!python/object/apply:os.system"),
    "binary tag": ("version: 1\nrules:\n  - id: !!binary aGVsbG8=\n", 3, "unknown tag !!binary"),
    "bad explicit int": ("version: 1\nseed: !!int many\n", 2, "seed: cannot read 'many' as !!int"),
    "deep nesting": ("version: 1\nrules: " + "[" * 5000 + "]" * 5000 + "\n", 2,
                     f"nests deeper than {MAX_NESTING_DEPTH} levels"),
    "deep nesting through aliases": (
        "version: 1\nrules: []\na: &a " + "[" * 28 + "]" * 28 + "\nb: &b [[*a]]\nc: [[[*b]]]\n", 5,
        f"alias *b nests the document deeper than {MAX_NESTING_DEPTH} levels"),
    "alias bomb": (alias_bomb(), 7, f"aliases expand the document beyond {MAX_VALUES} values"),
    "undefined alias": ("version: 1\nrules: [*nowhere]\n", 2, "alias *nowhere names no anchor defined before it"),
    "anchor defined twice": ("version: 1\nrules: &a []\nseed: &a 3\n", 3, "anchor &a is defined twice"),
    "second document": ("version: 1\nrules: []\n---\nversion: 1\n", 3, "a second one starts here"),
    "collection as a key": ("version: 1\n? [rules]\n: []\n", 2, "a key must be a plain value"),
    "base-60 number of half a megabyte": ("version: 1\nseed: 1" + ":1" * 250_000 + "\n", 2,
                                          "seed: a number of more than 64 characters"),
    "infinite delay": (rule_with("{type: delay, ms: .inf}"), 5, "rules[0].action.ms: a number must be finite, not '.inf'"),
    "delay overflowing to infinity": (rule_with("{type: delay, ms: 1.0e+999}"), 5, "rules[0].action.ms: a number must be finite"),
    "not-a-number jitter": (rule_with("{type: delay, ms: 5, jitter_ms: .nan}"), 5, "rules[0].action.jitter_ms: a number must be finite"),
    "delay longer than an hour": (rule_with("{type: delay, ms: 3600001}"), 5,
                                  "rules[0].action.ms: Input should be less than or equal to 3600000"),
    "hold timeout longer than an hour": (rule_with("{type: hold, until: client_retry, timeout_ms: 1.0e+12}"), 5,
                                         "rules[0].action.timeout_ms: Input should be less than or equal to 3600000"),
    "duplicate spacing beyond an hour": (rule_with("{type: duplicate, spacing_ms: 99999999}"), 5,
                                         "rules[0].action.spacing_ms: Input should be less than or equal to 3600000"),
    "every beyond int32": (rule_with("{type: drop}", match="{every: 2147483648}"), 4,
                           "rules[0].match.every: Input should be less than or equal to 2147483647"),
    "count beyond int32": (rule_with("{type: drop}", limits="{count: 99999999999}"), 6,
                           "rules[0].limits.count: Input should be less than or equal to 2147483647"),
    "rule duration of a year": (rule_with("{type: drop}", limits="{duration_s: 31536000}"), 6,
                                "rules[0].limits.duration_s: Input should be less than or equal to 2592000"),
    "infinite phase": ("version: 1\nschedule:\n  phases:\n    - {name: p, duration_s: .inf}\n", 4,
                       "schedule.phases[0].duration_s: a number must be finite"),
    "negative seed": ("version: 1\nseed: -1\n", 2, "seed: Input should be greater than or equal to 0"),
    "seed beyond 64 bits": ("version: 1\nseed: 18446744073709551616\n", 2,
                            "seed: Input should be less than or equal to 18446744073709551615"),
    "version beyond int16": (rule_with("{type: drop}", match='{versions: "3-99999"}'), 4, "versions go from 0 to 32767"),
    "partition beyond int32": (rule_with("{type: drop}", match="{partition: 4294967296}"), 4,
                               "a partition is a number from 0 to 2147483647"),
    "more rules than a proxy holds": ("version: 1\nrules:\n" + "".join(
        f"  - {{id: r{i}, action: {{type: drop}}}}\n" for i in range(MAX_RULES + 1)), 2,
        f"rules: List should have at most {MAX_RULES} items"),
    "transaction number beyond int32": (rule_with("{type: drop}", match="{txn_number: {max: 4294967296}}"), 4,
                                        "txn_number max is a number from 1 to 2147483647"),
}


@pytest.mark.parametrize("name", HOSTILE)
def test_validate_refuses_with_file_and_line_and_no_traceback(name: str, tmp_path: Path) -> None:
    text, line, fragment = HOSTILE[name]
    path = tmp_path / "hostile.yaml"
    path.write_text(text)
    started = time.monotonic()
    result = CliRunner().invoke(main, ["rules", "validate", str(path)])
    elapsed = time.monotonic() - started
    assert result.exit_code == 1 and isinstance(result.exception, SystemExit), result.output
    first = result.stderr.splitlines()[0]
    assert first.startswith(f"{path}:{line}: "), result.stderr
    assert fragment in result.stderr, result.stderr
    assert "Traceback" not in result.output
    # The alias bomb and the deep document used to take 20 s and more, or never end.
    assert elapsed < 5, f"{name} took {elapsed:.1f} s"


def test_the_alias_bomb_is_small_and_stays_small_in_memory() -> None:
    text = alias_bomb()
    assert len(text.encode()) < 600
    tracemalloc.start()
    try:
        with pytest.raises(RuleFileError):
            load_rule_text(text, "bomb.yaml")
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 64 * 1024 * 1024, f"peak {peak / 2**20:.0f} MiB"


def test_aliases_within_the_bound_are_expanded_with_the_anchors_lines() -> None:
    text = (
        "version: 1\nrules:\n"
        "  - id: a\n    match: &orders\n      api: produce\n      topik: orders\n    action: {type: drop}\n"
        "  - id: b\n    match: *orders\n    action: {type: drop_response}\n"
    )
    with pytest.raises(RuleFileError) as refused:
        load_rule_text(text, "aliases.yaml")
    assert str(refused.value).splitlines() == [
        "aliases.yaml:6: rules[0].match.topik: Extra inputs are not permitted",
        "aliases.yaml:6: rules[1].match.topik: Extra inputs are not permitted",
    ]
    rule_file = load_rule_text(text.replace("topik", "topic"), "aliases.yaml")
    assert [r.match.topic for r in rule_file.rules] == ["orders", "orders"]


def test_a_file_larger_than_the_limit_is_refused_unread(tmp_path: Path) -> None:
    path = tmp_path / "huge.yaml"
    path.write_text("version: 1\nrules: []\n" + "#" * MAX_DOCUMENT_BYTES)
    result = CliRunner().invoke(main, ["rules", "validate", str(path)])
    assert result.exit_code == 1
    assert result.stderr == (f"{path}:3: the rule file is larger than {MAX_DOCUMENT_BYTES} bytes: its byte past the"
                             " limit is on this line\n")


@pytest.mark.parametrize(("body", "fragment"), [
    (b'{"action": {"type": "delay", "ms": Infinity}}', "a number must be finite, not Infinity"),
    (b'{"action": {"type": "delay", "ms": NaN}}', "a number must be finite, not NaN"),
    (b'{"action": {"type": "delay", "ms": 1e999}}', "a number must be finite, not 1e999"),
    (b"[" * 100_000 + b"]" * 100_000, f"nests deeper than {MAX_NESTING_DEPTH} levels"),
    (b'{"a":' * 40 + b"1" + b"}" * 40, f"nests deeper than {MAX_NESTING_DEPTH} levels"),
    (b"[" + b"0," * MAX_VALUES + b"0]", f"holds more than {MAX_VALUES} values"),
    (b"{not json", "not JSON"),
    (b"\xff\xfe\xfd", "not JSON"),
])
def test_json_reader_refuses_what_json_should_not_hold(body: bytes, fragment: str) -> None:
    with pytest.raises(RuleFileError) as refused:
        read_json(body, "rule 'x'")
    assert re.match(r"rule 'x': ", str(refused.value))
    assert fragment in str(refused.value)
