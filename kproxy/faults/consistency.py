"""Checks that relate several parts of a rule file.

Each problem carries the path of the offending value (as pydantic locations
do), so the loader can report it at the right line.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from kproxy.faults.actions import ACTIONS
from kproxy.faults.apis import resolve_api
from kproxy.faults.fieldspecs import parse_apis
from kproxy.faults.model import Rule, RuleFile
from kproxy.protocol.apis import API_NAMES

Path = tuple[str | int, ...]


@dataclass(frozen=True)
class Inconsistency:
    path: Path
    message: str


def rule_problems(rule: Rule, phase_names: Iterable[str] | None, prefix: Path = ()) -> list[Inconsistency]:
    """Problems of one rule, given the phase names of the schedule it lives under (None: no schedule)."""
    problems = []
    spec = ACTIONS[rule.action.type]
    if rule.match.direction not in spec.directions:
        problems.append(Inconsistency(
            prefix + ("match", "direction"),
            f"action {spec.name} cannot apply to a {rule.match.direction} (allowed: {', '.join(spec.directions)})",
        ))
    problems.extend(_api_problems(rule, spec.apis, prefix))
    if rule.match.phase is not None:
        if phase_names is None:
            problems.append(Inconsistency(prefix + ("match", "phase"), f"phase {rule.match.phase!r} given but the file has no schedule"))
        elif rule.match.phase not in set(phase_names):
            problems.append(Inconsistency(prefix + ("match", "phase"), f"no schedule phase is named {rule.match.phase!r}"))
    return problems


def _api_problems(rule: Rule, fitting: Callable[..., tuple[str, ...] | None] | None, prefix: Path) -> list[Inconsistency]:
    # An action whose parameters only make sense for some APIs (a rewrite of a
    # Fetch response) could only fail on any other API's frames: refuse the rule
    # now rather than let it break every matching exchange.
    if fitting is None:
        return []
    names = fitting(rule.action)
    if names is None:
        return []
    allowed = {resolve_api(name) for name in names}
    what = f"action {rule.action.type} with field {rule.action.field}" if hasattr(rule.action, "field") else f"action {rule.action.type}"
    wanted = " or ".join(names)
    if rule.match.api is None:
        # Reported at the action: the rule may have no `match` to point at.
        return [Inconsistency(prefix + ("action", "field") if hasattr(rule.action, "field") else prefix + ("action",),
                              f"{what} applies only to {wanted}: the rule must say `match: {{api: {names[0]}}}` "
                              "(without it, it matches every API)")]
    unfit = parse_apis(rule.match.api) - allowed
    if unfit:
        others = ", ".join(sorted(API_NAMES[key] for key in unfit))
        return [Inconsistency(prefix + ("match", "api"), f"{what} applies only to {wanted}, not {others}")]
    return []


def file_problems(rule_file: RuleFile) -> list[Inconsistency]:
    problems: list[Inconsistency] = []
    phase_names = None if rule_file.schedule is None else [p.name for p in rule_file.schedule.phases]
    first_index: dict[str, int] = {}
    for i, rule in enumerate(rule_file.rules):
        if rule.id in first_index:
            problems.append(Inconsistency(("rules", i, "id"), f"duplicate rule id {rule.id!r} (first used by rules[{first_index[rule.id]}])"))
        else:
            first_index[rule.id] = i
        problems.extend(rule_problems(rule, phase_names, ("rules", i)))
    if rule_file.schedule is not None:
        seen_phases: set[str] = set()
        for i, phase in enumerate(rule_file.schedule.phases):
            if phase.name in seen_phases:
                problems.append(Inconsistency(("schedule", "phases", i, "name"), f"duplicate phase name {phase.name!r}"))
            seen_phases.add(phase.name)
            for j, rule_id in enumerate(phase.rules):
                if rule_id not in first_index:
                    problems.append(Inconsistency(("schedule", "phases", i, "rules", j), f"phase {phase.name!r} names unknown rule {rule_id!r}"))
    return problems
