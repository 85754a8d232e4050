"""The fault engine: given a frame and the time, which fault (if any) applies.

Sans-IO: the caller passes the clock (`now`, monotonic seconds) into every
call, and randomness comes from seeded SplitMix64 streams, one per rule
(derived from the seed and the rule id), so the same sequence of views with
the same seed always gets the same decisions.

Semantics, in the order `decide` checks them, per rule in file order:

1. the rule is enabled and covers the frame's API and direction;
2. it is active now: if a schedule names it in some phase, only while such a
   phase runs; if it has `match.phase`, only while that phase runs; with
   `limits.duration_s`, only that long after its window opened (the phase
   start, or else the first decision after the rule was loaded);
3. the frame matches every static match field;
4. the rule's `matched` counter advances; nth/every/after count matches this
   way, so they see only frames that passed 1-3;
5. `limits.count` (or `once`) is not used up, nth/every/after agree, and the
   probability draw (taken only now) succeeds;
6. the rule's `applied` counter advances and its action builds the decision.

The first rule that passes all six wins; later rules do not see the frame.
If none does, the decision is `FORWARD`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from kproxy.faults.apis import UNNAMED_APIS
from kproxy.faults.consistency import rule_problems
from kproxy.faults.decisions import FORWARD, Decision
from kproxy.faults.errors import Problem, RuleFileError
from kproxy.faults.limits import MAX_RULES
from kproxy.faults.loader import validate_rule, validate_rule_file
from kproxy.faults.matching import CompiledRule
from kproxy.faults.model import Rule, RuleFile, Schedule
from kproxy.faults.prng import SplitMix64, stream_seed
from kproxy.faults.schedule import PhaseAt, phase_at
from kproxy.faults.view import ExchangeView
from kproxy.faults.yaml_source import SourceData
from kproxy.protocol.apis import API_NAMES

DIRECTIONS = ("request", "response")
DEFAULT_SEED = 0  # without a seed, runs are still reproducible


@dataclass
class _RuleState:
    stream: SplitMix64
    matched: int = 0
    applied: int = 0
    # When the rule's duration window opened, for rules not tied to a phase;
    # set by the first decision after the rule was loaded.
    loaded_at: float | None = None


@dataclass(frozen=True)
class _Tables:
    """Per (api key, direction) lookups, rebuilt whenever the rules change."""

    candidates: dict[tuple[int, str], tuple[CompiledRule, ...]] = field(default_factory=dict)
    # rules with no `api` key: what an API unknown to the table may still meet
    any_api: dict[str, tuple[CompiledRule, ...]] = field(default_factory=dict)
    needs_body: dict[tuple[int, str], bool] = field(default_factory=dict)


class FaultEngine:
    def __init__(self, rule_file: RuleFile, seed: int | None = None) -> None:
        self._explicit_seed = seed
        self._seed = self._effective_seed(rule_file)
        self._rules: list[CompiledRule] = [CompiledRule.compile(r) for r in rule_file.rules]
        self._states: dict[str, _RuleState] = {r.id: self._fresh_state(r.id) for r in self._rules}
        self._schedule: Schedule | None = rule_file.schedule
        self._scheduled_ids: frozenset[str] = self._named_by_phases(rule_file.schedule)
        self._version = rule_file.version
        self._file_seed = rule_file.seed
        # The schedule's time zero: the first `now` the engine is given.
        self._epoch: float | None = None
        self._last_now: float | None = None
        self._tables = self._build_tables()

    # -- hot path -----------------------------------------------------------

    def wants(self, api_key: int, direction: str) -> bool:
        """Could any enabled rule match a frame of this API and direction?"""
        return bool(self._candidates(api_key, direction))

    def needs_body(self, api_key: int, direction: str) -> bool:
        """Does an enabled rule for this API and direction match on body facts
        (topic, partition, transactional id, committed, transaction number)?"""
        found = self._tables.needs_body.get((api_key, direction))
        if found is None:
            return any(r.needs_body for r in self._tables.any_api.get(direction, ()))
        return found

    def decide(self, view: ExchangeView, now: float) -> Decision:
        self._observe(now)
        candidates = self._candidates(view.api_key, view.direction)
        if not candidates:
            return FORWARD
        phase = self._phase(now)
        for compiled in candidates:
            state = self._states[compiled.id]
            if not self._active(compiled, state, phase, now) or not compiled.matches(view):
                continue
            state.matched += 1
            if self._passes_counting(compiled.rule, state):
                state.applied += 1
                return compiled.spec.build(compiled.rule.action, compiled.id, state.stream.random)
        return FORWARD

    def active_phase(self, now: float | None = None) -> str | None:
        """The schedule phase active at `now` (None: the last time the engine was given)."""
        if now is not None:
            self._observe(now)
        elif self._last_now is None:
            return None
        phase = self._phase(self._last_now if now is None else now)
        return None if phase is None else phase.name

    # -- rule store (admin API) ---------------------------------------------

    @property
    def seed(self) -> int:
        return self._seed

    @property
    def rule_file(self) -> RuleFile:
        """The rules now in force, as a rule file (with admin-API edits)."""
        return RuleFile(version=self._version, seed=self._file_seed, rules=[r.rule for r in self._rules], schedule=self._schedule)

    def list_rules(self) -> list[dict[str, Any]]:
        """Every rule as written in YAML (defaults filled in) plus its counters."""
        return [self._describe(r) for r in self._rules]

    def get_rule(self, rule_id: str) -> dict[str, Any]:
        return self._describe(self._find(rule_id))

    def put_rule(self, rule_dict: Any) -> dict[str, Any]:
        """Add a rule, or replace the rule with its id (keeping its place and, if
        unchanged, its counters). RuleFileError if the rule is not valid."""
        return self.install_rule(self.check_rule(rule_dict))

    def check_rule(self, rule_dict: Any) -> CompiledRule:
        """Validate and compile a rule for `install_rule`. It changes nothing, so
        the admin API runs it on a worker thread: a large rule takes tens of ms."""
        phase_names = None if self._schedule is None else [p.name for p in self._schedule.phases]
        return CompiledRule.compile(validate_rule(rule_dict, _rule_source(rule_dict), phase_names))

    def install_rule(self, compiled: CompiledRule) -> dict[str, Any]:
        """Put a rule `check_rule` accepted; RuleFileError if the schedule it names
        changed since, or the proxy holds as many rules as it takes."""
        rule = compiled.rule
        source = _rule_source({"id": rule.id})
        phase_names = None if self._schedule is None else [p.name for p in self._schedule.phases]
        problems = rule_problems(rule, phase_names)
        if problems:
            raise RuleFileError([Problem(source, None, p.path, p.message) for p in problems])
        for i, existing in enumerate(self._rules):
            if existing.id == rule.id:
                if not _same_definition(existing.rule, rule):
                    self._states[rule.id] = self._fresh_state(rule.id)
                self._rules[i] = compiled
                break
        else:
            if len(self._rules) >= MAX_RULES:
                raise RuleFileError([Problem(source, None, (), f"the proxy already holds {MAX_RULES} rules, the most it takes")])
            self._rules.append(compiled)
            self._states[rule.id] = self._fresh_state(rule.id)
        self._tables = self._build_tables()
        return self._describe(compiled)

    def set_enabled(self, rule_id: str, enabled: bool) -> None:
        i = self._index(rule_id)
        # Only the flag changes: the compiled matchers are kept, not compiled again on the loop.
        compiled = self._rules[i]
        self._rules[i] = dataclasses.replace(compiled, rule=compiled.rule.model_copy(update={"enabled": enabled}))
        self._tables = self._build_tables()

    def delete_rule(self, rule_id: str) -> None:
        """Remove a rule. A schedule phase that names it simply has one rule fewer."""
        del self._rules[self._index(rule_id)]
        del self._states[rule_id]
        self._tables = self._build_tables()

    def reset_counters(self) -> None:
        """Zero every rule's counters and restart its random stream and duration window,
        so a rerun after a reset draws exactly what the first run drew."""
        self._states = {r.id: self._fresh_state(r.id) for r in self._rules}

    def replace(self, rules: RuleFile | CompiledRuleFile) -> None:
        """Hot reload. A rule whose definition is unchanged (same id, same content)
        keeps its counters, random stream and duration window (its `enabled` flag
        does not count as content); a new or changed
        rule starts fresh. An unchanged schedule keeps running; a changed one
        starts over at the next decision. A changed seed restarts every stream."""
        # Everything that could fail comes before the first assignment: a
        # replacement either happens whole or not at all.
        if isinstance(rules, RuleFile):
            rules = compile_rule_file(rules)
        rule_file, compiled = rules.rule_file, list(rules.rules)
        new_seed = self._effective_seed(rule_file)
        old_rules = {r.id: r.rule for r in self._rules}
        states: dict[str, _RuleState] = {}
        for rule in rule_file.rules:
            state = self._fresh_state(rule.id, new_seed)
            kept = self._states.get(rule.id) if _same_definition(old_rules.get(rule.id), rule) else None
            if kept is not None and new_seed == self._seed:
                state = kept
            elif kept is not None:
                state.matched, state.applied, state.loaded_at = kept.matched, kept.applied, kept.loaded_at
            states[rule.id] = state
        if rule_file.schedule != self._schedule:
            self._epoch = None
        self._seed = new_seed
        self._rules = compiled
        self._states = states
        self._schedule = rule_file.schedule
        self._scheduled_ids = self._named_by_phases(rule_file.schedule)
        self._version = rule_file.version
        self._file_seed = rule_file.seed
        self._tables = self._build_tables()

    # -- internals ----------------------------------------------------------

    def _effective_seed(self, rule_file: RuleFile) -> int:
        # An explicit seed (command line) wins over the file's.
        if self._explicit_seed is not None:
            return self._explicit_seed
        return rule_file.seed if rule_file.seed is not None else DEFAULT_SEED

    def _fresh_state(self, rule_id: str, seed: int | None = None) -> _RuleState:
        return _RuleState(SplitMix64(stream_seed(self._seed if seed is None else seed, rule_id)))

    @staticmethod
    def _named_by_phases(schedule: Schedule | None) -> frozenset[str]:
        if schedule is None:
            return frozenset()
        return frozenset(rule_id for phase in schedule.phases for rule_id in phase.rules)

    def _observe(self, now: float) -> None:
        if self._epoch is None:
            self._epoch = now
        self._last_now = now

    def _phase(self, now: float) -> PhaseAt | None:
        if self._schedule is None or self._epoch is None:
            return None
        return phase_at(self._schedule, self._epoch, now)

    def _active(self, compiled: CompiledRule, state: _RuleState, phase: PhaseAt | None, now: float) -> bool:
        window_start: float | None = None
        if compiled.id in self._scheduled_ids:
            if phase is None or compiled.id not in phase.rule_ids:
                return False
            window_start = phase.started_at
        wanted_phase = compiled.rule.match.phase
        if wanted_phase is not None:
            if phase is None or phase.name != wanted_phase:
                return False
            window_start = phase.started_at
        duration = compiled.rule.limits.duration_s
        if duration is None:
            return True
        if window_start is None:
            if state.loaded_at is None:
                state.loaded_at = now
            window_start = state.loaded_at
        return now - window_start < duration

    @staticmethod
    def _passes_counting(rule: Rule, state: _RuleState) -> bool:
        m = rule.match
        limit = rule.limits.max_applications
        if limit is not None and state.applied >= limit:
            return False
        n = state.matched - (m.after or 0)  # the position among matches after the skipped ones
        if n <= 0:
            return False
        if m.nth is not None and n != m.nth:
            return False
        if m.every is not None and n % m.every != 0:
            return False
        # Drawn last, so the stream advances only for frames that got this far.
        return m.probability is None or state.stream.random() < m.probability

    def _candidates(self, api_key: int, direction: str) -> tuple[CompiledRule, ...]:
        found = self._tables.candidates.get((api_key, direction))
        return self._tables.any_api.get(direction, ()) if found is None else found

    def _build_tables(self) -> _Tables:
        # One pass over the rules per direction, each rule filed under the APIs
        # it names: every admin change and reload rebuilds this on the event
        # loop, and asking each of ~90 APIs about each of 1,000 rules took 25 ms.
        enabled = [r for r in self._rules if r.rule.enabled]
        tables = _Tables()
        for direction in DIRECTIONS:
            on_side = [r for r in enabled if r.rule.match.direction == direction]
            tables.any_api[direction] = tuple(r for r in on_side if r.apis is None)
            by_api: dict[int, list[CompiledRule]] = {api_key: [] for api_key in API_NAMES}
            for compiled in on_side:  # in file order, which each API's list keeps
                for api_key in UNNAMED_APIS if compiled.apis is None else compiled.apis:
                    if api_key in by_api:
                        by_api[api_key].append(compiled)
            for api_key, rules in by_api.items():
                tables.candidates[(api_key, direction)] = tuple(rules)
                tables.needs_body[(api_key, direction)] = any(r.needs_body for r in rules)
        return tables

    def _index(self, rule_id: str) -> int:
        for i, compiled in enumerate(self._rules):
            if compiled.id == rule_id:
                return i
        raise KeyError(rule_id)

    def _find(self, rule_id: str) -> CompiledRule:
        return self._rules[self._index(rule_id)]

    def _describe(self, compiled: CompiledRule) -> dict[str, Any]:
        state = self._states[compiled.id]
        described = compiled.rule.model_dump(mode="json", exclude_none=True)
        described["counters"] = {"matched": state.matched, "applied": state.applied}
        return described


@dataclass(frozen=True)
class CompiledRuleFile:
    """A rule file compiled for `FaultEngine.replace`."""

    rule_file: RuleFile
    rules: tuple[CompiledRule, ...]


def compile_rule_file(rule_file: RuleFile) -> CompiledRuleFile:
    """Compile every rule of a file. It changes nothing, so a reload runs it on a
    worker thread: 1,000 rules with long version lists take about 80 ms."""
    return CompiledRuleFile(rule_file, tuple(CompiledRule.compile(r) for r in rule_file.rules))


def _rule_source(rule_dict: Any) -> str:
    rule_id = rule_dict.get("id") if isinstance(rule_dict, dict) else None
    return f"rule {rule_id!r}" if isinstance(rule_id, str) else "rule"


def _same_definition(old: Rule | None, new: Rule) -> bool:
    # Enabling or disabling a rule is not a new definition: it keeps its counters.
    return old is not None and old.model_copy(update={"enabled": True}) == new.model_copy(update={"enabled": True})


def engine_from_rules(rules: Iterable[dict[str, Any]], seed: int | None = None, **file_keys: Any) -> FaultEngine:
    """A convenience for tests and embedding: build an engine from plain rule dicts."""
    data = {"version": 1, "rules": list(rules), **file_keys}
    return FaultEngine(validate_rule_file(SourceData(data, {}), "<rules>"), seed=seed)


__all__ = ["CompiledRuleFile", "FaultEngine", "ExchangeView", "RuleFileError", "Problem", "compile_rule_file",
           "engine_from_rules"]
