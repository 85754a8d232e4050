"""report.html: one self-contained page (plots embedded as base64 PNG, the
first cases of each class drawn as inline SVG: kproxy_spark.drawings).

Everything is drawn from the report dict, so the page can be re-rendered
from a saved report.json without Spark. Times on the x axis are seconds
since the history's start; wire times are moved onto that clock with
stats["trace_clock_offset_ns"] (kproxy_spark.wire.stats.clock_offset).
"""

from __future__ import annotations

import base64
import html
import io
import json
from collections.abc import Mapping
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display on servers and in CI
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.ticker import MaxNLocator  # noqa: E402

from kproxy_spark.checks.sentences import sentence_of  # noqa: E402
from kproxy_spark.drawings.sections import UNTOLD, drawn_count, section  # noqa: E402
from kproxy_spark.report import WHY_ORDER  # noqa: E402

NS = 1e9
TIME_FIELDS = ("time", "send_time", "seen_time")  # history clock, ns
WIRE_TIME_FIELDS = ("mono_ns",)  # trace clock, ns
PHASE_COLOURS = ("#f4a261", "#2a9d8f", "#e76f51", "#8ab17d", "#b5838d", "#6d597a")
OUTCOME_COLOURS = {"ok": "#2a9d8f", "fail": "#e76f51", "info": "#e9c46a"}


def _png(fig) -> str:  # noqa: ANN001
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _case_time_ns(case: Mapping[str, Any], offset_ns: int | None) -> int | None:
    for name in TIME_FIELDS:
        if isinstance(case.get(name), (int, float)):
            return int(case[name])
    if offset_ns is not None:
        for name in WIRE_TIME_FIELDS:
            if isinstance(case.get(name), (int, float)):
                return int(case[name]) + offset_ns
    return None


def _shade_phases(ax, phases: list[dict], t0: int) -> None:  # noqa: ANN001
    for i, phase in enumerate(phases):
        start, end = phase.get("start_ns"), phase.get("end_ns")
        if start is None or end is None:
            continue
        label = f"rule {phase.get('rule')} ({', '.join(phase.get('actions') or [])})"
        ax.axvspan((start - t0) / NS, max(end - t0, start - t0 + NS / 100) / NS,
                   color=PHASE_COLOURS[i % len(PHASE_COLOURS)], alpha=0.25, label=label)


def timeline_plot(report: Mapping[str, Any]) -> str | None:
    """Anomaly cases and unseen writes over time, fault phases shaded."""
    stats = report.get("stats", {})
    offset = stats.get("trace_clock_offset_ns")
    t0 = stats.get("history_start_ns") or 0
    points: dict[str, list[float]] = {}
    for name, cases in report.get("anomalies", {}).items():
        times = [t for t in (_case_time_ns(c, offset) for c in cases) if t is not None]
        if times:
            points[name] = [(t - t0) / NS for t in times]
    unseen = stats.get("unseen_over_time") or []
    phases = stats.get("phases") or []
    if not points and not unseen and not phases:
        return None
    fig, (ax_cases, ax_unseen) = plt.subplots(2, 1, figsize=(10, 5.5), sharex=True,
                                              gridspec_kw={"height_ratios": [3, 2]})
    names = sorted(points)
    for row, name in enumerate(names):
        ax_cases.scatter(points[name], [row] * len(points[name]), marker="x", s=40,
                         color="#c1121f" if name in report.get("errors", ()) else "#577590")
    ax_cases.set_yticks(range(len(names)), names)
    ax_cases.set_ylim(-0.8, max(len(names), 1) - 0.2)
    ax_cases.set_title("Anomaly cases over time (first cases of each kind; red: errors)")
    _shade_phases(ax_cases, phases, t0)
    if phases:
        ax_cases.legend(loc="upper right", fontsize=8)
    if unseen:
        ax_unseen.step([(u["time"] - t0) / NS for u in unseen], [u["unseen"] for u in unseen],
                       where="post", color="#264653")
    ax_unseen.set_ylabel("unseen writes")
    ax_unseen.set_xlabel("seconds since the history started")
    _shade_phases(ax_unseen, phases, t0)
    return _png(fig)


def latency_plot(report: Mapping[str, Any]) -> str | None:
    rows = report.get("stats", {}).get("latency") or []
    if not rows:
        return None
    fig, ax = plt.subplots(figsize=(10, 0.5 + 0.45 * len(rows)))
    labels = [r["api"] for r in rows]
    for i, (pct, colour) in enumerate((("p50_ms", "#2a9d8f"), ("p95_ms", "#e9c46a"), ("p99_ms", "#e76f51"))):
        ax.barh([y + (i - 1) * 0.27 for y in range(len(rows))], [r.get(pct) or 0 for r in rows],
                height=0.27, color=colour, label=pct.replace("_ms", ""))
    ax.set_yticks(range(len(rows)), labels)
    ax.invert_yaxis()
    values = [r.get(p) for r in rows for p in ("p50_ms", "p99_ms") if r.get(p)]
    # Injected delays put seconds beside sub-millisecond APIs: a log axis keeps both readable.
    if values and max(values) > 50 * min(values):
        ax.set_xscale("log")
    ax.set_xlabel("latency seen by the client (ms)")
    ax.set_title("Latency per API")
    ax.legend(loc="lower right", fontsize=8)
    return _png(fig)


def outcomes_plot(report: Mapping[str, Any]) -> str | None:
    """Client outcomes over time (stacked) and, from the wire, EndTxn outcomes per broker-side number.

    Each series is one filled step outline, not a bar per bucket: a 20 s demo
    has about 700 buckets and broker-side transactions, and a rectangle each
    made this plot most of report.html's rendering (0.4 s of 0.85 s)."""
    stats = report.get("stats", {})
    buckets = stats.get("txn_outcomes") or []
    wire = stats.get("end_txn_outcomes") or []
    if not buckets and not wire:
        return None
    fig, axes = plt.subplots(1, 2 if wire else 1, figsize=(10, 3.5), squeeze=False)
    ax = axes[0][0]
    t0 = stats.get("history_start_ns") or 0
    if buckets:
        step = buckets[0]["bucket_ns"]
        first = min(b["bucket_start_ns"] for b in buckets)
        count = (max(b["bucket_start_ns"] for b in buckets) - first) // step + 1
        edges = [(first + i * step - t0) / NS for i in range(count + 1)]
        bottom = [0] * count
        for kind in ("ok", "fail", "info"):
            heights = [0] * count
            for b in buckets:
                if b["type"] == kind:
                    heights[(b["bucket_start_ns"] - first) // step] += b["count"]
            if not any(heights):
                continue
            top = [low + h for low, h in zip(bottom, heights)]
            ax.stairs(top, edges, baseline=bottom, fill=True, color=OUTCOME_COLOURS[kind], label=kind)
            bottom = top
        ax.legend(fontsize=8)
    ax.set_title("Client outcomes of send/txn ops")
    ax.set_xlabel("seconds since the history started")
    if wire:
        ax = axes[0][1]
        edges = [x - 0.5 for x in range(len(wire) + 1)]
        commits = [w["commits"] or 0 for w in wire]
        ax.stairs(commits, edges, fill=True, color="#2a9d8f", label="commit")
        ax.stairs([c + (w["aborts"] or 0) for c, w in zip(commits, wire)], edges, baseline=commits, fill=True,
                  color="#e76f51", label="abort")
        stale = [x for x, w in enumerate(wire) if w.get("stale")]
        ax.scatter(stale, [0.5] * len(stale), marker="*", s=120, color="black", label="stale EndTxn", zorder=3)
        ax.set_title("Delivered EndTxn per broker-side txn (wire)")
        ax.set_xlabel("broker-side transactions, in delivery order")
        ax.xaxis.set_major_locator(MaxNLocator(integer=True))
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.legend(fontsize=8)
    return _png(fig)


_CAUSE_COLOURS = {"rule": "#c1121f", "broker": "#457b9d", "client": "#e9c46a", "unexplained": "#999999"}


def causes_plot(report: Mapping[str, Any]) -> str | None:
    """Error-level cases per class, stacked by who caused them: each rule,
    the broker on its own, the client, nothing found."""
    from kproxy_spark.attribution import by_cause

    grouped = by_cause(report.get("stats", {}).get("causes", {}), report.get("errors", ()))
    if not grouped:
        return None
    classes = sorted({c for by in grouped.values() for c in by})
    fig, ax = plt.subplots(figsize=(10, 0.8 + 0.45 * len(classes)))
    left = [0] * len(classes)
    for cause_label, by in grouped.items():
        widths = [by.get(c, 0) for c in classes]
        kind = cause_label.split(":")[0]
        ax.barh(classes, widths, left=left, label=cause_label, color=_CAUSE_COLOURS.get(kind), edgecolor="white",
                alpha=0.9 if kind != "rule" else 1.0)
        left = [a + b for a, b in zip(left, widths)]
    ax.set_xlabel("error-level cases")
    ax.set_title("What caused the errors")
    ax.legend(fontsize=8, loc="lower right")
    return _png(fig)


def _cell(value: Any) -> str:
    """A table cell as text, not JSON: lists joined, [key, value] pairs as Kafka engineers write them."""
    if value is None:
        return ""
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, (list, tuple)) for v in value):
            return " ".join("[" + ",".join(_cell(x) for x in v) + "]" for v in value)
        return ", ".join(_cell(v) for v in value)
    if isinstance(value, Mapping):
        return "; ".join(f"{k} {_cell(v)}" for k, v in value.items())
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _table(rows: list[Mapping[str, Any]], limit: int = 50) -> str:
    if not rows:
        return "<p>none</p>"
    columns: list[str] = []
    for row in rows[:limit]:
        columns += [c for c in row if c not in columns]
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = []
    for row in rows[:limit]:
        cells = [f"<td>{html.escape(_cell(row.get(c)))}</td>" for c in columns]
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><thead><tr>{head}</tr></thead><tbody>{''.join(body)}</tbody></table>"


def _example(name: str, case: Mapping[str, Any], width: int = 160) -> str:
    told = sentence_of(name, case) or UNTOLD
    return told if len(told) <= width else told[: width - 3] + "..."


def _drawn(name: str, cases: list[Mapping[str, Any]], count: int) -> str:
    drawn = drawn_count(name, cases)
    return f"<a href='#{html.escape(name)}'>{drawn} of {count}</a>" if drawn else ""


def _section_order(report: Mapping[str, Any]) -> list[str]:
    """Error classes first, the client-visible breakage before the rest (the summary's order), then the others."""
    present, errors = list(report.get("anomaly_types", ())), set(report.get("errors", ()))
    told = [n for n in WHY_ORDER if n in errors and n in present]
    return told + [n for n in present if n in errors and n not in told] + [n for n in present if n not in errors]


STYLE = """
body{font-family:system-ui,sans-serif;margin:2em;max-width:1200px;color:#222}
h1 .valid{color:#2a9d8f}h1 .invalid{color:#c1121f}h1 .unknown{color:#b08900}
table{border-collapse:collapse;font-size:12px;margin-bottom:1em;display:block;overflow-x:auto}
td,th{border:1px solid #ccc;padding:2px 6px;vertical-align:top;text-align:left}
th{background:#f2f2f2}img{max-width:100%}code{background:#f2f2f2;padding:0 3px}
figure.case-picture{margin:1em 0;overflow-x:auto}figcaption{font-size:13px;margin-bottom:4px}
figure.case-picture svg{max-width:100%;height:auto}
"""


def render_html(report: Mapping[str, Any]) -> str:
    """The whole page as text."""
    valid = report.get("valid")
    verdict = {True: "valid", False: "invalid"}.get(valid, "unknown")
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>kproxy report: {verdict}</title>"
             f"<style>{STYLE}</style></head><body>",
             f"<h1>kproxy analysis: <span class='{verdict}'>{verdict.upper()}</span></h1>"]
    broker = report.get("broker")
    if broker:
        version = broker.get("binary_version") or broker.get("version") or ""
        parts.append(f"<p>Broker: {html.escape(str(broker.get('software')))} {html.escape(str(version))} at"
                     f" <code>{html.escape(str(broker.get('bootstrap')))}</code>, {broker.get('nodes')} node(s),"
                     f" {'started by kproxy' if broker.get('started_by_kproxy') else 'not started by kproxy'}</p>")
    counts = report.get("counts", {})
    errors = set(report.get("errors", ()))
    summary = "".join(
        f"<tr><td><a href='#{html.escape(n)}'>{html.escape(n)}</a></td><td>{counts[n]}</td>"
        f"<td>{'error' if n in errors else 'informational'}</td>"
        f"<td>{html.escape(_example(n, (report['anomalies'].get(n) or [{}])[0]))}</td>"
        f"<td>{_drawn(n, report['anomalies'].get(n) or [], counts[n])}</td></tr>"
        for n in report.get("anomaly_types", ()))
    parts.append("<h2>Anomalies</h2>" + (
        "<table><thead><tr><th>anomaly</th><th>count</th><th>kind</th><th>example</th><th>drawn</th></tr></thead>"
        f"<tbody>{summary}</tbody></table>" if summary else "<p>none</p>"))
    for title, plot in (("What caused the errors", causes_plot(report)), ("Over time", timeline_plot(report)), ("Latency", latency_plot(report)),
                        ("Transaction outcomes", outcomes_plot(report))):
        if plot:
            parts.append(f"<h2>{title}</h2><img alt='{html.escape(title)}' src='data:image/png;base64,{plot}'>")
    stats = report.get("stats", {})
    if stats.get("fault_impact"):
        parts.append("<h2>Fault impact</h2>" + _table(stats["fault_impact"]))
    for name in _section_order(report):
        parts.append(section(name, report["anomalies"].get(name, []), counts[name]))
    plain = {k: v for k, v in stats.items() if not isinstance(v, list)}
    parts.append("<h2>Stats</h2><pre>" + html.escape(json.dumps(plain, indent=2, default=str)) + "</pre>")
    parts.append("</body></html>")
    return "\n".join(parts)


def write_html(report: Mapping[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        fh.write(render_html(report))
