"""What caused each case: a rule, the broker, the client, or nothing found.

Runs on the driver over the collected cases and the wire's per-value facts
(kproxy_spark.wire.facts.value_facts). Every case of a class that can make a
history invalid gets one ``cause``; the informational wire tables get one
when a rule stands behind them. A cause names a rule only when the trace shows the
rule's action on the case's causal path: the EndTxn or Produce it held,
copied or delayed decided the value's fate, or the Fetch response it
rewrote is what served or hid the value (the broker's own response, traced
beside the rewritten one, would not have). What the broker's own responses
did is diagnosed from the protocol's definitions (docs/analysis.md,
"Causes"; kproxy_spark.wire.diagnoses, one row each). Which wire checks
name their cause in their `rules` and which are a broker diagnosis comes
from kproxy_spark.wire.registry. The client's part comes from the history
(kproxy_spark.checks.causes).

``cause`` is a dict: by (rule | broker | client | unexplained), name (the
fact or diagnosis), rule (when by is rule), at (where on the wire), text.
``stats.causes`` counts cases per class and cause label (``rule:ID``,
``broker:DIAGNOSIS``, ``client:NAME``, ``unexplained``); ``fault-impact``
counts per rule the cases attributed to it, and every rule that acted gets
one informational ``rule-effect`` case saying what it did.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping
from typing import Any

from kproxy_spark.wire.diagnoses import DIAGNOSES
from kproxy_spark.wire.diagnoses import MISSED as DIAGNOSED_MISSED
from kproxy_spark.wire.diagnoses import SERVED as DIAGNOSED_SERVED
from kproxy_spark.wire.phrases import error as _error_name
from kproxy_spark.wire.registry import (
    BROKER_DIAGNOSES,
    BY_RULES_CHECKS,
    DIAGNOSED,
    RULE_ONLY,
)

RULE, BROKER, CLIENT, UNEXPLAINED = "rule", "broker", "client", "unexplained"

# What can explain a client reading a value it should not have (its send
# failed or aborted): the fact, and the value's fate it needs on the wire.
SERVED_WRONGLY = (
    ("stale-end-txn", "committed"),  # a stale EndTxn(commit) committed it
    ("late-produce", "committed"),  # a late copy landed in a later, committed transaction
    ("cut-off-by-stale-end-txn", "committed"),  # cut off from its aborted transaction, a later commit took it
    # served as aborted records nothing told the client to drop, or past the LSO
    *((d.name, None) for d in DIAGNOSES if d.explains == DIAGNOSED_SERVED),
)
# What can explain committed values no client read.
MISSED = (
    ("stale-end-txn", "aborted"),  # a stale EndTxn(abort) aborted a transaction the client committed
    ("cut-off-by-stale-end-txn", "aborted"),  # cut off from its committed transaction, a later abort took it
    ("removed-by-rule", None),
    # dropped by an aborted entry that did not apply, or skipped among records served
    *((d.name, None) for d in DIAGNOSES if d.explains == DIAGNOSED_MISSED),
)
# What can explain a value in the log twice.
DOUBLED = (("copy-landed", None), ("late-produce", None))

_FACT_TEXT = {
    "stale-end-txn": "a stale EndTxn decided its transaction",
    "late-produce": "a late Produce landed it in a later transaction",
    "copy-landed": "a copy of its Produce landed it again",
    "removed-by-rule": "it was taken out of a Fetch response",
    "cut-off-by-stale-end-txn": "a stale EndTxn ended its transaction on the broker before it arrived, and the"
                                " log gave it another fate than the client's own EndTxn",
    **{d.name: d.text for d in DIAGNOSES},
}
_CLIENT_TEXT = {
    "read-in-aborted-txn": "its consumer kept the position its own aborted transaction had read up to",
    "reassigned": "it was re-assigned in between and resumed at the group's committed offset",
    "not-back-after-abort": "its consumer did not go back to the committed offset after a transaction that had "
                            "read the input aborted, so no committed transaction processed it (KAFKA-17582)",
    "unowned-partitions": "its group has no members: its consumers assign partitions themselves, so two of them "
                          "commit offsets of one partition, and the one behind committed after the one ahead",
}


class Facts:
    """kproxy_spark.wire.facts.value_facts rows by (key, value)."""

    def __init__(self, rows: Iterable[Mapping[str, Any]]) -> None:
        self.by_value: dict[tuple, list[Mapping[str, Any]]] = defaultdict(list)
        for row in rows:
            self.by_value[(row["key"], row["value"])].append(row)

    def find(self, key: Any, value: Any, wanted: tuple) -> dict | None:
        """The cause among the value's facts: a rule's first (it is on the
        causal path), then the broker's own response."""
        rows = self.by_value.get((key, value), ())
        for by_rule in (True, False):
            for fact, fate in wanted:
                for row in rows:
                    if row["fact"] != fact or (fate is not None and row.get("detail") != fate):
                        continue
                    if by_rule and row.get("rule"):
                        return _cause(RULE, fact, row, rule=row["rule"])
                    if not by_rule and not row.get("rule") and fact in BROKER_DIAGNOSES:
                        return _cause(BROKER, fact, row)
        return None


def _cause(by: str, name: str, row: Mapping[str, Any] | None = None, rule: str | None = None,
           text: str | None = None) -> dict:
    at = None
    if row is not None:
        at = {k: row.get(k) for k in ("topic", "partition", "offset", "conn_id", "correlation_id")
              if row.get(k) is not None}
    if text is None:
        text = _FACT_TEXT.get(name, name)
        if at and "conn_id" in at:
            text += f" (conn {at['conn_id']}, correlation id {at.get('correlation_id')}"
            text += f", {at['topic']}[{at['partition']}] offset {at['offset']})" if "topic" in at else ")"
        if row is not None and row.get("evidence"):
            text += f": {row['evidence']}"
        if rule:
            text = f"rule '{rule}': {text}"
        elif by == BROKER:
            text = f"the broker: {text}"
    return {"by": by, "name": name, "rule": rule, "at": at, "text": text}


def label(cause: Mapping[str, Any]) -> str:
    if cause["by"] == RULE:
        return f"rule:{cause['rule']}"
    if cause["by"] == UNEXPLAINED:
        return UNEXPLAINED
    return f"{cause['by']}:{cause['name']}"


def _unexplained(text: str = "no cause found in the trace or the history") -> dict:
    return {"by": UNEXPLAINED, "name": UNEXPLAINED, "rule": None, "at": None, "text": text}


def _client(names: Iterable[str]) -> dict | None:
    for name in names:
        if name in _CLIENT_TEXT:
            return {"by": CLIENT, "name": name, "rule": None, "at": None, "text": f"the client: {_CLIENT_TEXT[name]}"}
    return None


def _of_values(facts: Facts, key: Any, values: Iterable[Any], wanted: tuple) -> dict | None:
    found = [c for c in (facts.find(key, v, wanted) for v in values) if c is not None]
    for by in (RULE, BROKER):
        for cause in found:
            if cause["by"] == by:
                return cause
    return None


def cause_of(name: str, case: Mapping[str, Any], facts: Facts) -> dict | None:
    """The one cause of a case of class `name`, or None for an informational
    case no rule stands behind."""
    if name in DIAGNOSED:
        rules = case.get("rules") or []
        if rules:
            return _cause(RULE, DIAGNOSED[name], rule=rules[0], text=f"rule '{rules[0]}' rewrote the response")
        return _cause(BROKER, DIAGNOSED[name], text=f"the broker: {_FACT_TEXT[DIAGNOSED[name]]}")
    if name in BY_RULES_CHECKS:
        rules = case.get("rules") or []
        # The stale EndTxn a rule delivered decided the records: that rule,
        # before any other rule that merely touched one of the Produces.
        stale = [e["rule"] for e in case.get("stale_end_txns") or [] if e.get("rule")]
        if stale:
            return _cause(RULE, name, rule=stale[0], text=f"rule '{stale[0]}' delivered the stale EndTxn")
        if rules:
            return _cause(RULE, name, rule=rules[0], text=f"rule '{rules[0]}' acted on the requests involved")
        if name in RULE_ONLY:
            return None
        if "listed-as-aborted" in (case.get("causes") or ()):
            # Input a read_committed consumer dropped because the broker listed it as aborted.
            return _cause(BROKER, "stale-aborted-entry", text=f"the broker: {_FACT_TEXT['stale-aborted-entry']}")
        return _client(case.get("causes") or ()) or _unexplained("no rule acted on the requests involved")
    key, value = case.get("key"), case.get("value")
    if name == "G1a":
        return facts.find(key, value, SERVED_WRONGLY) or _unexplained()
    if name in ("lost-write", "unseen"):
        return facts.find(key, value, MISSED) or _unexplained()
    if name in ("poll-skip", "int-poll-skip"):
        skipped = case.get("skipped") or []
        # A skipped value is either a committed one this reader missed, or an
        # aborted one that is in the order only because another read was served it.
        return (_of_values(facts, key, skipped, MISSED + SERVED_WRONGLY)
                or _client(case.get("causes") or ()) or _unexplained())
    if name == "nonmonotonic-poll":
        return _client(case.get("causes") or ()) or _unexplained()
    if name == "duplicate":
        return facts.find(key, value, DOUBLED) or _unexplained()
    if key is not None and value is not None:
        return facts.find(key, value, SERVED_WRONGLY + MISSED + DOUBLED) or _unexplained()
    return _unexplained()


def attribute(cases: Mapping[str, list[dict]], facts: Facts, informational: frozenset[str]) -> dict[str, dict[str, int]]:
    """Give each case its ``cause`` (in place) and return cases per class and
    cause label. Informational classes other than the rule-backed wire
    tables are left alone: they explain, they are not explained."""
    counts: dict[str, dict[str, int]] = {}
    for name, found in cases.items():
        if name in informational and name not in RULE_ONLY:
            continue
        by_label: Counter = Counter()
        for case in found:
            cause = cause_of(name, case, facts)
            if cause is None:
                continue
            case["cause"] = cause
            by_label[label(cause)] += 1
        if by_label:
            counts[name] = dict(sorted(by_label.items(), key=lambda kv: (kv[0] == UNEXPLAINED, -kv[1], kv[0])))
    return counts


# --- per rule: what it caused, and what it did --------------------------------

def _effects(touch: Mapping[str, Any], writes: Mapping[str, Any] | None, caused: Mapping[str, int]) -> list[str]:
    """Short tags for what followed a rule's actions."""
    tags = []
    if caused:
        tags.append("caused-anomalies")
    errors = [c for c in touch.get("error_codes") or [] if c]
    if errors:
        tags.append("client-got-error")
    if writes:
        if errors and writes.get("client_ok") and not writes.get("client_fail"):
            tags.append("client-hid-error")
        if writes.get("landed_more"):
            tags.append("duplicated-in-log")
        elif writes.get("writes") and writes.get("landed_once") == writes.get("writes") and (
                set(touch.get("actions") or ()) & {"duplicate", "drop_response", "disconnect", "hold", "delay"}):
            tags.append("broker-deduplicated")
    if any(a == "rewrite" for a in touch.get("actions") or ()) and not caused:
        tags.append("responses-rewritten")
    return tags or ["no-visible-effect"]


def _effect_text(rule: str, touch: Mapping[str, Any], writes: Mapping[str, Any] | None,
                 caused: Mapping[str, int], tags: list[str]) -> str:
    actions = ", ".join(touch.get("actions") or ["?"])
    apis = ", ".join(touch.get("apis") or ["?"])
    parts = [f"rule '{rule}' ({actions}) acted on {touch.get('events', 0)} {apis} exchange(s)"]
    outcomes = [o for o in touch.get("outcomes") or [] if o]
    if outcomes:
        parts[0] += f" ({', '.join(outcomes)})"
    errors = [c for c in touch.get("error_codes") or [] if c]
    if errors:
        parts.append("clients got " + ", ".join(_error_name(c) for c in errors))
    if writes and writes.get("writes"):
        parts.append(
            f"of the {writes['writes']} write(s) it touched, {writes.get('landed_once', 0)} landed once,"
            f" {writes.get('landed_more', 0)} more than once, {writes.get('never_landed', 0)} never;"
            f" the client reported {writes.get('client_ok', 0)} ok, {writes.get('client_fail', 0)} failed,"
            f" {writes.get('client_info', 0)} unknown")
    if "client-hid-error" in tags:
        parts.append("the client retried past the injected error and reported success")
    if "broker-deduplicated" in tags:
        parts.append("the broker kept one copy of each")
    if caused:
        parts.append("caused " + ", ".join(f"{name} {n}" for name, n in sorted(caused.items())))
    elif "no-visible-effect" in tags:
        parts.append("no anomaly and no client-visible effect followed")
    return "; ".join(parts)


def rule_effects(touches: list[dict], writes: list[dict], cases: Mapping[str, list[dict]]) -> tuple[list[dict], list[dict]]:
    """(``rule-effect`` cases: one per rule that acted, ``fault-impact`` rows).

    fault-impact has a row per rule and class with the cases attributed to
    the rule, and a ``rule-effect`` row for every rule that acted."""
    attributed: dict[str, Counter] = defaultdict(Counter)
    for name, found in cases.items():
        for case in found:
            cause = case.get("cause")
            if cause and cause["by"] == RULE:
                attributed[cause["rule"]][name] += 1
    touched = {t["rule"]: t for t in touches}
    by_rule_writes = {w["rule"]: w for w in writes}
    effects = []
    for rule in sorted(touched):
        touch = touched[rule]
        caused = dict(attributed.get(rule, {}))
        tags = _effects(touch, by_rule_writes.get(rule), caused)
        effects.append({
            "rule": rule, "actions": touch.get("actions"), "apis": touch.get("apis"),
            "events": touch.get("events", 0), "outcomes": touch.get("outcomes"),
            "client_errors": [_error_name(c) for c in touch.get("error_codes") or [] if c],
            "writes": by_rule_writes.get(rule), "caused": caused, "effects": tags,
            "explanation": _effect_text(rule, touch, by_rule_writes.get(rule), caused, tags),
        })
    tags_of = {e["rule"]: e["effects"] for e in effects}
    impact = []
    for rule in sorted(set(attributed) | set(touched)):
        touch = touched.get(rule, {})
        for name, n in sorted(attributed.get(rule, {}).items()):
            impact.append({"rule": rule, "actions": touch.get("actions"), "events": touch.get("events", 0),
                           "anomaly": name, "cases": n})
        if rule in touched:
            impact.append({"rule": rule, "actions": touch.get("actions"), "events": touch.get("events", 0),
                           "anomaly": "rule-effect", "cases": 1, "effects": tags_of[rule]})
    return effects, impact


def by_cause(causes: Mapping[str, Mapping[str, int]], errors: Iterable[str]) -> dict[str, dict[str, int]]:
    """stats.causes turned around for the summary: cause label -> class ->
    cases, error-level classes only, rules first, then the broker, the
    client, unexplained."""
    errors = set(errors)
    out: dict[str, dict[str, int]] = defaultdict(dict)
    for name, labels in causes.items():
        if name not in errors:
            continue
        for cause_label, n in labels.items():
            out[cause_label][name] = n
    order = {RULE: 0, BROKER: 1, CLIENT: 2, UNEXPLAINED: 3}
    return dict(sorted(out.items(), key=lambda kv: (order.get(kv[0].split(":")[0], 4), kv[0])))


def attribute_run(history_cases: Mapping[str, list[dict]], wire_cases: dict[str, list[dict]],
                  informational: frozenset[str]) -> None:
    """Tie every case of one analysis to its cause, in place: pops the wire's
    ``~value-facts``, ``~rule-touches`` and ``~rule-writes`` from
    `wire_cases` and adds ``rule-effect`` and ``fault-impact`` to it."""
    facts = Facts(wire_cases.pop("~value-facts", []))
    touches = wire_cases.pop("~rule-touches", [])
    writes = wire_cases.pop("~rule-writes", [])
    every = {**history_cases, **{k: v for k, v in wire_cases.items() if k != "latency"}}
    attribute(every, facts, informational)
    effects, impact = rule_effects(touches, writes, every)
    wire_cases["rule-effect"] = effects
    wire_cases["fault-impact"] = impact
