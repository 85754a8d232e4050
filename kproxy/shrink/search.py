"""The shrinking search: pure functions over candidates and a verdict callback.

A candidate is a rule file (as plain data) plus the workload settings that
`kproxy demo` takes on its command line. The search proposes smaller
candidates in a fixed order and keeps a change only when the callback says
the anomaly still appears:

0. the workload's run time: a shorter run and fewer processes, each
   straight to its floor, one try each: every later candidate then runs
   that much quicker (in a torn-transaction shrink, a 6 s run with three
   processes took 15 s a candidate, a 2 s run with one 9 s);
1. the rule set: whole rules (delta debugging), then each rule's matcher
   conditions (delta debugging), then the schedule (all of it, else phases
   by delta debugging);
2. each action's and matcher's numbers: smaller delays, fewer copies, a
   lower `nth`, `every`, `after`, `count` or probability (binary search
   towards the smallest value);
3. the workload: fewer processes, a shorter run, shorter transactions,
   fewer keys (binary search towards the floor).

Nothing here runs anything: the callback does (kproxy.shrink.runner runs
the demo; the tests pass a fake). The callback may raise `Stop` (budget
spent) and a KeyboardInterrupt is taken the same way: the search ends and
returns the best candidate found so far. Given the same verdicts the search
takes the same path, so a fixed seed gives the same result.

The result is a local minimum under these moves: no single move of the last
pass could be made without losing the anomaly. A smaller reproduction that
needs two moves at once, or a different rule, may exist.
"""

from __future__ import annotations

import copy
import json
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any, Literal

# Match keys that say what the fault is aimed at; dropping them would turn
# an EndTxn fault into a fault on every request, a wider fault, not a
# smaller one. Every other condition only narrows when the rule applies.
KEPT_MATCH_KEYS = frozenset({"api", "direction"})

Outcome = Literal["kept", "rejected", "invalid", "repeated", "unfinished"]


@dataclass(frozen=True)
class Workload:
    """The workload settings `kproxy demo` takes: --processes, --duration, --max-txn-length, --keys."""

    processes: int
    duration: float
    max_txn_length: int
    keys: int


@dataclass(frozen=True)
class Floors:
    """The smallest workload the search tries."""

    processes: int = 1
    duration: float = 2.0
    max_txn_length: int = 1
    keys: int = 1


@dataclass(frozen=True)
class Candidate:
    rules: Mapping[str, Any]  # a rule file as plain data: version, seed, rules, schedule
    workload: Workload

    def key(self) -> str:
        return json.dumps({"rules": self.rules, "workload": asdict(self.workload)}, sort_keys=True)

    @property
    def rule_ids(self) -> list[str]:
        return [r["id"] for r in self.rules.get("rules", [])]


@dataclass(frozen=True)
class Verdict:
    reproduced: bool
    runs: int = 1
    hits: int = 0
    detail: Mapping[str, Any] = field(default_factory=dict)  # the callback's own record (counts, directories)


@dataclass(frozen=True)
class Step:
    axis: str  # rules, conditions, schedule, params, workload
    change: str
    outcome: Outcome
    verdict: Verdict | None = None
    reason: str = ""  # why an invalid candidate was not run


@dataclass
class Result:
    start: Candidate
    best: Candidate
    steps: list[Step]
    stopped: str | None = None  # None: the search finished; else why it ended early

    @property
    def kept(self) -> list[Step]:
        return [s for s in self.steps if s.outcome == "kept"]


class Stop(Exception):
    """Raised by the verdict callback to end the search (the budget is spent)."""


Judge = Callable[[Candidate, str, str], Verdict]  # (candidate, axis, change) -> verdict
Validate = Callable[[Mapping[str, Any]], str | None]  # rule file data -> problem, or None


def validate_rules(data: Mapping[str, Any]) -> str | None:
    """The rule file checks of `kproxy rules validate`, on data in memory."""
    from kproxy.faults.errors import RuleFileError
    from kproxy.faults.loader import validate_rule_file
    from kproxy.faults.yaml_source import SourceData

    try:
        validate_rule_file(SourceData(copy.deepcopy(dict(data)), {}), "candidate")
    except RuleFileError as exc:
        return str(exc)
    return None


class _Search:
    def __init__(self, start: Candidate, judge: Judge, validate: Validate) -> None:
        self.best = start
        self.judge = judge
        self.validate = validate
        self.steps: list[Step] = []
        self.seen: dict[str, Verdict] = {start.key(): Verdict(reproduced=True)}

    def attempt(self, candidate: Candidate, axis: str, change: str) -> bool:
        """Try a candidate; adopt it when the anomaly still appears."""
        key = candidate.key()
        if key in self.seen:
            verdict = self.seen[key]
            self.steps.append(Step(axis, change, "repeated", verdict))
            if verdict.reproduced:
                self.best = candidate
            return verdict.reproduced
        problem = self.validate(candidate.rules)
        if problem is not None:
            self.seen[key] = Verdict(reproduced=False, runs=0)
            self.steps.append(Step(axis, change, "invalid", reason=problem))
            return False
        try:
            verdict = self.judge(candidate, axis, change)
        except (Stop, KeyboardInterrupt):
            self.steps.append(Step(axis, change, "unfinished"))
            raise
        self.seen[key] = verdict
        self.steps.append(Step(axis, change, "kept" if verdict.reproduced else "rejected", verdict))
        if verdict.reproduced:
            self.best = candidate
        return verdict.reproduced


def ddmin(items: Sequence[Any], test: Callable[[list[Any]], bool], allow_empty: bool = False) -> list[Any]:
    """Zeller's delta debugging: a 1-minimal sublist of `items` (in order) for
    which `test` holds, given that it holds for `items`. With allow_empty the
    empty list is tried first."""
    items = list(items)
    if allow_empty and items and test([]):
        return []
    n = 2
    while len(items) >= 2:
        chunks = _split(items, n)
        for chunk in chunks:
            if len(chunk) < len(items) and test(chunk):
                items, n = chunk, 2
                break
        else:
            for i in range(len(chunks)):
                complement = [x for j, c in enumerate(chunks) if j != i for x in c]
                if len(chunks) > 2 and test(complement):
                    items, n = complement, max(n - 1, 2)
                    break
            else:
                if n >= len(items):
                    break
                n = min(len(items), 2 * n)
    return items


def _split(items: list[Any], n: int) -> list[list[Any]]:
    size, extra = divmod(len(items), n)
    chunks, start = [], 0
    for i in range(n):
        end = start + size + (1 if i < extra else 0)
        if end > start:
            chunks.append(items[start:end])
        start = end
    return chunks


def shrink_number(current: float, target: float, test: Callable[[float], bool], *, integer: bool,
                  try_target: bool = True, resolution: float = 1.0, max_tries: int = 4) -> float:
    """The smallest value in [target, current] found for which `test` holds
    (it holds at `current`): the target first, then a binary search, at most
    `max_tries` tests, stopping when the interval is within `resolution`."""
    if current <= target:
        return current
    low, high, tries = target, current, 0  # test fails at low (or is not tried there), holds at high
    if try_target:
        tries += 1
        if test(target):
            return target
    while tries < max_tries and high - low > resolution:
        middle = (low + high) / 2
        middle = math.floor(middle) if integer else round(middle / resolution) * resolution
        if integer and middle <= low:
            break
        if middle <= low or middle >= high:
            break
        tries += 1
        if test(middle):
            high = middle
        else:
            low = middle
    return high


# --- moves on rule file data -------------------------------------------------


def _with_rules(data: Mapping[str, Any], keep_ids: Sequence[str]) -> dict[str, Any]:
    out = copy.deepcopy(dict(data))
    keep = set(keep_ids)
    out["rules"] = [r for r in out.get("rules", []) if r["id"] in keep]
    if out.get("schedule"):
        for phase in out["schedule"]["phases"]:
            phase["rules"] = [r for r in phase.get("rules", []) if r in keep]
    return out


def _rule_index(data: Mapping[str, Any], rule_id: str) -> int:
    return next(i for i, r in enumerate(data["rules"]) if r["id"] == rule_id)


def _with_match(data: Mapping[str, Any], rule_id: str, keys: Sequence[str]) -> dict[str, Any]:
    out = copy.deepcopy(dict(data))
    rule = out["rules"][_rule_index(out, rule_id)]
    match = rule.get("match") or {}
    rule["match"] = {k: v for k, v in match.items() if k in keys or k in KEPT_MATCH_KEYS}
    if not rule["match"]:
        del rule["match"]
    return out


def _with_phases(data: Mapping[str, Any], names: Sequence[str] | None) -> dict[str, Any]:
    out = copy.deepcopy(dict(data))
    if names is None:
        out.pop("schedule", None)
    else:
        out["schedule"]["phases"] = [p for p in out["schedule"]["phases"] if p["name"] in set(names)]
    return out


def _set_path(data: Mapping[str, Any], rule_id: str, path: tuple[str, ...], value: Any) -> dict[str, Any]:
    out = copy.deepcopy(dict(data))
    node = out["rules"][_rule_index(out, rule_id)]
    for part in path[:-1]:
        node = node[part]
    node[path[-1]] = value
    return out


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class NumericParam:
    """A number in a rule that a smaller value makes a smaller fault."""

    path: tuple[str, ...]
    target: float
    integer: bool
    try_target: bool = True
    resolution: float = 1.0


# Where each shrinkable number lives in a rule, and how small it may go.
NUMERIC_PARAMS = (
    NumericParam(("action", "ms"), 0, integer=False),
    NumericParam(("action", "jitter_ms"), 0, integer=False),
    NumericParam(("action", "spacing_ms"), 0, integer=False),
    NumericParam(("action", "timeout_ms"), 1, integer=False),
    NumericParam(("action", "copies"), 1, integer=True),
    NumericParam(("action", "lag"), 1, integer=True),
    NumericParam(("match", "nth"), 1, integer=True),
    NumericParam(("match", "every"), 1, integer=True),
    NumericParam(("match", "after"), 0, integer=True),
    # Probability zero never fires: halve towards it instead.
    NumericParam(("match", "probability"), 0, integer=False, try_target=False, resolution=0.01),
    NumericParam(("limits", "count"), 1, integer=True),
    NumericParam(("match", "txn_number", "max"), 1, integer=True),
)


def _get_path(rule: Mapping[str, Any], path: tuple[str, ...]) -> Any:
    node: Any = rule
    for part in path:
        if not isinstance(node, Mapping) or part not in node:
            return None
        node = node[part]
    return node


def _plain(value: float, integer: bool) -> int | float:
    if integer or float(value).is_integer():
        return int(value)
    return value


def shrink(start: Candidate, judge: Judge, *, validate: Validate = validate_rules, floors: Floors = Floors(),
           require_rule: bool = True) -> Result:
    """Shrink `start` (whose anomaly appears) under the moves above.

    require_rule: the anomaly is the rules' doing (the starting run blamed a
    rule for it), so a candidate without rules is not tried.
    """
    search = _Search(start, judge, validate)
    stopped: str | None = None
    try:
        _shrink_run_time(search, floors)
        _shrink_rules(search, require_rule)
        _shrink_conditions(search)
        _shrink_schedule(search)
        _shrink_params(search)
        _shrink_workload(search, floors)
    except Stop as exc:
        stopped = str(exc) or "budget"
    except KeyboardInterrupt:
        stopped = "interrupted"
    return Result(start, search.best, search.steps, stopped)


def _shrink_rules(search: _Search, require_rule: bool) -> None:
    ids = search.best.rule_ids

    def test(keep: list[str]) -> bool:
        dropped = [i for i in search.best.rule_ids if i not in keep]
        change = f"drop rule{'s' if len(dropped) > 1 else ''} {', '.join(dropped)}" if keep else "drop every rule"
        return search.attempt(replace(search.best, rules=_with_rules(search.best.rules, keep)), "rules", change)

    ddmin(ids, test, allow_empty=not require_rule)


def _shrink_conditions(search: _Search) -> None:
    for rule_id in search.best.rule_ids:
        rule = search.best.rules["rules"][_rule_index(search.best.rules, rule_id)]
        keys = [k for k in (rule.get("match") or {}) if k not in KEPT_MATCH_KEYS]

        def test(keep: list[str], rule_id: str = rule_id, keys: list[str] = keys) -> bool:
            dropped = [k for k in keys if k not in keep]
            current = search.best.rules["rules"][_rule_index(search.best.rules, rule_id)].get("match") or {}
            dropped = [k for k in dropped if k in current]
            change = f"rule {rule_id}: drop match condition{'s' if len(dropped) > 1 else ''} {', '.join(dropped)}"
            return search.attempt(replace(search.best, rules=_with_match(search.best.rules, rule_id, keep)),
                                  "conditions", change)

        ddmin(keys, test, allow_empty=True)


def _shrink_schedule(search: _Search) -> None:
    schedule = search.best.rules.get("schedule")
    if not schedule:
        return
    if search.attempt(replace(search.best, rules=_with_phases(search.best.rules, None)), "schedule",
                      "drop the schedule (every rule always active)"):
        return
    names = [p["name"] for p in schedule["phases"]]

    def test(keep: list[str]) -> bool:
        dropped = [n for n in names if n not in keep and n in {p["name"] for p in search.best.rules["schedule"]["phases"]}]
        change = f"drop schedule phase{'s' if len(dropped) > 1 else ''} {', '.join(dropped)}"
        return search.attempt(replace(search.best, rules=_with_phases(search.best.rules, keep)), "schedule", change)

    ddmin(names, test)


def _shrink_params(search: _Search) -> None:
    for rule_id in search.best.rule_ids:
        for param in NUMERIC_PARAMS:
            rule = search.best.rules["rules"][_rule_index(search.best.rules, rule_id)]
            current = _get_path(rule, param.path)
            if not _number(current):
                continue
            target = param.target
            if param.path == ("match", "txn_number", "max"):
                target = max(target, rule["match"]["txn_number"].get("min", 1))
            name = ".".join(param.path)

            def test(value: float, rule_id: str = rule_id, param: NumericParam = param, name: str = name) -> bool:
                shown = _plain(value, param.integer)
                was = _get_path(search.best.rules["rules"][_rule_index(search.best.rules, rule_id)], param.path)
                return search.attempt(
                    replace(search.best, rules=_set_path(search.best.rules, rule_id, param.path, shown)),
                    "params", f"rule {rule_id}: {name} {was} -> {shown}")

            shrink_number(current, target, test, integer=param.integer, try_target=param.try_target,
                          resolution=param.resolution)


WORKLOAD_AXES = (
    ("processes", "processes", True, 1.0),
    ("duration", "duration (s)", False, 1.0),
    ("max_txn_length", "max transaction length", True, 1.0),
    ("keys", "keys", True, 1.0),
)


#: The workload axes that set how long each run takes, tried at their floors first.
RUN_TIME_AXES = ("duration", "processes")


def _shrink_run_time(search: _Search, floors: Floors) -> None:
    # One try each, at the floor: a rejected floor costs one run and the
    # workload pass below searches that axis again (its floor is then a
    # repeat, not a run).
    axes = {axis[0]: axis for axis in WORKLOAD_AXES}
    for attr, label, integer, _ in (axes[name] for name in RUN_TIME_AXES):
        floor, was = getattr(floors, attr), getattr(search.best.workload, attr)
        if was > floor:
            candidate = replace(search.best, workload=replace(search.best.workload, **{attr: _plain(floor, integer)}))
            search.attempt(candidate, "workload", f"{label} {_plain(was, integer)} -> {_plain(floor, integer)}")


def _shrink_workload(search: _Search, floors: Floors) -> None:
    for attr, label, integer, resolution in WORKLOAD_AXES:
        current = getattr(search.best.workload, attr)

        def test(value: float, attr: str = attr, label: str = label, integer: bool = integer) -> bool:
            shown = _plain(value, integer)
            was = getattr(search.best.workload, attr)
            candidate = replace(search.best, workload=replace(search.best.workload, **{attr: shown}))
            return search.attempt(candidate, "workload", f"{label} {_plain(was, integer)} -> {shown}")

        shrink_number(current, getattr(floors, attr), test, integer=integer, resolution=resolution)


# --- reading a report ---------------------------------------------------------


def attributed_rules(report: Mapping[str, Any], anomaly: str) -> set[str]:
    """Rules the report blames for cases of `anomaly`: its fault_impact rows,
    and the cases whose cause is a rule."""
    rules = {
        row["rule"]
        for row in report.get("stats", {}).get("fault_impact") or ()
        if row.get("anomaly") == anomaly and (row.get("cases") or 0) > 0 and row.get("rule")
    }
    for case in report.get("anomalies", {}).get(anomaly) or ():
        cause = case.get("cause") if isinstance(case, Mapping) else None
        if isinstance(cause, Mapping) and cause.get("by") == "rule" and cause.get("rule"):
            rules.add(cause["rule"])
    return rules


def anomaly_appears(report: Mapping[str, Any], anomaly: str, require_rule: bool) -> bool:
    """The anomaly has cases, and, when required, a rule is blamed for them
    (so that a shrink cannot drift onto the broker's own anomalies)."""
    if (report.get("counts", {}).get(anomaly) or 0) <= 0:
        return False
    return not require_rule or bool(attributed_rules(report, anomaly))
