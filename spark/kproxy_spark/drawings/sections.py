"""report.html's section per anomaly class: the first few cases drawn, then
every kept case as a sentence and its cause (their fields stay in
report.json)."""

from __future__ import annotations

import html
from collections.abc import Mapping
from typing import Any

from kproxy_spark.checks.sentences import sentence_of
from kproxy_spark.drawings.anchors import FIRST_DRAWN
from kproxy_spark.drawings.cycle import cycle_svg
from kproxy_spark.drawings.sequence import sequence_svg

CYCLE_CLASSES = ("G0", "G1c")
UNTOLD = "no sentence for this class; its fields are in report.json"


def picture(name: str, index: int, case: Mapping[str, Any]) -> str | None:
    """The case's picture as inline SVG, or None when it gets none."""
    title = f"{name}, case {index + 1}"
    if case.get("wire_story"):
        return sequence_svg(case["wire_story"], title)
    if name in CYCLE_CLASSES and index < FIRST_DRAWN and case.get("steps"):
        return cycle_svg(case, title)
    return None


def drawn_count(name: str, cases: list[Mapping[str, Any]]) -> int:
    """How many of the class's cases get a picture (as `picture` decides, without drawing them)."""
    return sum(1 for i, case in enumerate(cases) if case.get("wire_story")
               or (name in CYCLE_CLASSES and i < FIRST_DRAWN and case.get("steps")))


def _cause(case: Mapping[str, Any]) -> str:
    cause = case.get("cause") or {}
    if cause.get("text"):
        return str(cause["text"])
    return ", ".join(case.get("causes") or ()) if "causes" in case else ""


def section(name: str, cases: list[Mapping[str, Any]], count: int) -> str:
    """One class's section: its heading, its pictures, its cases' sentences."""
    drawn = [(i, svg) for i, case in enumerate(cases) for svg in (picture(name, i, case),) if svg]
    heading = (f"<h2 id='{html.escape(name)}'>{html.escape(name)} ({count} case{'s' if count != 1 else ''};"
               f" first {len(cases)} listed)</h2>")
    parts = [heading]
    if drawn:
        which = ", ".join(str(i + 1) for i, _ in drawn)
        parts.append(f"<p class='drawn'>Drawn: {len(drawn)} of {count} case{'s' if count != 1 else ''}"
                     f" (case{'s' if len(drawn) != 1 else ''} {which}).</p>")
    for i, svg in drawn:
        told = sentence_of(name, cases[i]) or UNTOLD
        cause = _cause(cases[i])
        caption = f"Case {i + 1} of {count}: {told}" + (f" [cause: {cause}]" if cause else "")
        parts.append(f"<figure class='case-picture' id='draw-{html.escape(name)}-{i + 1}'"
                     f" data-case='{html.escape(name)}#{i + 1}'><figcaption>{html.escape(caption)}</figcaption>"
                     f"{svg}</figure>")
    rows = "".join(
        f"<tr><td>{i + 1}</td><td>{html.escape(sentence_of(name, case) or UNTOLD)}</td>"
        f"<td>{html.escape(_cause(case))}</td></tr>"
        for i, case in enumerate(cases))
    parts.append(f"<table class='cases'><thead><tr><th>#</th><th>what happened</th><th>cause</th></tr></thead>"
                 f"<tbody>{rows}</tbody></table>")
    return "".join(parts)
