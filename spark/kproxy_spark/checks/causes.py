"""Why a process's reads of a key skipped or went back: the causes the history establishes.

A `poll-skip` or `nonmonotonic-poll` case stays what Jepsen calls it; this
pass only adds what explains it, so a reader can tell the client's or the
broker's known behaviour from a skip nothing accounts for:

* ``read-in-aborted-txn`` (skips): every skipped position was read by the
  process's own transactions that aborted (``fail`` txns) between the two
  reads. Its consumer kept the position those reads left it at instead of
  going back to the committed offset (KAFKA-17582; ``abort-position`` calls
  it ``advance``), so no committed transaction of the process read them.
* ``aborted-writes`` (skips): every skipped position holds a value whose send
  definitely failed. A read_committed consumer must never return it; it is in
  the version order only because some read returned it (``G1a``).
* ``reassigned`` (both): an ``ok``/``info`` assign or subscribe that kept the
  key lies between the two reads. A (re)assigned consumer resumes at the
  group's committed offset, which is not necessarily where the process left
  off (other members commit to the same group; a broker may not have stored
  or published the process's own commit).

Several may hold for one case; ``causes`` lists each that does, in the order
above, and is empty when the history explains nothing.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict

from kproxy_spark.checks.keyview import Event, KeyView

CAUSES = ("read-in-aborted-txn", "aborted-writes", "reassigned")


def _ops(indexes: list[int]) -> str:
    return ", ".join(str(i) for i in indexes)


def _phrase(case: dict) -> str:
    found = []
    if "read-in-aborted-txn" in case["causes"]:
        txns = case["aborted_txns"]
        lead = "its own aborted txns (ops " if len(txns) > 1 else "its own aborted txn (op "
        found.append(f"{lead}{_ops(txns)}) had read them, and its consumer did not go back after the abort")
    if "aborted-writes" in case["causes"]:
        found.append("every skipped value was written by a send that definitely failed or aborted,"
                     " which a consumer must not return")
    if "reassigned" in case["causes"]:
        changes = case["reassigns"]
        lead = "it was re-assigned in between (ops " if len(changes) > 1 else "it was re-assigned in between (op "
        found.append(f"{lead}{_ops(changes)}) and resumed at the group's committed offset")
    return "; cause: " + "; ".join(found) if found else "; no cause found in the history"


def _text(value: object) -> str:
    return "null" if value is None else str(value)


def _by_process(events: list[Event]) -> dict[int, tuple[list[int], list[Event]]]:
    """process -> (op indexes, events), both ordered by index, for range look-ups."""
    grouped: dict[int, list[Event]] = defaultdict(list)
    for e in events:  # ordered by index
        grouped[e.process].append(e)
    return {p: ([e.index for e in rows], rows) for p, rows in grouped.items()}


def _between(index: dict[int, tuple[list[int], list[Event]]], process: int, low: int, high: int) -> list[Event]:
    """The process's events with low < index < high."""
    indexes, rows = index.get(process, ([], []))
    return rows[bisect_right(indexes, low):bisect_left(indexes, high)]


def with_causes(view: KeyView, cases: list[dict], skip: bool) -> list[dict]:
    """Add reassigns, aborted_txns, causes and an explanation to poll-skip
    (skip=True) or nonmonotonic-poll (skip=False) cases (as built by
    kproxy_spark.checks.contiguity from poll_pairs)."""
    aborted_reads = _by_process([e for e in view.polled if e.f == "txn" and e.type == "fail"])
    kept = _by_process(view.kept)
    for case in cases:
        process, low, high = case["process"], case["prev_index"], case["index"]
        reassigns = sorted({e.index for e in _between(kept, process, low, high)})
        inside = _between(aborted_reads, process, low, high)
        case["reassigns"] = reassigns
        case["aborted_txns"] = sorted({e.index for e in inside})
        causes = []
        values = case["values"]
        reads = (f"process {process} read key {view.key} up to value {_text(values[0])} (op {low}),"
                 f" then from value {_text(values[1])} (op {high})")
        if skip:
            missing = case["delta"] - 1
            start, end = case["prev_vo_index"], case["vo_index"]
            covered = {p for p in (view.position_of(e.value) for e in inside) if p is not None and start < p < end}
            if len(covered) == missing:
                causes.append("read-in-aborted-txn")
            if view.failed_between(start, end) == missing:
                causes.append("aborted-writes")
            shown = case.get("skipped") or []
            more = ", ..." if len(shown) < missing else ""
            lead = f"{reads}, skipping {missing} value(s) [{_ops(shown)}{more}]"
        else:
            delta = case["delta"]
            lead = f"{reads}, " + ("the same position again" if delta == 0 else f"{-delta} position(s) back")
        if reassigns:
            causes.append("reassigned")
        case["causes"] = causes
        case["explanation"] = lead + _phrase(case)
    return cases
