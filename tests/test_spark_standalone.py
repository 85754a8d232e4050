"""The analysis submitted to a real standalone Spark cluster, the way
docs/analysis.md ("On a Spark cluster") tells users to, reports what the
local analysis reports.

A cluster runs the same plan with other partitioning, executors in other
processes fed by --py-files, and adaptive execution on: a check that
depends on partition order, a module missing from the shipped zip or a
function the executors cannot import shows up here and nowhere else.
"""

from __future__ import annotations

import json
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

from tests.fixtures.spark_cluster import StandaloneCluster, cluster_env, spark_home, stop_group
from tests.test_wire_scenarios import Scenario, torn_scenario

pytestmark = pytest.mark.spark

ROOT = Path(__file__).resolve().parent.parent
SUBMIT_TIMEOUT_S = 240
# Measures of how the run went, not of what it found: they differ between
# any two runs, so the comparison leaves them out.
RUN_STATS = ("elapsed_s", "phases_s", "spark_jobs")


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


def analysis_zip(path: Path) -> Path:
    """The --py-files archive: the kproxy and kproxy_spark packages at its
    top level, as docs/analysis.md's two `zip -r` commands make it (kproxy
    from the repository root, kproxy_spark from spark/)."""
    with zipfile.ZipFile(path, "w", zipfile.ZIP_DEFLATED) as archive:
        for base, package in ((ROOT, "kproxy"), (ROOT / "spark", "kproxy_spark")):
            for source in sorted((base / package).rglob("*")):
                if source.is_file() and "__pycache__" not in source.parts:
                    archive.write(source, source.relative_to(base))
    return path


def submit_command(cluster: StandaloneCluster, py_files: Path, history: Path, traces: Path, out: Path) -> list[str]:
    """The documented spark-submit command (docs/analysis.md), sized for a
    one-core worker and a few rows."""
    return [
        str(spark_home() / "bin" / "spark-submit"),
        "--master", cluster.master_url,
        "--conf", f"spark.pyspark.python={sys.executable}",
        "--conf", "spark.sql.shuffle.partitions=4",
        "--conf", "spark.executor.memory=512m",
        "--conf", "spark.ui.enabled=false",
        "--py-files", str(py_files),
        str(ROOT / "spark" / "jobs.py"),
        "--history", str(history), "--traces", str(traces), "--out", str(out),
    ]


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


@pytest.mark.timeout(SUBMIT_TIMEOUT_S + 60)
def test_spark_submit_to_a_standalone_cluster_reports_what_local_mode_reports(spark_standalone, spark, tmp_path):
    from kproxy_spark.jobs import analyze

    history, traces = anomalous_scenario().write(tmp_path)
    cluster_out, local_out = tmp_path / "cluster", tmp_path / "local"
    command = submit_command(spark_standalone, analysis_zip(tmp_path / "kproxy-analysis.zip"),
                             history, traces, cluster_out)
    with open(tmp_path / "submit.log", "wb") as log:
        # The cluster run and the local run overlap: each waits on its JVM
        # and planner much of the time, so together they take less wall time.
        submit = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, env=cluster_env(),
                                  cwd=ROOT, start_new_session=True)
        try:
            local = analyze(history, traces, local_out, master="local[2]", spark=spark)
            returncode = submit.wait(timeout=SUBMIT_TIMEOUT_S)
        finally:
            stop_group(submit)
    submitted = (tmp_path / "submit.log").read_text(errors="replace")

    # Exit code 1 is the job's "invalid": it ran to the end and found errors.
    assert returncode == 1, f"spark-submit exited {returncode}\n{submitted[-5000:]}\n{spark_standalone.logs()}"
    apps = [app["name"] for app in spark_standalone.state()["completedapps"]]
    assert "kproxy-analyze" in apps, "the job did not run on the standalone master"
    clustered = json.loads((cluster_out / "report.json").read_text())

    # The scenario's anomalies were found at all, so agreeing means something.
    assert local["valid"] is False
    for name in ("G1a", "lost-write", "torn-transaction", "broker-aborted-read"):
        assert local["counts"][name] >= 1, name
    assert comparable(clustered) == comparable(local)
