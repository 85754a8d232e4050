"""`kproxy bench analysis`: sizes, cached inputs, a stopped run, the table and
the JSON. No analysis runs to the end here (each takes Spark's start and
more); the command's own runs are in docs/performance-analysis.md."""

from __future__ import annotations

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from kproxy.bench.analysis import AnalysisBenchConfig, measure, parse_sizes, prepare_inputs, succeeded
from kproxy.bench.analysis_report import format_table, human_bytes, rate, to_json
from kproxy.bench.tree_run import run_tree
from kproxy.cli import main


def run(**overrides) -> dict:
    base = {
        "ops": 100_000, "traces": True, "history_lines": 200_831, "history_bytes": 32_000_000,
        "trace_events": 249_000, "trace_bytes": 370_000_000, "generated_s": None, "wall_s": 138.25, "cpu_s": 201.5,
        "jit_cpu_s": 60.25, "cpu_parts_s": {"jit": 60.25, "planning": 20.5, "tasks": 70.0, "jvm other": 5.0,
                                           "python": 45.75},
        "ops_per_s": 723.3, "exit_code": 0, "timed_out": False, "valid": True, "errors": [],
        "spark_jobs": 7, "spark_stages": 12, "phases_s": {"history": 10.0}, "analysis_elapsed_s": 130.0,
        "peak_rss_bytes": 3 * (1 << 30) + (1 << 29), "python_peak_rss_bytes": 160 << 20,
        "load_1m_start": 1.25, "load_1m_end": 2.5, "report": "/w/runs/r/report/report.json",
        "log": "/w/runs/r/analyze.log",
    }
    return {**base, **overrides}


def result(*runs: dict) -> dict:
    return {"benchmark": "analysis", "master": "local[*]", "seed": 0, "work_dir": "/w",
            "machine": {"cpus": 2, "memory_bytes": 24 << 30}, "runs": list(runs)}


def test_sizes_take_suffixes_and_refuse_nonsense():
    assert parse_sizes("10,1000,100k,1M,10M") == (10, 1_000, 100_000, 1_000_000, 10_000_000)
    assert parse_sizes("1_000, 1000") == (1000,)  # a repeated size runs once
    for bad in ("0", "x", "1.5M", "-3", ""):
        with pytest.raises(ValueError, match="not a history size"):
            parse_sizes(bad)


def test_table_lines_up_every_run_and_says_what_each_column_is():
    table = format_table(result(
        run(ops=10, traces=False, wall_s=41.0, ops_per_s=0.2439, spark_jobs=None, peak_rss_bytes=1500 << 20,
            jit_cpu_s=None, cpu_parts_s=None),
        run(),
        run(ops=1_000_000, wall_s=3600.0, ops_per_s=277.8, timed_out=True, exit_code=None, valid=None,
            spark_jobs=None, log="/w/runs/big/analyze.log"),
        run(ops=1000, exit_code=1, valid=False, errors=["G1a", "lost-write"]),
        run(ops=2000, exit_code=3, valid=None, spark_jobs=None, log="/w/runs/crash/analyze.log"),
    )).splitlines()
    header, rule, *rows = table[:7]
    assert header.split("  ")[0] == "history ops" and "peak driver RSS" in header
    assert set(rule.replace(" ", "")) == {"-"}
    assert rows[0].split() == ["10", "no", "41.0", "s", "201.5", "s", "n/a", "n/a", "n/a", "n/a", "1.2", "->", "2.5",
                               "0.244", "n/a", "12", "1.5", "GiB", "valid"]
    assert rows[1].split() == ["100,000", "yes", "138.2", "s", "201.5", "s", "60.2", "s", "20.5", "s", "70.0", "s",
                               "45.8", "s", "1.2", "->", "2.5", "723", "7", "12", "3.5", "GiB", "valid"]
    assert rows[2].endswith("timed out") and " n/a " in rows[2]
    assert rows[3].endswith("INVALID: G1a, lost-write")
    assert rows[4].endswith("failed (exit 3)")
    # Columns line up: every row as wide as the header up to the verdict column.
    verdict_at = header.index("verdict")
    assert all(row[verdict_at - 2:verdict_at] == "  " for row in rows)
    text = "\n".join(table)
    assert "master local[*], seed 0, 2 CPUs, 24.0 GiB RAM; 1-min load 1.2-2.5 during the runs" in text
    # Where to look when a run did not finish.
    assert "1,000,000 ops (traces): see /w/runs/big/analyze.log" in text
    assert "2,000 ops (traces): see /w/runs/crash/analyze.log" in text
    assert "1,000 ops (traces): see" not in text


def test_json_keeps_every_measure():
    data = result(run(), run(traces=False, spark_jobs=None))
    back = json.loads(to_json(data))
    assert back == data
    assert back["runs"][1]["spark_jobs"] is None


def test_units():
    assert (human_bytes(0), human_bytes(512), human_bytes(3 << 20), human_bytes(5 << 30)) == \
        ("n/a", "512 B", "3.0 MiB", "5.0 GiB")
    assert (rate(0.2439), rate(24.0), rate(12345.6)) == ("0.244", "24", "12,346")


def test_only_a_valid_finished_run_succeeds():
    assert succeeded(run())
    assert not succeeded(run(exit_code=1, valid=False))
    assert not succeeded(run(exit_code=4, valid="unknown"))
    assert not succeeded(run(exit_code=None, timed_out=True, valid=None))


def test_inputs_are_generated_once_and_again_when_traces_are_missing(tmp_path: Path):
    config = AnalysisBenchConfig(work_dir=tmp_path)
    steps: list[int] = []
    first = prepare_inputs(config, 50, with_traces=False, progress=steps.append)
    assert first.generated_s is not None and first.traces is None and sum(steps) == 50
    again = prepare_inputs(config, 50, with_traces=False)
    assert again.generated_s is None and again.history == first.history
    with_traces = prepare_inputs(config, 50, with_traces=True)
    assert with_traces.generated_s is not None and list(with_traces.traces.glob("*.events"))
    # Traces cached: a history-only run takes the same files without generating.
    assert prepare_inputs(config, 50, with_traces=False).generated_s is None
    # A half-written generation (no marker) is never taken.
    (first.history.parent / "generated.json").unlink()
    assert prepare_inputs(config, 50, with_traces=False).generated_s is not None


def test_an_analysis_past_its_timeout_is_stopped_and_said_so(tmp_path: Path):
    config = AnalysisBenchConfig(work_dir=tmp_path, timeout_s=2)
    inputs = prepare_inputs(config, 10, with_traces=False)
    measured = measure(config, inputs, with_traces=False)
    assert measured["timed_out"] and measured["exit_code"] is None and not succeeded(measured)
    assert 2 <= measured["wall_s"] < 30
    assert measured["valid"] is None and measured["spark_jobs"] is None
    assert Path(measured["log"]).is_file()


# A parent whose child holds 64 MiB (written, so resident) and outlives it unless stopped.
PARENT_OF_A_BIG_CHILD = (
    "import subprocess, sys, time\n"
    "subprocess.Popen([sys.executable, '-c', 'import time; b = b\"x\" * (64 << 20); time.sleep(120)'])\n"
    "time.sleep(120)\n"
)


def test_a_process_tree_is_measured_whole_and_stopped_whole(tmp_path: Path):
    # The benchmark may itself be large (a history generated in memory); a
    # fork copies that, and the kernel's rusage of the child would count it.
    ballast = b"y" * (128 << 20)
    finished = run_tree([sys.executable, "-c", PARENT_OF_A_BIG_CHILD], tmp_path / "log", timeout_s=3,
                        sample_interval_s=0.1)
    assert len(ballast) and finished.exit_code is None and 3 <= finished.wall_s < 15
    assert finished.peak_rss_bytes >= 64 << 20  # the child's memory counts ...
    assert 0 < finished.own_peak_rss_bytes < 64 << 20  # ... which the parent's own peak does not show
    with pytest.raises(ProcessLookupError):
        os.killpg(finished.pid, 0)  # the child went with its parent


def test_a_finished_process_keeps_its_exit_code_and_output(tmp_path: Path):
    finished = run_tree([sys.executable, "-c", "print('done'); raise SystemExit(3)"], tmp_path / "log", timeout_s=60)
    assert finished.exit_code == 3 and finished.wall_s < 60
    assert (tmp_path / "log").read_text() == "done\n"


# A parent that spins for a second of CPU in a child it waits for, then for half a second itself.
PARENT_OF_A_BUSY_CHILD = (
    "import subprocess, sys, time\n"
    "subprocess.run([sys.executable, '-c', 'import time\\nt = time.process_time()\\n"
    "while time.process_time() - t < 1.0: pass'])\n"
    "t = time.process_time()\n"
    "while time.process_time() - t < 0.5: pass\n"
)


def test_the_cpu_time_of_a_process_tree_counts_its_children(tmp_path: Path):
    finished = run_tree([sys.executable, "-c", PARENT_OF_A_BUSY_CHILD], tmp_path / "log", timeout_s=60,
                        sample_interval_s=0.05)
    assert finished.exit_code == 0, (tmp_path / "log").read_text()
    # The child's second and the parent's half, less at most a sampling interval of each.
    assert 1.3 <= finished.cpu_s <= 1.5 + 0.5, finished.cpu_s
    assert finished.jit_cpu_s == 0  # no JVM among them
    assert finished.parts_cpu_s["python"] == finished.cpu_s  # every process of it is not a JVM
    assert sum(finished.parts_cpu_s.values()) == finished.parts_cpu_s["python"]


# A JVM that runs a hot loop for 1.5 s of its CPU on a thread Java names Thread-0, as py4j's threads are
# named: its JIT compiles the loop (and, launched from source, javac), and the loop's CPU is "planning".
HOT_LOOP = """
import java.lang.management.ManagementFactory;
import java.lang.management.ThreadMXBean;

public class Hot {
    static long step(long x) { return (x * 31 + 7) ^ (x >>> 3); }
    public static void main(String[] args) throws InterruptedException {
        long[] s = {0};
        ThreadMXBean threads = ManagementFactory.getThreadMXBean();
        Thread loop = new Thread(() -> {
            // The thread's own CPU, not the clock: a busy machine gives it less of each second.
            while (threads.getCurrentThreadCpuTime() < 1_500_000_000L)
                for (int i = 0; i < 1000; i++) s[0] = step(s[0] + i);
        });
        loop.start();
        loop.join();
        System.out.println(s[0] != 42 ? "done" : "unlikely");
    }
}
"""


def test_the_jit_compiler_threads_of_a_jvm_in_the_tree_are_counted_apart(tmp_path: Path):
    java = shutil.which("java")
    assert java, "java is installed by `make test` (system packages)"
    (tmp_path / "Hot.java").write_text(HOT_LOOP)
    finished = run_tree([java, str(tmp_path / "Hot.java")], tmp_path / "log", timeout_s=60, sample_interval_s=0.05)
    assert finished.exit_code == 0 and (tmp_path / "log").read_text() == "done\n", (tmp_path / "log").read_text()
    assert 0 < finished.jit_cpu_s < finished.cpu_s, (finished.jit_cpu_s, finished.cpu_s)
    parts = finished.parts_cpu_s
    assert parts["jit"] == finished.jit_cpu_s and parts["python"] == 0 and parts["tasks"] == 0, parts
    # The loop's 1.5 s of CPU, less at most a sampling interval.
    assert 1.3 <= parts["planning"] <= 1.7, parts
    assert sum(parts.values()) <= finished.cpu_s + 0.01, (parts, finished.cpu_s)


def test_proxy_benchmark_options_do_not_pass_silently_to_a_subcommand():
    outcome = CliRunner().invoke(main, ["bench", "--rounds", "5", "analysis"])
    assert outcome.exit_code == 2
    assert "options of the proxy benchmark do not apply to `kproxy bench analysis`: --rounds" in outcome.output
    outcome = CliRunner().invoke(main, ["bench", "analysis", "--sizes", "10,lots"])
    assert outcome.exit_code == 2 and "not a history size: 'lots'" in outcome.output
