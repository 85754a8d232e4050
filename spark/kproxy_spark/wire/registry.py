"""Every wire check and table, in one list each; every other list of them
is derived from these.

The checks' order is the order the report tells them in (the client-visible
breakage first, then the wire events that explain it, then the broker's
own); a new check is one function and one WireCheck in its family's
CHECKS, and a new broker diagnosis one row of
kproxy_spark.wire.diagnoses.DIAGNOSES (docs/analysis.md, "Adding a wire
check").
"""

from __future__ import annotations

from kproxy_spark.wire import exactly_once, facts, fetch, produce, stats, transactions
from kproxy_spark.wire.check import BY_RULES, INFO, Order, WireCheck, WireTable
from kproxy_spark.wire.diagnoses import DIAGNOSES

WIRE_CHECKS: tuple[WireCheck, ...] = (*transactions.CHECKS, *exactly_once.CHECKS, *produce.CHECKS, *fetch.CHECKS)
WIRE_TABLES: tuple[WireTable, ...] = (facts.TABLE, *stats.TABLES)

BY_NAME: dict[str, WireCheck | WireTable] = {entry.name: entry for entry in (*WIRE_CHECKS, *WIRE_TABLES)}
if len(BY_NAME) != len(WIRE_CHECKS) + len(WIRE_TABLES):
    raise ValueError("two wire checks or tables share a name")

#: How each wire table is ordered in the report: (field, nulls last?) pairs.
#: The tables themselves are unordered: a global sort in Spark samples its
#: input in a job of its own, and the driver orders these few rows anyway.
WIRE_ORDER: dict[str, Order] = {name: entry.order for name, entry in BY_NAME.items()}

#: The order the report tells the wire anomalies in.
TELLING_ORDER: tuple[str, ...] = tuple(check.name for check in WIRE_CHECKS)

#: Wire anomalies that are reported, never a reason for invalid.
INFORMATIONAL: frozenset[str] = frozenset(check.name for check in WIRE_CHECKS if check.severity == INFO)

#: Wire tables the report moves into its stats: table -> report.json stats key.
STATS: dict[str, str] = {table.name: table.stat for table in WIRE_TABLES if table.stat}

#: Checks whose cases are a broker diagnosis unless a rule's rewrite made them: check -> diagnosis.
DIAGNOSED: dict[str, str] = {check.name: check.cause for check in WIRE_CHECKS if check.cause != BY_RULES}

#: Checks whose `rules` are already causal (the stale EndTxn, the late or erroring Produce a rule acted on).
BY_RULES_CHECKS: tuple[str, ...] = tuple(check.name for check in WIRE_CHECKS if check.cause == BY_RULES)

#: Informational checks that get a cause only when a rule stands behind them.
RULE_ONLY: frozenset[str] = frozenset(BY_RULES_CHECKS) & INFORMATIONAL

#: The broker diagnoses' names (the facts and the causes they give).
BROKER_DIAGNOSES: tuple[str, ...] = tuple(d.name for d in DIAGNOSES)

if set(DIAGNOSED.values()) - set(BROKER_DIAGNOSES):
    raise ValueError(f"wire checks name unknown broker diagnoses: {set(DIAGNOSED.values()) - set(BROKER_DIAGNOSES)}")
