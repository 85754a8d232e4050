"""Seeded determinism of the fault engine, and robustness of rule validation, by property."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

from kproxy.faults import FORWARD, ExchangeView, RuleFileError, engine_from_rules, load_rule_text
from kproxy.faults.json_source import read_json
from kproxy.faults.loader import validate_rule_file
from kproxy.faults.prng import SplitMix64
from kproxy.faults.yaml_source import SourceData

APIS = (0, 1, 24, 26)

views = st.builds(
    ExchangeView,
    api_key=st.sampled_from(APIS),
    api_version=st.integers(0, 10),
    direction=st.sampled_from(("request", "response")),
    client_id=st.none() | st.sampled_from(("app-1", "app-2", "tool")),
    transactional_id=st.none() | st.sampled_from(("tx-a", "tx-b")),
    topics=st.none() | st.lists(
        st.tuples(st.sampled_from(("orders", "audit")), st.lists(st.integers(0, 3), max_size=3).map(tuple)),
        max_size=2,
    ).map(tuple),
    committed=st.none() | st.booleans(),
    txn_number=st.none() | st.integers(1, 5),
)

# A mixed rule set: counting, probability and jitter all draw or count.
RULES: list[dict[str, Any]] = [
    {"id": "torn", "match": {"api": "end_txn", "committed": True, "txn_number": 1},
     "action": {"type": "duplicate", "copies": 1, "hold_until": "next_txn_records"}, "limits": {"once": True}},
    {"id": "coin", "match": {"api": "produce", "probability": 0.5},
     "action": {"type": "delay", "ms": 10, "jitter_ms": 5}},
    {"id": "every-third-fetch", "match": {"api": "fetch", "direction": "response", "every": 3, "after": 1},
     "action": {"type": "rewrite", "field": "fetch_drop_records"}},
    {"id": "orders", "match": {"topic": "ord*", "probability": 0.3}, "action": {"type": "drop_response"},
     "limits": {"count": 5}},
]


def run(seed: int, sequence: list[tuple[ExchangeView, float]], rules: list[dict[str, Any]] = RULES) -> list[Any]:
    engine = engine_from_rules(rules, seed=seed)
    return [engine.decide(view, now) for view, now in sequence]


timed_views = st.lists(st.tuples(views, st.floats(0, 1000, allow_nan=False)), max_size=60).map(
    lambda items: sorted(items, key=lambda item: item[1])
)


@settings(max_examples=60, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), sequence=timed_views)
def test_same_seed_same_views_same_decisions(seed: int, sequence: list[tuple[ExchangeView, float]]) -> None:
    assert run(seed, sequence) == run(seed, sequence)


@settings(max_examples=30, deadline=None)
@given(seeds=st.lists(st.integers(0, 2**64 - 1), min_size=2, max_size=2, unique=True))
def test_different_seeds_differ_with_probability_one_half(seeds: list[int]) -> None:
    coin = [{"id": "coin", "match": {"probability": 0.5}, "action": {"type": "drop"}}]
    sequence = [(ExchangeView(0, 9), 0.0)] * 200
    first, second = ([d is FORWARD for d in run(seed, sequence, coin)] for seed in seeds)
    assert first != second  # 2**-200 chance of a false failure
    assert 60 < sum(first) < 140  # and each is a fair-looking coin


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32), sequence=st.lists(views, max_size=60))
def test_an_unrelated_rule_does_not_shift_another_rules_draws(seed: int, sequence: list[ExchangeView]) -> None:
    coin_only = [r for r in RULES if r["id"] == "coin"]
    # Same rule, plus a probabilistic rule that only ever sees API 24 (placed first).
    with_other = [{"id": "other", "match": {"api": 24, "probability": 0.5}, "action": {"type": "drop"}}] + coin_only
    timed = [(v, 0.0) for v in sequence if v.api_key != 24]
    assert run(seed, timed, coin_only) == run(seed, timed, with_other)


@settings(max_examples=30, deadline=None)
@given(seed=st.integers(0, 2**64 - 1), sequence=timed_views)
def test_reset_counters_replays_the_same_decisions(seed: int, sequence: list[tuple[ExchangeView, float]]) -> None:
    engine = engine_from_rules(RULES, seed=seed)
    first = [engine.decide(v, now) for v, now in sequence]
    engine.reset_counters()
    assert [engine.decide(v, now) for v, now in sequence] == first


@given(seed=st.integers(0, 2**64 - 1))
def test_prng_floats_are_in_the_unit_interval(seed: int) -> None:
    stream = SplitMix64(seed)
    assert all(0.0 <= stream.random() < 1.0 for _ in range(100))


def test_splitmix64_matches_its_published_reference_values() -> None:
    # Reference output of SplitMix64 seeded with 1234567 (from the algorithm's reference C code).
    stream = SplitMix64(1234567)
    assert [stream.next_u64() for _ in range(3)] == [6457827717110365317, 3203168211198807973, 9817491932198370423]


# Arbitrary YAML-like data: validation either accepts it or refuses it with a RuleFileError.
scalars = st.none() | st.booleans() | st.integers(-5, 2**40) | st.floats(allow_nan=False) | st.sampled_from(
    ("produce", "end_txn", "delay", "drop", "request", "response", "NOT_LEADER_OR_FOLLOWER", "3-5", "*", "[", "")
)
keys = st.sampled_from(("version", "rules", "id", "match", "action", "type", "ms", "api", "limits", "count",
                        "schedule", "phases", "name", "duration_s", "probability", "txn_number", "min", "x"))
documents = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=5),
                         max_leaves=30)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=documents)
def test_validation_refuses_garbage_with_rule_file_errors_only(data: Any) -> None:
    try:
        validate_rule_file(SourceData(data, {}), "fuzz.yaml")
    except RuleFileError as exc:
        assert str(exc).startswith("fuzz.yaml")


@settings(max_examples=200, deadline=None)
# Always tried: a rule whose only fault is the duplicate id (it came out as "fuzz.yaml:1:", a line this data lacks).
@example(rule={"id": "r", "match": {}, "action": {"type": "drop"}})
@given(rule=st.fixed_dictionaries({"id": st.just("r"), "match": st.dictionaries(keys, scalars, max_size=3),
                                   "action": st.dictionaries(keys, scalars, max_size=3)}))
def test_generated_rules_validate_or_refuse_cleanly(rule: dict[str, Any]) -> None:
    data = {"version": 1, "rules": [{**rule, "action": {"type": "drop"}}, rule]}
    try:
        validate_rule_file(SourceData(data, {}), "fuzz.yaml")
    except RuleFileError as exc:
        assert all(line.startswith("fuzz.yaml: rules[") for line in str(exc).splitlines())


# -- rule file text, hostile or broken: only RuleFileError may come out ---------------------

SHIPPED_TEXTS = [p.read_text() for p in sorted((Path(__file__).resolve().parent.parent / "rules").glob("*.yaml"))]
# Pieces of YAML that once escaped the loader as RecursionError, ConstructorError or
# ValueError, or made it hang, mixed with ordinary syntax so they land in every position.
FRAGMENTS = (
    "&a ", "*a", "&b ", "*b", "!foo ", "!!int ", "!!float ", "!!binary ", "!!python/object:os.system ", "!!set ",
    "<<: ", "? ", "- ", ": ", ", ", "[", "]", "{", "}", "[[[[[[[[[[", "]]]]]]]]]]", "\n", "\n  ", "\t", "---\n",
    "...\n", "'", '"', "#", "%TAG ! tag:x,2000:\n", "=", "~", ".inf", "-.inf", ".nan", "1.0e+999", "1:2:3:4",
    "9" * 30, "0x1F", "0o17", "0b101", "2024-13-45", "2024-01-01", "true", "null", "version: 1\n", "rules:\n",
    "ms: ", "seed: ", "every: ", "duration_s: ", "probability: ", "id: a\n", "action: {type: delay, ms: 1}\n",
    "\x00", "\ufeff",
)
mutations = st.lists(st.tuples(st.floats(0, 1), st.sampled_from(FRAGMENTS)), max_size=8)


def mutate(text: str, edits: list[tuple[float, str]]) -> str:
    for where, fragment in edits:
        cut = int(where * len(text))
        text = text[:cut] + fragment + text[cut:]
    return text


rule_texts = (
    st.builds(mutate, st.sampled_from(SHIPPED_TEXTS), mutations)
    | st.lists(st.sampled_from(FRAGMENTS), max_size=40).map("".join)
    | st.text(max_size=200)
)


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(text=rule_texts)
def test_rule_text_loads_or_is_refused_with_rule_file_errors_only(text: str) -> None:
    try:
        load_rule_text(text, "fuzz.yaml")
    except RuleFileError as exc:
        assert all(line.startswith("fuzz.yaml") for line in str(exc).splitlines()), str(exc)


JSON_FRAGMENTS = ('{"type": "delay", "ms": ', "Infinity", "-Infinity", "NaN", "1e999", "5", "-1", "[", "]", "{", "}",
                  '"ms": ', '"every": ', '"match": {', '"action": ', ", ", '"x"', "null", "true", "9" * 40, "[" * 50)
json_bodies = st.lists(st.sampled_from(JSON_FRAGMENTS), max_size=30).map(lambda parts: "".join(parts).encode())


@settings(max_examples=200, deadline=2000, suppress_health_check=[HealthCheck.too_slow])
@given(body=json_bodies)
def test_admin_bodies_are_installed_whole_or_refused_with_rule_file_errors_only(body: bytes) -> None:
    engine = engine_from_rules([])
    try:
        data = read_json(body, "rule 'x'")
        engine.put_rule({**data, "id": "x"} if isinstance(data, dict) else data)
    except RuleFileError:
        assert engine.list_rules() == []
    # Whatever was installed can be listed back as strict JSON (no NaN, no Infinity).
    json.dumps(engine.list_rules(), allow_nan=False)
