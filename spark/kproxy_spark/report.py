"""report.json: the verdict, the anomalies with their cases, counts and stats.

`build_report` turns the checks' cases (lists of dicts, collected once) into
one JSON-ready dict; `format_summary` renders it for a terminal. Which
anomalies make a history invalid follows Jepsen's Kafka checker; the rest
are informational (docs/analysis.md lists both).
"""

from __future__ import annotations

import json
import math
import textwrap
from collections.abc import Iterable, Mapping
from typing import Any

from kproxy_spark.checks.sentences import with_sentences
from kproxy_spark.wire.registry import INFORMATIONAL as WIRE_INFORMATIONAL
from kproxy_spark.wire.registry import STATS as WIRE_STATS
from kproxy_spark.wire.registry import TELLING_ORDER as WIRE_TELLING_ORDER

SCHEMA_VERSION = 1
MAX_CASES = 50

# Exit codes of `kproxy analyze` (and spark/jobs.py).
EXIT_VALID = 0
EXIT_INVALID = 1
EXIT_USAGE = 2
EXIT_INTERNAL = 3
EXIT_UNKNOWN = 4

# Reported, never a reason for invalid: causes on the wire (they explain
# the client-visible anomalies: the wire registry's informational checks),
# behaviour Kafka allows, classifications, what each rule did.
INFORMATIONAL = WIRE_INFORMATIONAL | frozenset({
    "abort-position",
    "cycle-search-incomplete",
    "int-send-skip",
    "G0",
    "rule-effect",
})
# Tables that are statistics rather than anomalies: moved into stats.
STATS_TABLES = {**WIRE_STATS, "fault-impact": "fault_impact"}
# The summary's "why" block: the first case of each, told in full; the
# client-visible breakage first, then the wire events that explain it (the
# wire registry's order), then the history's anomalies.
WHY_ORDER = (
    *WIRE_TELLING_ORDER,
    "G1a",
    "lost-write",
    "poll-skip",
    "nonmonotonic-poll",
)
# A case whose `causes` list is empty: the history explains nothing about it.
UNEXPLAINED = "unexplained"


def _plain(value: Any) -> Any:
    """Spark rows and numpy-ish scalars to JSON-ready values."""
    if hasattr(value, "asDict"):
        return {k: _plain(v) for k, v in value.asDict(recursive=True).items()}
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    return str(value)


def describe_jobs(frame: Any, text: str | None) -> None:
    """Label the Spark jobs that follow (Spark UI, event log) with what they
    compute, so a slow check can be told from the others."""
    # A Spark Connect session has no SparkContext (its attribute raises an
    # AttributeError): its jobs go unlabelled.
    context = getattr(getattr(frame, "sparkSession", None), "sparkContext", None)
    if context is not None:
        context.setJobDescription(text)


def collect_cases(cases: Iterable[Any], limit: int = MAX_CASES) -> tuple[list[dict], int]:
    """(first `limit` cases as plain dicts, total count)."""
    rows = list(cases)
    return [_plain(r) for r in rows[:limit]], len(rows)


def cause_counts(cases: Iterable[Mapping[str, Any]]) -> dict[str, int]:
    """Cases per cause over every case (not only the first MAX_CASES), for
    checks whose cases carry a `cause` (kproxy_spark.attribution: one label each), or
    else `causes` (kproxy_spark.checks.causes: a case may count under several, and
    one with none counts as `unexplained`)."""
    from kproxy_spark.attribution import label

    counted: dict[str, int] = {}
    for case in cases:
        if "cause" in case:  # kproxy_spark.attribution's one cause
            name = label(case["cause"])
            counted[name] = counted.get(name, 0) + 1
            continue
        if "causes" not in case:
            return {}
        for cause in case["causes"] or [UNEXPLAINED]:
            counted[cause] = counted.get(cause, 0) + 1
    return dict(sorted(counted.items(), key=lambda kv: (kv[0] == UNEXPLAINED, -kv[1], kv[0])))


def error_names(counts: Mapping[str, int], stats: Mapping[str, Any], allowed: Iterable[str] = ()) -> list[str]:
    """Anomalies present that make the history invalid."""
    tolerated = INFORMATIONAL | set(allowed)
    errors = []
    for name, n in counts.items():
        if n <= 0 or name in tolerated:
            continue
        # An unseen write is only lost once the final reads had their chance.
        if name == "unseen" and not stats.get("final_reads"):
            continue
        errors.append(name)
    return sorted(errors)


def verdict(counts: Mapping[str, int], stats: Mapping[str, Any], allowed: Iterable[str] = ()) -> bool | str:
    """False if any error anomaly is present; "unknown" when something was
    not judged (`unknown_reason` says what); else True."""
    if error_names(counts, stats, allowed):
        return False
    if unknown_reason(counts, stats) is not None:
        return "unknown"
    return True


def unknown_reason(counts: Mapping[str, int], stats: Mapping[str, Any]) -> str | None:
    """Why a history without error anomalies is not VALID either, or None:
    no completed operation; no send and no poll completed (only assign,
    subscribe, create or crash ops: nothing written or read to judge, as in
    Jepsen's empty-history test); writes unseen without final reads; or a
    cycle search that hit its bound."""
    if stats.get("completed_ops", 1) == 0:
        return "no operation completed: nothing could be judged"
    if not _sent_or_polled(stats):
        return ("no send and no poll completed (the history holds only assign, subscribe, create or crash "
                "operations): nothing was written or read, so nothing could be judged")
    if counts.get("unseen", 0) > 0 and not stats.get("final_reads"):
        return (f"{counts['unseen']} acknowledged write(s) were never read, and the history has no final reads "
                "(an assign after the last write, then polls) to tell a lost write from one not read yet")
    # The cycle search gave up: G0/G1c were not ruled out.
    if counts.get("cycle-search-incomplete", 0) > 0:
        return "the cycle search hit its bound: G0 and G1c were not ruled out"
    return None


def _sent_or_polled(stats: Mapping[str, Any]) -> bool:
    """Whether a send or poll micro-op completed; True when the stats cannot tell (no `ops` table)."""
    ops = stats.get("ops")
    if not isinstance(ops, Mapping):
        return True
    if stats.get("sends_acknowledged", 0) or stats.get("sends_unknown", 0) or stats.get("sends_failed", 0):
        return True
    # No send completed, so a completed txn held polls (its micro-ops are never empty).
    return any(n for f in ("poll", "txn") for kind, n in (ops.get(f) or {}).items() if kind != "invoke")


def build_report(
    history_cases: Mapping[str, Any],
    wire_cases: Mapping[str, Any],
    stats: Mapping[str, Any],
    allowed: Iterable[str] = (),
    max_cases: int = MAX_CASES,
) -> dict:
    """The report.json structure.

    history_cases / wire_cases: anomaly name -> cases (list of
    dicts). `allowed`: names tolerated for this run (e.g. poll-skip with
    subscribe; kproxy_spark.checks.allowed_anomalies). stats: plain numbers and
    tables; keys the report reads: final_reads (bool), completed_ops (int).
    """
    anomalies: dict[str, list[dict]] = {}
    counts: dict[str, int] = {}
    causes: dict[str, dict[str, int]] = {}
    out_stats: dict[str, Any] = {k: _plain(v) for k, v in stats.items()}
    for source in (history_cases, wire_cases):
        for name, cases in source.items():
            cases = list(cases)  # read twice below: the first cases, then their causes
            rows, total = collect_cases(cases, max_cases if name not in STATS_TABLES else 10_000)
            if name in STATS_TABLES:
                out_stats[STATS_TABLES[name]] = rows
                continue
            counts[name] = total
            if total:
                anomalies[name] = with_sentences(name, rows)
                by_cause = cause_counts(cases)
                if by_cause:
                    causes[name] = by_cause
    if causes:
        out_stats["causes"] = causes
    allowed = set(allowed)
    errors = error_names(counts, out_stats, allowed)
    present = sorted(name for name, n in counts.items() if n > 0)
    valid = verdict(counts, out_stats, allowed)
    if valid == "unknown":
        out_stats["unknown_reason"] = unknown_reason(counts, out_stats)
    return {
        "schema_version": SCHEMA_VERSION,
        "valid": valid,
        "anomaly_types": present,
        "errors": errors,
        "informational": sorted(set(present) - set(errors)),
        "anomalies": anomalies,
        "counts": counts,
        "stats": out_stats,
    }


def exit_code(report: Mapping[str, Any]) -> int:
    valid = report.get("valid")
    if valid is True:
        return EXIT_VALID
    if valid is False:
        return EXIT_INVALID
    return EXIT_UNKNOWN


def explain(case: Mapping[str, Any], width: int = 110) -> str:
    """One line about a case: its explanation when it has one, else its fields."""
    text = case.get("explanation") or json.dumps(case, separators=(",", ":"), default=str)
    return text if len(text) <= width else text[: width - 3] + "..."


def why(report: Mapping[str, Any], width: int = 100) -> list[str]:
    """The first case of each anomaly in WHY_ORDER that is present, its
    explanation in full, wrapped: what happened, and what caused it."""
    lines: list[str] = []
    for name in WHY_ORDER:
        cases = report.get("anomalies", {}).get(name) or []
        text = cases[0].get("explanation") if cases else None
        if not text:
            continue
        cause = cases[0].get("cause")
        if cause and cause.get("text") and cause["text"] not in text:
            text += f" [cause: {cause['text']}]"
        lines.extend(textwrap.wrap(f"{name}: {text}", width, initial_indent="    ", subsequent_indent="      ",
                                   break_on_hyphens=False, break_long_words=False))
    return ["  why (the first case of each, in full):", *lines] if lines else []


def cause_lines(report: Mapping[str, Any], width: int = 100) -> list[str]:
    """What caused the error-level cases, rules first, then the broker on
    its own, the client, and what nothing explains; then what each rule did."""
    from kproxy_spark.attribution import by_cause

    lines: list[str] = []
    grouped = by_cause(report.get("stats", {}).get("causes", {}), report.get("errors", ()))
    if grouped:
        lines.append("  what caused the errors:")
        for cause_label, classes in grouped.items():
            kind, _, name = cause_label.partition(":")
            who = {"rule": f"rule '{name}'", "broker": f"the broker on its own ({name})",
                   "client": f"the client ({name})"}.get(kind, "nothing found (unexplained)")
            lines.append(f"    {who:<48} " + ", ".join(f"{c} {n}" for c, n in classes.items()))
    effects = report.get("anomalies", {}).get("rule-effect") or []
    if effects:
        lines.append("  what each rule did:")
        for case in effects:
            lines.extend(textwrap.wrap(case["explanation"], width, initial_indent="    ", subsequent_indent="      ",
                                       break_on_hyphens=False, break_long_words=False))
    return lines


def not_judged_lines(derived: Mapping[str, Any], width: int = 100) -> list[str]:
    """What a history derived from the wire could not judge: checks with nothing to look at, grouped by
    why, and writes into topics deleted before anything read them."""
    by_reason: dict[str, list[str]] = {}
    for check, reason in (derived.get("not_applicable") or {}).items():
        by_reason.setdefault(reason, []).append(check)
    said = [f"not applicable: {', '.join(checks)} ({reason})" for reason, checks in by_reason.items()]
    gone = derived.get("deleted_unread")
    if gone:
        said.append(f"not judged: {gone['writes']} write(s) into {len(gone['topics'])} deleted topic(s): {gone['why']}")
    return [line for text in said for line in textwrap.wrap(text, width, initial_indent="  ", subsequent_indent="    ",
                                                            break_on_hyphens=False)]


def format_summary(report: Mapping[str, Any], report_dir: str | None = None, example_width: int = 110) -> str:
    """A short terminal summary: the verdict, each anomaly present with a
    count, one example and its causes, the first case of each explained
    anomaly in full, the operation totals, where the report is."""
    valid = report["valid"]
    errors = set(report.get("errors", ()))
    head = {True: "VALID", False: "INVALID"}.get(valid, "UNKNOWN")
    lines = [f"kproxy analyze: {head}"
             + (f" ({len(errors)} error anomal{'y' if len(errors) == 1 else 'ies'})" if errors else "")]
    stats = report.get("stats", {})
    if valid not in (True, False) and stats.get("unknown_reason"):
        lines.extend(textwrap.wrap(f"why unknown: {stats['unknown_reason']}", 100, initial_indent="  ",
                                   subsequent_indent="    ", break_on_hyphens=False))
    lines.extend(cause_lines(report))
    lines.extend(not_judged_lines(stats.get("derived_history") or {}))
    for name in report.get("anomaly_types", ()):
        kind = "error" if name in errors else "info"
        cases = report["anomalies"].get(name) or [{}]
        lines.append(f"  {name:<24} {report['counts'][name]:>7}  {kind:<5}  {explain(cases[0], example_width)}")
        by_cause = stats.get("causes", {}).get(name)
        if by_cause:
            lines.append(" " * 43 + "causes: " + ", ".join(f"{cause} {n}" for cause, n in by_cause.items()))
    if not report.get("anomaly_types"):
        lines.append("  no anomalies found")
    lines.extend(why(report))
    if "completed_ops" in stats:
        lines.append(
            f"  ops: {stats.get('completed_ops')} completed; sends acknowledged {stats.get('sends_acknowledged', 0)},"
            f" unknown {stats.get('sends_unknown', 0)}, failed {stats.get('sends_failed', 0)};"
            f" final reads: {'yes' if stats.get('final_reads') else 'no'}"
        )
    for row in stats.get("latency", [])[:8]:
        lines.append(f"  latency {row['api']:<16} p50 {row['p50_ms']:.1f} ms  p99 {row['p99_ms']:.1f} ms"
                     f"  ({row['responses']} responses)")
    if report_dir:
        lines.append(f"  report: {report_dir}/report.json, {report_dir}/report.html")
    return "\n".join(lines)


def write_json(report: Mapping[str, Any], path: str) -> None:
    with open(path, "w", encoding="utf-8") as fh:
        json.dump(report, fh, indent=2, sort_keys=False, default=str)
        fh.write("\n")


# --- Report statistics computed in Spark (pure DataFrame -> DataFrame) -------


def history_totals(summary_rows: Iterable[Any]) -> dict:
    """What the analysis needs to know of the history as a whole, from
    kproxy_spark.checks.summary's rows: ops, completed, start (first time),
    subscribe, last_write_invoke (index), outcome_span (first and last time of
    completed send/txn ops, or None)."""
    rows = list(summary_rows)
    writes = [r for r in rows if r["f"] in ("send", "txn")]
    invoked = [r["last_index"] for r in writes if r["type"] == "invoke"]
    done = [r for r in writes if r["type"] in ("ok", "fail", "info")]
    return {
        "ops": sum(r["ops"] for r in rows),
        "completed": sum(r["ops"] for r in rows if r["type"] != "invoke"),
        "start": min((r["first_time"] for r in rows if r["first_time"] is not None), default=None),
        "subscribe": any(r["f"] == "subscribe" for r in rows),
        "last_write_invoke": max(invoked) if invoked else None,
        "outcome_span": (min(r["first_time"] for r in done), max(r["last_time"] for r in done)) if done else None,
    }


def outcome_bucket_ns(span: tuple[int, int] | None, buckets: int = 60) -> int:
    """The txn-outcomes chart's bucket width: the history's span in ``buckets`` steps."""
    if span is None:
        return 1
    return max(-(-(span[1] - span[0] + 1) // buckets), 1)


def history_timeline(ops, totals: Mapping[str, Any], buckets: int = 60):  # noqa: ANN001, ANN201
    """One small frame for two report statistics, so they cost one job:

    * ``outcome`` rows: completed send/txn ops per time bucket and outcome
      (bucket_start_ns, bucket_ns, type, count);
    * ``reader`` rows: per process, its first ok assign after every write
      invocation (assign_index) and its last ok poll (poll_index), which
      decide whether the history ends with final reads.
    """
    from pyspark.sql import functions as F

    span = totals["outcome_span"]
    width = outcome_bucket_ns(span, buckets)
    t0 = span[0] if span else 0
    outcomes = (
        ops.where(F.col("f").isin("send", "txn") & F.col("type").isin("ok", "fail", "info"))
        .withColumn("bucket_start_ns", F.lit(t0) + F.floor((F.col("time") - F.lit(t0)) / F.lit(width)) * F.lit(width))
        .groupBy("bucket_start_ns", "type")
        .agg(F.count(F.lit(1)).alias("count"))
        .select(F.lit("outcome").alias("row"), "bucket_start_ns", F.lit(width).alias("bucket_ns"), "type", "count",
                F.lit(None).cast("long").alias("process"), F.lit(None).cast("long").alias("assign_index"),
                F.lit(None).cast("long").alias("poll_index"))
    )
    last_write = totals["last_write_invoke"]
    after_writes = F.lit(True) if last_write is None else F.col("index") > F.lit(last_write)
    readers = (
        ops.where((F.col("type") == "ok") & F.col("f").isin("assign", "poll"))
        .groupBy("process")
        .agg(
            F.min(F.when((F.col("f") == "assign") & after_writes, F.col("index"))).alias("assign_index"),
            F.max(F.when(F.col("f") == "poll", F.col("index"))).alias("poll_index"),
        )
        .where(F.col("assign_index").isNotNull())
        .select(F.lit("reader").alias("row"), F.lit(None).cast("long").alias("bucket_start_ns"),
                F.lit(None).cast("long").alias("bucket_ns"), F.lit(None).cast("string").alias("type"),
                F.lit(None).cast("long").alias("count"), "process", "assign_index", "poll_index")
    )
    return outcomes.unionByName(readers)


def read_timeline(rows: Iterable[Any]) -> tuple[list[dict], bool]:
    """(txn outcomes over time, whether the history ends with final reads) from history_timeline's rows."""
    outcomes, final_reads = [], False
    for row in rows:
        if row["row"] == "outcome":
            outcomes.append({k: row[k] for k in ("bucket_start_ns", "bucket_ns", "type", "count")})
        elif row["poll_index"] is not None and row["poll_index"] > row["assign_index"]:
            final_reads = True
    outcomes.sort(key=lambda r: (r["bucket_start_ns"], r["type"]))
    return outcomes, final_reads
