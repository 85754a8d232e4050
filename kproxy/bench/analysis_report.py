"""The table `kproxy bench analysis` prints, and the JSON it writes."""

from __future__ import annotations

import json
from typing import Any

NOT_REPORTED = "n/a"

COLUMNS = (
    ("history ops", ">"),
    ("traces", "<"),
    ("wall time", ">"),
    ("CPU time", ">"),
    ("of it JIT", ">"),
    ("planning", ">"),
    ("tasks", ">"),
    ("Python", ">"),
    ("1-min load", ">"),
    ("ops/s", ">"),
    ("Spark jobs", ">"),
    ("stages", ">"),
    ("peak driver RSS", ">"),
    ("verdict", "<"),
)

NOTES = (
    "wall time: `kproxy analyze` as a subprocess, from its start (Spark's included) to its exit",
    "CPU time: user + system of `kproxy analyze` and every process it started (the Spark JVM, its Python "
    "workers), sampled every 0.2 s; against the wall time it says how much of the machine the run had",
    "of it JIT: the CPU time of the Spark JVM's JIT compiler threads (C1, C2), sampled alike: a new JVM "
    "compiles the generated code of every stage it runs",
    "planning: the CPU of the Spark JVM's threads that serve the driver's calls (py4j names them Thread-N, as "
    "Java names any unnamed thread): building the analysis's DataFrames and planning its jobs",
    "tasks: the CPU of the JVM's executor task threads, the rows' work on the JVM's side",
    "Python: the CPU of every process but the JVM: the driver, PySpark's Python workers (the grouped passes, "
    "the trace's decoding) and the history's line check; the JVM's other threads (start-up, the collector, "
    "Spark's scheduler) make up the rest of the CPU time",
    "1-min load: the machine's load average when the run started -> when it ended",
    "ops/s: the history's completed operations / wall time",
    "Spark jobs, stages: stats.spark_jobs and stats.spark_stages of the report (n/a: the analysis did not "
    "report it)",
    "peak driver RSS: kproxy analyze and the Spark JVM it starts (in local mode the executors too), "
    "sampled every 0.2 s",
)


def human_bytes(n: int | None) -> str:
    if not n:
        return NOT_REPORTED
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def rate(per_s: float) -> str:
    # Small histories run at a fraction of an operation a second: keep digits there.
    return f"{per_s:,.0f}" if per_s >= 100 else f"{per_s:.3g}"


def verdict(run: dict[str, Any]) -> str:
    """What the analysis said, or how it failed to say it."""
    if run["timed_out"]:
        return "timed out"
    if run["exit_code"] not in (0, 1, 4):
        return f"failed (exit {run['exit_code']})"
    if run["valid"] is True:
        return "valid"
    if run["valid"] is False:
        # A clean synthetic history: any error is a false positive to chase.
        return "INVALID: " + ", ".join(run["errors"] or [])
    return str(run["valid"])


def row(run: dict[str, Any]) -> tuple[str, ...]:
    jobs = run.get("spark_jobs")
    return (
        f"{run['ops']:,}",
        "yes" if run["traces"] else "no",
        f"{run['wall_s']:.1f} s",
        NOT_REPORTED if run.get("cpu_s") is None else f"{run['cpu_s']:.1f} s",
        NOT_REPORTED if run.get("jit_cpu_s") is None else f"{run['jit_cpu_s']:.1f} s",
        *_parts(run.get("cpu_parts_s")),
        f"{run['load_1m_start']:.1f} -> {run['load_1m_end']:.1f}",
        rate(run["ops_per_s"]),
        NOT_REPORTED if jobs is None else str(jobs),
        NOT_REPORTED if run.get("spark_stages") is None else str(run["spark_stages"]),
        human_bytes(run["peak_rss_bytes"]),
        verdict(run),
    )


def _parts(parts: dict[str, float] | None) -> tuple[str, ...]:
    """The planning, tasks and Python cells (n/a for a run recorded before the bench split its CPU)."""
    return tuple(NOT_REPORTED if not parts or parts.get(part) is None else f"{parts[part]:.1f} s"
                 for part in ("planning", "tasks", "python"))


def format_table(result: dict[str, Any]) -> str:
    rows = [tuple(name for name, _ in COLUMNS)] + [row(run) for run in result["runs"]]
    widths = [max(len(r[i]) for r in rows) for i in range(len(COLUMNS))]
    lines = []
    for n, r in enumerate(rows):
        cells = [f"{cell:{align}{width}}" for cell, (_, align), width in zip(r, COLUMNS, widths)]
        lines.append("  ".join(cells).rstrip())
        if n == 0:
            lines.append("  ".join("-" * w for w in widths))
    lines.append("")
    lines.extend(NOTES)
    lines.append(f"master {result['master']}, seed {result['seed']}, {result['machine']['cpus']} CPUs, "
                 f"{human_bytes(result['machine']['memory_bytes'])} RAM; "
                 f"1-min load {_load_range(result['runs'])} during the runs")
    lines.append(f"inputs and reports: {result['work_dir']}")
    for run in result["runs"]:
        if run["timed_out"] or run["exit_code"] not in (0, 1, 4):
            lines.append(f"{run['ops']:,} ops ({'traces' if run['traces'] else 'history only'}): see {run['log']}")
    return "\n".join(lines)


def _load_range(runs: list[dict[str, Any]]) -> str:
    loads = [run[k] for run in runs for k in ("load_1m_start", "load_1m_end")]
    return f"{min(loads):.1f}-{max(loads):.1f}" if loads else NOT_REPORTED


def to_json(result: dict[str, Any]) -> str:
    return json.dumps(result, indent=2) + "\n"
