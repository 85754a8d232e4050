"""`kproxy bench analysis`: what `kproxy analyze` costs as the history grows.

Each run is `kproxy analyze` started as a subprocess, the way a user runs
it, so the wall time includes starting Python, the Spark JVM and the
session. Inputs are clean synthetic histories (kproxy.workload.synthetic,
docs/performance-analysis.md) with their proxy traces; they are cached in
the work directory, keyed by size, seed and the generator's source, so a
rerun only analyses.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kproxy.bench.tree_run import run_tree

DEFAULT_SIZES = (10, 100_000, 1_000_000)
DEFAULT_TIMEOUT_S = 3600.0
TRACE_MODES = {"both": (False, True), "with": (True,), "without": (False,)}
SUFFIXES = {"k": 1_000, "m": 1_000_000}


def default_work_dir() -> Path:
    """Cached inputs survive between runs: generating 1M operations with
    traces takes a minute or more and 4 GB."""
    cache = os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache"
    return Path(cache) / "kproxy" / "bench-analysis"


def parse_sizes(text: str) -> tuple[int, ...]:
    """"10,100k,1M" -> (10, 100000, 1000000); raises ValueError naming the bad item."""
    sizes = []
    for item in text.split(","):
        item = item.strip().replace("_", "")
        multiplier = SUFFIXES.get(item[-1:].lower(), 1)
        digits = item[:-1] if multiplier > 1 else item
        if not digits.isdigit() or int(digits) * multiplier < 1:
            raise ValueError(f"not a history size: {item!r} (a positive number of operations, e.g. 1000, 100k, 1M)")
        sizes.append(int(digits) * multiplier)
    return tuple(dict.fromkeys(sizes))


@dataclass(frozen=True)
class AnalysisBenchConfig:
    work_dir: Path
    sizes: tuple[int, ...] = DEFAULT_SIZES
    traces: tuple[bool, ...] = (False, True)  # analyse without, with traces
    seed: int = 0
    master: str = "local[*]"
    timeout_s: float = DEFAULT_TIMEOUT_S


@dataclass(frozen=True)
class Inputs:
    """A generated history and, when asked for, its traces."""

    ops: int
    history: Path
    traces: Path | None
    counts: dict[str, int]
    generated_s: float | None  # None: found in the cache


def _generator_fingerprint() -> str:
    """The generator's code: the events (synthetic) and how they are written (synthetic_segments)."""
    from kproxy.workload import synthetic, synthetic_segments

    code = hashlib.sha256()
    for module in (synthetic, synthetic_segments):
        code.update(Path(module.__file__).read_bytes())
    return code.hexdigest()[:16]


def prepare_inputs(config: AnalysisBenchConfig, ops: int, with_traces: bool,
                   progress: Callable[[int], None] | None = None) -> Inputs:
    """The cached history of `ops` operations (and traces if asked), generated
    first when missing, made by another generator or without needed traces."""
    from kproxy.workload.synthetic import generate

    directory = config.work_dir / "inputs" / f"ops-{ops}-seed-{config.seed}"
    marker = directory / "generated.json"
    wanted = {"ops": ops, "seed": config.seed, "generator": _generator_fingerprint()}
    try:
        found = json.loads(marker.read_text())
    except (OSError, ValueError):
        found = {}
    traces_dir = directory / "traces"
    if {k: found.get(k) for k in wanted} == wanted and (found.get("traces") or not with_traces):
        return Inputs(ops, directory / "history.jsonl", traces_dir if found.get("traces") else None,
                      found.get("counts", {}), None)
    # The marker goes first and comes last, so an interrupted generation is never reused.
    marker.unlink(missing_ok=True)
    shutil.rmtree(traces_dir, ignore_errors=True)
    started = time.monotonic()
    counts = generate(ops, directory / "history.jsonl", traces_dir if with_traces else None, config.seed,
                      progress=progress)
    elapsed = time.monotonic() - started
    marker.write_text(json.dumps({**wanted, "traces": with_traces, "counts": counts, "generated_s": elapsed}))
    return Inputs(ops, directory / "history.jsonl", traces_dir if with_traces else None, counts, elapsed)


def analyze_command() -> list[str]:
    """`kproxy` as installed beside this interpreter, else the module."""
    script = Path(sys.executable).with_name("kproxy")
    return [str(script)] if script.exists() else [sys.executable, "-m", "kproxy"]


def _size_bytes(path: Path | None) -> int:
    if path is None:
        return 0
    if path.is_file():
        return path.stat().st_size
    return sum(f.stat().st_size for f in path.iterdir() if f.is_file())


def measure(config: AnalysisBenchConfig, inputs: Inputs, with_traces: bool) -> dict[str, Any]:
    """Run `kproxy analyze` on the inputs once; what it cost and what it said."""
    if with_traces and inputs.traces is None:
        raise ValueError(f"{inputs.history} was generated without traces")
    run_dir = config.work_dir / "runs" / f"ops-{inputs.ops}-seed-{config.seed}-{'traces' if with_traces else 'history'}"
    shutil.rmtree(run_dir, ignore_errors=True)
    run_dir.mkdir(parents=True)
    report_dir = run_dir / "report"
    command = [*analyze_command(), "analyze", "--history", str(inputs.history), "--out", str(report_dir),
               "--master", config.master]
    if with_traces:
        command += ["--traces", str(inputs.traces)]
    load_start = os.getloadavg()[0]
    finished = run_tree(command, run_dir / "analyze.log", config.timeout_s)
    report = _read_report(report_dir / "report.json")
    stats = report.get("stats", {}) if report else {}
    return {
        "ops": inputs.ops,
        "traces": with_traces,
        "history_lines": inputs.counts.get("history_lines"),
        "history_bytes": _size_bytes(inputs.history),
        "trace_events": inputs.counts.get("trace_events") if with_traces else 0,
        "trace_bytes": _size_bytes(inputs.traces) if with_traces else 0,
        "generated_s": inputs.generated_s,
        "wall_s": round(finished.wall_s, 3),
        "ops_per_s": round(inputs.ops / finished.wall_s, 3),
        "cpu_s": finished.cpu_s,
        "jit_cpu_s": finished.jit_cpu_s,
        "cpu_parts_s": finished.parts_cpu_s,
        "exit_code": finished.exit_code,
        "timed_out": finished.exit_code is None,
        "valid": report.get("valid") if report else None,
        "errors": report.get("errors") if report else None,
        "spark_jobs": stats.get("spark_jobs"),
        "spark_stages": stats.get("spark_stages"),
        "phases_s": stats.get("phases_s"),
        "analysis_elapsed_s": stats.get("elapsed_s"),
        "peak_rss_bytes": finished.peak_rss_bytes,
        "python_peak_rss_bytes": finished.own_peak_rss_bytes,
        "load_1m_start": load_start,
        "load_1m_end": os.getloadavg()[0],
        "report": str(report_dir / "report.json"),
        "log": str(run_dir / "analyze.log"),
    }


def _read_report(path: Path) -> dict | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None  # the analysis failed before writing it; the log says why


def machine() -> dict[str, Any]:
    memory = 0
    try:
        with open("/proc/meminfo") as meminfo:
            memory = int(meminfo.readline().split()[1]) * 1024  # MemTotal
    except (OSError, ValueError, IndexError):
        pass
    return {"cpus": os.cpu_count(), "memory_bytes": memory}


def succeeded(run: dict[str, Any]) -> bool:
    """The analysis finished and called the clean history valid (anything
    else on a synthetic history is a failure or a false positive)."""
    return run["exit_code"] == 0 and run["valid"] is True
