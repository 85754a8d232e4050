"""`kproxy analyze --master spark://...` against a real standalone Spark
master and worker, run as a user runs it (the installed command, from a
directory of its own, with relative paths, on a segment trace as the proxy
writes it), reports what the local analysis reports; a cluster whose
executors' Python cannot run the analysis is refused before any input is
read, with the setting that fixes it.

The executors run a Python of their own that has PySpark and the modules the
checks import there, but not kproxy (`executor_python`), as a cluster's
machines would, and the daemons run without the suite's PYTHONPATH: only the
code the analysis ships itself (kproxy_spark.cluster) lets them run it.
A cluster runs the same plan with other partitioning, executors in other
processes and adaptive execution on: a check that depends on partition
order, a module missing from the shipped zip or a function the executors
cannot import shows up here and nowhere else.

spark-submit, the second path docs/analysis.md gives, runs the same
`kproxy_spark.jobs.analyze`; here it is checked that spark-submit takes the
documented command (entry script, the zip `python -m kproxy_spark.cluster`
prints) without a second analysis on the cluster.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kproxy_spark.class_archive import archive_dir
from kproxy_spark.cluster import EXECUTOR_MODULES
from tests.fixtures.spark_cluster import StandaloneCluster, cluster_env, spark_home, stop_group
from tests.test_install import _closure, _entries, _site_packages, _view
from tests.test_wire_scenarios import Scenario, torn_scenario

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent
ANALYZE_TIMEOUT_S = 240
REFUSAL_TIMEOUT_S = 120
# Measures of how the run went, not of what it found: they differ between
# any two runs, so the comparison leaves them out.
RUN_STATS = ("elapsed_s", "phases_s", "spark_jobs", "spark_stages")


def anomalous_scenario() -> Scenario:
    """The torn-transaction scenario (wire anomalies and G1a: the aborted
    records a read_committed poll returned) plus, on a key of its own, a
    lost write: value 0 acknowledged at offset 0, never read, although a
    poll read value 1 at offset 1."""
    s = torn_scenario()
    s.op(0, "ok", "create", [12, "v", 0])
    s.op(2, "invoke", "send", [["send", 12, 0]])
    s.op(2, "ok", "send", [["send", 12, [0, 0]]])
    s.op(2, "invoke", "send", [["send", 12, 1]])
    s.op(2, "ok", "send", [["send", 12, [1, 1]]])
    s.op(3, "invoke", "poll", [["poll"]])
    s.op(3, "ok", "poll", [["poll", {"12": [[1, 1]]}]])
    return s


def as_segments(traces: Path) -> None:
    """The scenario's trace as the proxy writes it: a segment file, which the
    executors read and decode themselves (kproxy.obs on the executors)."""
    from kproxy.obs.trace_segments import COLUMNS, encode_segment, file_header

    [jsonl] = traces.glob("*.jsonl")
    events = [json.loads(line) for line in jsonl.read_text().splitlines()]
    with open(traces / "trace-scenario-20260101T000000-000000.events", "wb") as f:
        f.write(file_header())
        f.write(encode_segment([[event.get(name) for name, _ in COLUMNS] for event in events]))
    jsonl.unlink()


def _python_with(folder: Path, modules: list[str]) -> Path:
    """A fresh venv's Python that imports `modules` (the installed
    distributions, with what they require) and nothing else of this run."""
    folder.mkdir(exist_ok=True)
    deps = _view(folder / "deps", _entries(_closure(modules)))
    venv = folder / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    (_site_packages(venv) / "executor-deps.pth").write_text(f"{deps}\n")
    return venv / "bin" / "python"


def _imports(python: Path, module: str) -> bool:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    return subprocess.run([str(python), "-c", f"import {module}"], env=env, capture_output=True,
                          timeout=60).returncode == 0


@pytest.fixture(scope="module")
def executor_python(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The workers' Python: what docs/analysis.md tells users to install there, and no kproxy."""
    python = _python_with(tmp_path_factory.mktemp("executor-python"), list(EXECUTOR_MODULES))
    assert _imports(python, "pyarrow") and not _imports(python, "kproxy_spark"), "the premise of this file"
    return python


def analyze_command(cluster: StandaloneCluster, python: Path, *args: str) -> list[str]:
    """`kproxy analyze` on the cluster, as docs/analysis.md gives it, with
    executor memory sized for the one-core, 1 GiB worker."""
    kproxy = shutil.which("kproxy", path=f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}")
    assert kproxy is not None, "the kproxy command is not installed in this venv"
    return [kproxy, "analyze", "--master", cluster.master_url,
            "--conf", f"spark.pyspark.python={python}", "--conf", "spark.executor.memory=512m", *args]


def analyze_env(cache: Path) -> dict[str, str]:
    """A user's environment: no PYSPARK_PYTHON (the command's --conf names the
    executors' Python), a cache of its own; PYTHONPATH only as the suite sets
    it for every process it starts (scripts/run-tests.sh: this tree is the
    installed kproxy)."""
    env = {k: v for k, v in cluster_env().items() if k not in ("PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")}
    if "PYTHONPATH" in os.environ:
        env["PYTHONPATH"] = os.environ["PYTHONPATH"]
    env["XDG_CACHE_HOME"] = str(cache)
    # Spark's class archive stays the machine's (`make test` wrote it): in a cache of its own, each run would
    # write one, half a minute of CPU the suite needs (tests/test_class_archive.py covers the writing).
    env["KPROXY_CLASS_ARCHIVE_DIR"] = str(archive_dir())
    return env


def comparable(report: dict) -> dict:
    """The report without the run's own measures, with each anomaly's cases
    in one order: Spark promises no order for rows it collects, and a
    cluster partitions differently from local mode."""
    def canonical(rows: list) -> list:
        return sorted(rows, key=lambda row: json.dumps(row, sort_keys=True))

    stats = {name: value for name, value in report["stats"].items() if name not in RUN_STATS}
    # Statistics tables (latency, fault impact, EndTxn outcomes) are sets of rows too.
    stats = {name: canonical(value) if isinstance(value, list) and all(isinstance(v, dict) for v in value) else value
             for name, value in stats.items()}
    return {**report, "stats": stats,
            "anomalies": {name: canonical(cases) for name, cases in report["anomalies"].items()}}


@pytest.mark.timeout(REFUSAL_TIMEOUT_S + 30)
def test_executors_without_pyarrow_and_pandas_are_refused_with_the_setting_to_fix(spark_standalone, tmp_path):
    lacking = [m for m in EXECUTOR_MODULES if m not in ("pyarrow", "pandas")]
    python = _python_with(tmp_path / "python", lacking)
    history, traces = torn_scenario().write(tmp_path)
    done = subprocess.run(analyze_command(spark_standalone, python, "--history", str(history),
                                          "--traces", str(traces), "--out", str(tmp_path / "report")),
                          cwd=tmp_path, env=analyze_env(tmp_path / "cache"), capture_output=True, text=True,
                          timeout=REFUSAL_TIMEOUT_S)
    said = done.stderr
    assert done.returncode == 2, f"{said[-5000:]}\n{spark_standalone.logs()}"
    assert f"checking the executors' Python ({python})" in said
    [error] = [line for line in said.splitlines() if line.startswith("error: ")]
    assert f"the executors' Python ({python}, " in error and "cannot import pyarrow, pandas" in error
    assert "spark.pyspark.python" in error and "PYSPARK_PYTHON" in error and "pip install 'pyarrow==" in error
    assert f"checking {history}" not in said and "history stats done" not in said, "input was read"
    assert "Traceback" not in said and "\tat org.apache" not in said and "Py4J" not in said


@pytest.mark.timeout(ANALYZE_TIMEOUT_S + 60)
def test_kproxy_analyze_on_a_standalone_cluster_reports_what_local_mode_reports(spark_standalone, executor_python,
                                                                               spark, tmp_path):
    from kproxy_spark.jobs import analyze

    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "run").mkdir(parents=True)
    history, traces = anomalous_scenario().write(elsewhere / "run")
    as_segments(traces)
    cache = tmp_path / "cache"
    command = analyze_command(spark_standalone, executor_python,
                              "--history", "run/history.jsonl", "--traces", "run/traces", "--out", "run/report")
    with open(tmp_path / "analyze.out", "wb") as out, open(tmp_path / "analyze.err", "wb") as err:
        # The cluster run and the local run overlap: each waits on its JVM
        # and planner much of the time, so together they take less wall time.
        clustered = subprocess.Popen(command, stdout=out, stderr=err, env=analyze_env(cache), cwd=elsewhere,
                                     start_new_session=True)
        try:
            local = analyze(history, traces, tmp_path / "local", master="local[2]", spark=spark)
            returncode = clustered.wait(timeout=ANALYZE_TIMEOUT_S)
        finally:
            stop_group(clustered)
    said = (tmp_path / "analyze.err").read_text(errors="replace")

    # Exit code 1 is "invalid": it ran to the end and found errors.
    assert returncode == 1, f"kproxy analyze exited {returncode}\n{said[-5000:]}\n{spark_standalone.logs()}"
    apps = [app["name"] for app in spark_standalone.state()["completedapps"]]
    assert "kproxy-analyze" in apps, "the analysis did not run on the standalone master"
    # The code went out as the zip built in the user's cache, and the executors ran it from there.
    [shipped] = (cache / "kproxy" / "analysis").glob("kproxy-analysis-*.zip")
    assert "shipping kproxy " in said and str(shipped) in said
    assert "kproxy_spark from " in said and f"{shipped.name}/kproxy_spark/__init__.py" in said
    assert "kproxy analyze: INVALID" in (tmp_path / "analyze.out").read_text()
    # --out is relative to where the command ran.
    report = elsewhere / "run" / "report"
    assert (report / "report.html").is_file()
    from_cluster = json.loads((report / "report.json").read_text())

    # The scenario's anomalies were found at all, so agreeing means something.
    assert local["valid"] is False
    for name in ("G1a", "lost-write", "torn-transaction", "broker-aborted-read"):
        assert local["counts"][name] >= 1, name
    assert comparable(from_cluster) == comparable(local)


def submit_command(master: str, py_files: Path, *args: str) -> list[str]:
    """docs/analysis.md's spark-submit command."""
    return [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", master,
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.sql.shuffle.partitions=4",
        "--py-files", str(py_files),
        str(ROOT / "spark" / "jobs.py"), *args,
    ]


def test_spark_submit_takes_the_documented_command(spark_standalone, tmp_path):
    made = subprocess.run([sys.executable, "-m", "kproxy_spark.cluster", "--cache-dir", str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=60, check=True)
    py_files = Path(made.stdout.strip())
    assert py_files.parent == tmp_path / "cache" and py_files.suffix == ".zip"
    # The job's usage, printed by spark-submit's Python driver from the entry
    # script: spark-submit took the options, found the script and ran it.
    done = subprocess.run(submit_command(spark_standalone.master_url, py_files, "--help"), cwd=tmp_path,
                          env=cluster_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    for option in ("--history", "--traces", "--out", "--isolation"):
        assert option in done.stdout
