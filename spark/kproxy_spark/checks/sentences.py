"""One sentence per history case, rendered on the driver from the case's own fields.

The per-key pass ships its cases as JSON and most checks there leave the
telling to the driver (G1a, lost-write and the poll causes say theirs where
they are found). ``with_sentences`` fills in ``explanation`` for the cases
the report keeps, so the terminal summary and report.html read a sentence
for every class, and report.json keeps the fields beside it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

Case = Mapping[str, Any]


def _text(value: Any) -> str:
    return "?" if value is None else str(value)


def _listed(values: Iterable[Any] | None, more: bool = False) -> str:
    shown = ", ".join(_text(v) for v in values or ())
    return f"{shown}, ..." if more else shown


def _op(index: Any, process: Any = None) -> str:
    return f"op {_text(index)}" + (f" (process {process})" if process is not None else "")


def _outcome(case: Case) -> str:
    kind = case.get("type")
    return {"ok": "committed", "fail": "failed", "info": "of unknown outcome"}.get(kind, _text(kind))


def _skip(case: Case, reads_or_sends: str) -> str:
    values, missing = case.get("values") or [None, None], (case.get("delta") or 1) - 1
    skipped = case.get("skipped") or []
    return (f"{_op(case.get('index'), case.get('process'))}, {_outcome(case)}, {reads_or_sends} key {case.get('key')}"
            f" value {_text(values[0])} then value {_text(values[1])}, skipping {missing} value(s)"
            f" [{_listed(skipped, len(skipped) < missing)}] between them")


def _backwards(case: Case, reads_or_sends: str, within: bool) -> str:
    values, delta = case.get("values") or [None, None], case.get("delta") or 0
    where = "the same position again" if delta == 0 else f"{-delta} position(s) back"
    if within:
        return (f"{_op(case.get('index'), case.get('process'))}, {_outcome(case)}, {reads_or_sends} key"
                f" {case.get('key')} value {_text(values[0])} then value {_text(values[1])}: {where}")
    indexes = case.get("op_indexes") or [case.get("prev_index"), case.get("index")]
    return (f"process {_text(case.get('process'))} {reads_or_sends} key {case.get('key')} value {_text(values[0])}"
            f" ({_op(indexes[0])}), then value {_text(values[1])} ({_op(indexes[-1])}): {where}")


def _cycle(case: Case) -> str:
    """'op 43 (process 2) -ww-> op 49 ...: op 43 wrote key 0 value 28 and op 49 the next, 29; ...'."""
    cycle, processes = case.get("cycle") or [], case.get("processes") or []
    ring = " -> ".join(
        f"{_op(node, processes[i] if i < len(processes) else None)}" for i, node in enumerate(cycle[:-1]))
    steps = []
    for step in case.get("steps") or []:
        a, b, key = step.get("from_index"), step.get("to_index"), step.get("key")
        if step.get("type") == "wr":
            steps.append(f"op {b} read key {key} value {_text(step.get('value'))} that op {a} wrote (wr)")
        else:
            steps.append(f"op {a}'s value {_text(step.get('value'))} of key {key} comes before op {b}'s"
                         f" {_text(step.get('value2'))} in the log (ww)")
    return f"cycle of {case.get('length', len(steps))} ops, {ring} -> {_op(cycle[0]) if cycle else '?'}: " + "; ".join(steps)


def _abort_position(case: Case) -> str:
    told = {"advance": "went on past them, not back to the committed position",
            "rewind": "went back into them", "rewind-further": "went back before them, to values already read"}
    first, last = case.get("aborted_first_value"), case.get("aborted_last_value")
    read = f"values {first}..{last}" if first != last else f"value {first}"
    return (f"process {case.get('process')} read key {case.get('key')} {read} (offsets"
            f" {_text(case.get('aborted_first_offset'))}..{_text(case.get('aborted_last_offset'))}) in a"
            f" transaction that {case.get('error') or 'failed'} (op {case.get('abort_index')}); its next read"
            f" (op {case.get('next_index')}) began at value {_text(case.get('next_first_value'))} (offset"
            f" {_text(case.get('next_first_offset'))}): it {told.get(case.get('position'), case.get('position'))}"
            f" ({case.get('position')})")


#: Classes whose checks write the sentence where they find the case (they know more there).
TOLD_WHERE_FOUND = ("G1a", "lost-write", "poll-skip", "nonmonotonic-poll")

SENTENCES: dict[str, Callable[[Case], str]] = {
    "inconsistent-offsets": lambda c: (
        f"key {c.get('key')} offset {c.get('offset')} holds different values [{_listed(c.get('values'))}]"
        f" according to ops {_listed(c.get('op_indexes'))}"),
    "duplicate": lambda c: (
        f"key {c.get('key')} value {c.get('value')} is in the log {c.get('count')} times, at offsets"
        f" {_listed(c.get('offsets'))}"),
    "unseen": lambda c: (
        f"key {c.get('key')} value {c.get('value')} (offset {_text(c.get('offset'))}), sent by"
        f" {_op(c.get('send_index'), c.get('process'))} and acknowledged, was never read"),
    "nonmonotonic-send": lambda c: _backwards(c, "sent", within=False),
    "int-poll-skip": lambda c: _skip(c, "read"),
    "int-send-skip": lambda c: _skip(c, "sent"),
    "int-nonmonotonic-poll": lambda c: _backwards(c, "read", within=True),
    "int-nonmonotonic-send": lambda c: _backwards(c, "sent", within=True),
    "precommitted-read": lambda c: (
        f"{_op(c.get('index'), c.get('process'))}, {_outcome(c)}, read key {c.get('key')} value {c.get('value')}"
        f" (offset {_text(c.get('offset'))}) that it sent itself, before its own commit"),
    "abort-position": _abort_position,
    "G0": lambda c: "write cycle: " + _cycle(c),
    "G1c": lambda c: "write-read cycle: " + _cycle(c),
    "G0-cycle-exists": lambda c: (
        f"the write dependencies alone hold a cycle among {c.get('edges')} edges that could lie on one;"
        " too many to search for it"),
    "G1c-cycle-exists": lambda c: (
        f"the dependencies hold a cycle through a read among {c.get('edges')} edges that could lie on one;"
        " too many to search for it"),
    "cycle-search-incomplete": lambda c: (
        f"{c.get('edges')} edges could lie on a cycle, more than the search's bound of {c.get('max_edges')}:"
        " G0 and G1c were not ruled out"),
}


def sentence_of(name: str, case: Case) -> str | None:
    """The case's sentence: its own, else the one its class renders; None for a class without one."""
    if case.get("explanation"):
        return case["explanation"]
    say = SENTENCES.get(name)
    return say(case) if say is not None else None


def with_sentences(name: str, cases: list[dict]) -> list[dict]:
    """The cases, each with an ``explanation`` (kept where the check wrote one)."""
    say = SENTENCES.get(name)
    if say is not None:
        for case in cases:
            if not case.get("explanation"):
                case["explanation"] = say(case)
    return cases
