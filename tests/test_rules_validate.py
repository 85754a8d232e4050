"""Rule files are validated strictly, and every problem names its file and line."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import pytest

from kproxy.faults import RuleFileError, json_schema, load_rule_file, load_rule_text
from kproxy.faults.actions import ACTIONS
from kproxy.faults.engine import FaultEngine

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"
SCENARIO_FILES = sorted(RULES_DIR.glob("*.yaml"))

EXPECTED_SCENARIOS = {
    "healthy", "torn-transaction", "late-produce", "lost-produce-ack", "ambiguous-not-leader",
    "spurious-zero-offset", "retried-commit-invalid-state", "stale-lso", "fetch-filtering",
    "missing-abort-marker", "txn-timeout-fenced", "chaos-latency",
}


def test_every_listed_scenario_is_shipped() -> None:
    assert EXPECTED_SCENARIOS <= {p.stem for p in SCENARIO_FILES}


@pytest.mark.parametrize("path", SCENARIO_FILES, ids=lambda p: p.name)
def test_shipped_scenario_loads_and_explains_itself(path: Path) -> None:
    rule_file = load_rule_file(path)
    FaultEngine(rule_file)  # and compiles into an engine
    header = path.read_text().splitlines()[0]
    assert header.startswith("# "), f"{path.name} must open with a comment saying what it reproduces"
    assert rule_file.seed is not None or not rule_file.rules, "scenario runs must be reproducible"


def test_torn_transaction_scenario_is_the_held_duplicate_commit() -> None:
    rule = load_rule_file(RULES_DIR / "torn-transaction.yaml").rules[0]
    assert rule.match.api == "end_txn" and rule.match.committed is True
    # Each producer's commits of its first ten transactions: a client that
    # commits once and then aborts meets the stale commit exactly once.
    assert rule.match.txn_number == {"min": 1, "max": 10}
    assert rule.action.type == "duplicate" and rule.action.copies == 1
    assert rule.action.hold_until == "next_txn_records"


def problems_of(text: str, name: str = "rules/broken.yaml") -> list[str]:
    with pytest.raises(RuleFileError) as caught:
        load_rule_text(textwrap.dedent(text).lstrip("\n"), name)
    return str(caught.value).splitlines()


def test_unknown_key_names_file_line_and_path() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            match:
              api: produce
              topik: orders
            action: {type: drop}
    """)
    assert lines == ["rules/broken.yaml:6: rules[0].match.topik: Extra inputs are not permitted"]


def test_bad_type_points_at_the_value() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: slow
            action:
              type: delay
              ms: fast
    """)
    assert lines == ["rules/broken.yaml:6: rules[0].action.ms: Input should be a valid number"]


def test_strings_are_not_numbers_even_when_they_look_like_one() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: slow
            action: {type: delay, ms: "5"}
    """)
    assert len(lines) == 1 and lines[0].startswith("rules/broken.yaml:4: rules[0].action.ms:")


def test_bad_enum_value() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            match:
              direction: sideways
            action: {type: drop}
    """)
    assert len(lines) == 1
    assert lines[0].startswith("rules/broken.yaml:5: rules[0].match.direction: Input should be 'request' or 'response'")


def test_unknown_action_type_lists_the_registered_ones() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            action:
              type: explode
    """)
    assert len(lines) == 1 and lines[0].startswith("rules/broken.yaml:4: rules[0].action: Input tag 'explode'")
    for name in ACTIONS:
        assert f"'{name}'" in lines[0]


def test_missing_required_key_is_reported_at_its_mapping() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            action:
              type: respond
    """)
    assert lines == ["rules/broken.yaml:4: rules[0].action.error: Field required"]


def test_yaml_syntax_error_gives_file_and_line() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            action: {type: drop
          - id: b
    """)
    assert len(lines) == 1
    assert lines[0].startswith("rules/broken.yaml:5: YAML syntax error")


def test_duplicate_rule_id_names_the_second_one() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: twin
            action: {type: drop}
          - id: other
            action: {type: drop_response}
          - id: twin
            action: {type: drop}
    """)
    assert lines == ["rules/broken.yaml:7: rules[2].id: duplicate rule id 'twin' (first used by rules[0])"]


def test_duplicate_yaml_key_is_refused_not_silently_collapsed() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            action: {type: delay, ms: 5}
            action: {type: drop}
    """)
    assert lines == ["rules/broken.yaml:5: rules[0].action: duplicate key 'action'"]


def test_phase_naming_an_unknown_rule() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            action: {type: drop}
        schedule:
          phases:
            - name: one
              duration_s: 10
              rules:
                - a
                - ghost
    """)
    assert lines == ["rules/broken.yaml:11: schedule.phases[0].rules[1]: phase 'one' names unknown rule 'ghost'"]


def test_match_phase_must_exist() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            match: {phase: nope}
            action: {type: drop}
    """)
    assert lines == ["rules/broken.yaml:4: rules[0].match.phase: phase 'nope' given but the file has no schedule"]


def test_bad_glob() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            match:
              topic: "orders-[0-9"
            action: {type: drop}
    """)
    assert len(lines) == 1 and lines[0].startswith("rules/broken.yaml:5: rules[0].match.topic: bad glob")


def test_action_not_allowed_on_the_direction() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            match:
              direction: response
            action: {type: duplicate}
    """)
    assert lines == ["rules/broken.yaml:5: rules[0].match.direction: action duplicate cannot apply to a response (allowed: request)"]


@pytest.mark.parametrize(("field", "value", "fragment"), [
    ("api", "EndTx", "unknown API name 'EndTx'"),
    ("api", 9999, "unknown API key 9999"),
    ("versions", '"5-3"', "3 is below 5"),
    ("partition", -1, "a partition is a number from 0 to 2147483647"),
    ("txn_number", "{min: 3, max: 2}", "max 2 is below min 3"),
    ("probability", 1.5, "less than or equal to 1"),
    ("nth", 0, "greater than or equal to 1"),
    ("committed", "yes please", "valid boolean"),
])
def test_bad_match_values(field: str, value: object, fragment: str) -> None:
    lines = problems_of(f"""
        version: 1
        rules:
          - id: a
            match:
              {field}: {value}
            action: {{type: drop}}
    """)
    assert len(lines) == 1, lines
    assert lines[0].startswith(f"rules/broken.yaml:5: rules[0].match.{field}: ")
    assert fragment in lines[0]


def test_unknown_kafka_error_name() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            action:
              type: replace_error
              error: NOT_A_LEADER
    """)
    assert len(lines) == 1 and lines[0].startswith("rules/broken.yaml:6: rules[0].action.error: unknown Kafka error name")


def test_rewrite_parameters_must_fit_the_field() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            match: {api: fetch, direction: response}
            action: {type: rewrite, field: fetch_drop_records, lag: 3}
    """)
    assert len(lines) == 1 and "'lag' only applies to fields" in lines[0]


def test_once_contradicting_count() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            action: {type: drop}
            limits:
              once: true
              count: 3
    """)
    assert lines == ["rules/broken.yaml:5: rules[0].limits: once: true means count: 1, but count is 3"]


def test_several_problems_one_line_each_in_file_order() -> None:
    lines = problems_of("""
        version: 2
        rules:
          - id: "bad id!"
            action: {type: drop}
    """)
    assert [line.split(":")[1] for line in lines] == ["1", "3"]


def test_empty_file_and_wrong_top_level() -> None:
    assert problems_of("") == ["rules/broken.yaml:1: a rule file is a mapping with `version: 1` and `rules: [...]`"]
    assert len(problems_of("- 1\n- 2\n")) == 1


def test_missing_file_names_it(tmp_path: Path) -> None:
    with pytest.raises(RuleFileError, match="nope.yaml: cannot read the rule file"):
        load_rule_file(tmp_path / "nope.yaml")


def test_json_schema_covers_every_action_and_refuses_unknown_keys() -> None:
    schema = json_schema()
    json.dumps(schema)  # serialisable as is
    rule = schema["$defs"]["Rule"]
    assert rule["additionalProperties"] is False
    assert set(rule["properties"]) == {"id", "description", "enabled", "match", "action", "limits"}
    tags = set(schema["$defs"]["Rule"]["properties"]["action"]["discriminator"]["mapping"])
    assert tags == set(ACTIONS)
    assert schema["$defs"]["Match"]["additionalProperties"] is False


def test_a_rewrite_field_must_match_only_the_api_it_rewrites() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: no-match
            action: {type: rewrite, field: fetch_drop_records}
          - id: produce-too
            match:
              api: [fetch, produce]
            action: {type: rewrite, field: fetch_skip_batch}
          - id: fetch-field-on-produce
            match: {api: produce}
            action: {type: rewrite, field: fetch_stale_high_watermark}
          - id: produce-field-on-fetch
            match: {api: 1}
            action: {type: rewrite, field: produce_error_offset_zero}
          - id: fits
            match: {api: Produce, direction: response}
            action: {type: rewrite, field: produce_error_offset_zero}
    """)
    assert lines == [
        ("rules/broken.yaml:4: rules[0].action.field: action rewrite with field fetch_drop_records applies only to fetch: "
         "the rule must say `match: {api: fetch}` (without it, it matches every API)"),
        "rules/broken.yaml:7: rules[1].match.api: action rewrite with field fetch_skip_batch applies only to fetch, not produce",
        "rules/broken.yaml:10: rules[2].match.api: action rewrite with field fetch_stale_high_watermark applies only to fetch, not produce",
        "rules/broken.yaml:13: rules[3].match.api: action rewrite with field produce_error_offset_zero applies only to produce, not fetch",
    ]


def test_a_glob_is_bounded_in_size() -> None:
    lines = problems_of("""
        version: 1
        rules:
          - id: a
            match:
              topic: '""" + "x" * 4097 + """'
            action: {type: drop}
    """)
    assert lines == ["rules/broken.yaml:5: rules[0].match.topic: a glob may be at most 4096 bytes long, this one is 4097"]
    load_rule_text("version: 1\nrules:\n  - id: a\n    match: {topic: '" + "x" * 4096 + "'}\n    action: {type: drop}\n", "ok.yaml")
