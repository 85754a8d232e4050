"""Which cases get a wire sequence diagram, and what each picture is anchored on.

Pure Python over the report's cases: a case is drawn from its records
(``[key, value]`` pairs, which the Produce attempts carry as numbers) and
from the exchanges it names (EndTxns, or the Fetch a broker diagnosis points
at), so the same query serves every drawn class.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

#: How many cases of each class are drawn.
FIRST_DRAWN = 3

#: Classes drawn whatever their cause (the wire is their story), and classes
#: drawn when a rule or the broker caused them (a client's own doing has no
#: wire to show).
ALWAYS = ("torn-transaction", "client-outcome-mismatch")
WHEN_CAUSED = ("lost-write", "G1a")
DRAWN_CLASSES = (*ALWAYS, *WHEN_CAUSED)
WIRE_CAUSES = ("rule", "broker")


@dataclass(frozen=True)
class Exchange:
    conn_id: int
    correlation_id: int
    copy: int | None = None  # None: any copy


@dataclass(frozen=True)
class Anchor:
    """What one drawn case's picture starts from."""

    case_id: str
    records: tuple[tuple[int, int], ...]
    exchanges: tuple[Exchange, ...] = ()
    #: (topic, partition) of the Fetch a broker diagnosis names, with its exchange.
    fetch_partition: tuple[str, int] | None = None


def _pairs(case: Mapping[str, Any], *fields: str) -> tuple[tuple[int, int], ...]:
    found = []
    for name in fields:
        for pair in case.get(name) or ():
            if isinstance(pair, (list, tuple)) and len(pair) == 2 and None not in pair:
                found.append((int(pair[0]), int(pair[1])))
    return tuple(dict.fromkeys(found))


def _end_exchanges(case: Mapping[str, Any]) -> tuple[Exchange, ...]:
    ends = [*(case.get("stale_end_txns") or ()), *(case.get("end_txns") or ())]
    return tuple(dict.fromkeys(
        Exchange(e["conn_id"], e["correlation_id"], e.get("copy")) for e in ends
        if e.get("conn_id") is not None and e.get("correlation_id") is not None))


def anchor_of(name: str, index: int, case: Mapping[str, Any]) -> Anchor | None:
    """The anchor of a case of a drawn class, or None when its picture would show nothing of the wire."""
    case_id = f"{name}#{index}"
    cause = case.get("cause") or {}
    if name in ALWAYS:
        records = _pairs(case, "committed", "aborted", "unknown")
        return Anchor(case_id, records, _end_exchanges(case)) if records else None
    if name not in WHEN_CAUSED or cause.get("by") not in WIRE_CAUSES:
        return None
    if case.get("key") is None or case.get("value") is None:
        return None
    at = cause.get("at") or {}
    exchanges, fetch_partition = (), None
    if at.get("conn_id") is not None and at.get("correlation_id") is not None:
        exchanges = (Exchange(at["conn_id"], at["correlation_id"]),)
        if at.get("topic") is not None and at.get("partition") is not None:
            fetch_partition = (at["topic"], at["partition"])
    return Anchor(case_id, ((int(case["key"]), int(case["value"])),), exchanges, fetch_partition)


def drawn_anchors(anomalies: Mapping[str, list[dict]], first: int = FIRST_DRAWN) -> list[Anchor]:
    """The anchors of the first `first` drawable cases of each drawn class, in report order."""
    anchors = []
    for name in DRAWN_CLASSES:
        taken = 0
        for index, case in enumerate(anomalies.get(name) or ()):
            if taken == first:
                break
            anchor = anchor_of(name, index, case)
            if anchor is not None:
                anchors.append(anchor)
                taken += 1
    return anchors
