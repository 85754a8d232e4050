"""`kproxy analyze --remote sc://...` against a real Spark Connect server,
run as a user runs it (the installed command, from a directory of its own,
with relative paths), on a run recorded from the real proxy and broker,
reports what the local analysis reports; an address where no server answers
is a usage error that names it, at once.

The server runs without the suite's PYTHONPATH: the analysis ships its own
code to the session (a Connect artifact), and its grouped Arrow passes run
in the server's Python workers from that zip. What a Connect client cannot
do (count Spark jobs, read plan statistics, broadcast variables, set static
settings) takes the fallbacks docs/analysis.md ("Spark Connect") names; a
fallback that changed a verdict shows up here.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kproxy.brokers import free_port
from tests.fixtures.spark_cluster import stop_group
from tests.fixtures.spark_connect import ConnectServer, connect_env
from tests.test_spark_standalone import comparable

pytestmark = pytest.mark.spark

RECORDED = Path(__file__).parent / "data" / "recorded" / "tansu-torn-transaction"
ANALYZE_TIMEOUT_S = 300
#: An unreachable server is told within the client's connect deadline (10 s), not Spark's minutes of retries.
UNREACHABLE_TIMEOUT_S = 60


def kproxy_command(*args: str) -> list[str]:
    kproxy = shutil.which("kproxy", path=f"{Path(sys.executable).parent}")
    assert kproxy is not None, "the kproxy command is not installed in this venv"
    return [kproxy, *args]


@pytest.mark.timeout(ANALYZE_TIMEOUT_S + 90)
def test_kproxy_analyze_on_spark_connect_reports_what_local_mode_reports(spark_connect_server: ConnectServer,
                                                                         spark, tmp_path):
    from kproxy_spark.jobs import analyze

    elsewhere = tmp_path / "elsewhere"
    shutil.copytree(RECORDED, elsewhere / "run")
    cache = tmp_path / "cache"
    command = kproxy_command("analyze", "--remote", spark_connect_server.url, "--history", "run/history.jsonl",
                             "--traces", "run/traces", "--out", "run/report")
    with open(tmp_path / "analyze.out", "wb") as out, open(tmp_path / "analyze.err", "wb") as err:
        # The Connect run and the local run overlap: each waits on its JVM much of the time.
        remote = subprocess.Popen(command, stdout=out, stderr=err, env=connect_env(cache), cwd=elsewhere,
                                  start_new_session=True)
        try:
            local = analyze(str(RECORDED / "history.jsonl"), str(RECORDED / "traces"), str(tmp_path / "local"),
                            spark=spark)
            returncode = remote.wait(timeout=ANALYZE_TIMEOUT_S)
        finally:
            stop_group(remote)
    said = (tmp_path / "analyze.err").read_text(errors="replace")

    # Exit code 1 is "invalid": it ran to the end and found errors.
    assert returncode == 1, f"kproxy analyze exited {returncode}\n{said[-5000:]}\n{spark_connect_server.logs()}"
    assert "Traceback" not in said
    # The code went to the session as the zip built in the user's cache, and the server's workers ran it from there.
    [shipped] = (cache / "kproxy" / "analysis").glob("kproxy-analysis-*.zip")
    assert f"to the Spark Connect session ({shipped})" in said
    assert f"{shipped.name}/kproxy_spark/__init__.py" in said
    # No job count is made up where Connect gives none.
    assert "Spark jobs are not counted" in said
    assert "kproxy analyze: INVALID" in (tmp_path / "analyze.out").read_text()
    report = elsewhere / "run" / "report"
    assert (report / "report.html").is_file()
    from_connect = json.loads((report / "report.json").read_text())
    assert from_connect["stats"]["spark_jobs"] is None and local["stats"]["spark_jobs"] > 0
    assert from_connect["stats"]["spark_stages"] is None and local["stats"]["spark_stages"] >= local["stats"]["spark_jobs"]

    # The run's anomalies were found at all (the grouped history pass, the
    # wire checks and the broker diagnoses), so agreeing means something.
    assert local["valid"] is False
    for name in ("G1a", "torn-transaction", "broker-aborted-read", "stale-end-txn"):
        assert local["counts"][name] >= 1, name
    assert comparable(from_connect) == comparable(local)


@pytest.mark.timeout(UNREACHABLE_TIMEOUT_S + 30)
def test_an_unreachable_connect_server_is_a_usage_error_that_names_it(tmp_path):
    url = f"sc://127.0.0.1:{free_port()}"  # nothing listens there
    began = time.monotonic()
    done = subprocess.run(kproxy_command("analyze", "--remote", url, "--history", str(RECORDED / "history.jsonl"),
                                         "--out", str(tmp_path / "report")),
                          env=connect_env(tmp_path / "cache"), cwd=tmp_path, capture_output=True, text=True,
                          timeout=UNREACHABLE_TIMEOUT_S)
    took = time.monotonic() - began
    assert done.returncode == 2, done.stderr[-3000:]
    [error] = [line for line in done.stderr.splitlines() if line.startswith("error: ")]
    assert f"cannot reach the Spark Connect server at {url}" in error
    assert "Traceback" not in done.stderr
    assert took < UNREACHABLE_TIMEOUT_S / 2, f"took {took:.1f} s"


def test_remote_takes_only_a_connect_url_and_not_with_master(tmp_path):
    history = str(RECORDED / "history.jsonl")
    for extra, said in ((["--remote", "spark://127.0.0.1:7077"], "is not a Spark Connect URL"),
                        (["--remote", "sc://127.0.0.1:15002", "--master", "local[1]"], "not both")):
        done = subprocess.run(kproxy_command("analyze", "--history", history, "--out", str(tmp_path / "r"), *extra),
                              env=connect_env(tmp_path / "cache"), cwd=tmp_path, capture_output=True, text=True,
                              timeout=60)
        assert done.returncode == 2 and said in done.stderr, done.stderr[-2000:]
    # kproxy test takes the same option for its verdict, refused the same way before anything starts.
    done = subprocess.run(kproxy_command("test", "--remote", "sc://127.0.0.1:15002", "--master", "local[1]",
                                         "--out", str(tmp_path / "t"), "--", "true"),
                          env=connect_env(tmp_path / "cache"), cwd=tmp_path, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not both" in done.stderr, done.stderr[-2000:]
    assert not (tmp_path / "t").exists()


WATCHED = """
import sys, time
from kproxy_spark.progress import watch_jobs
from kproxy_spark.session import connect_session

def slow(batches):
    import time
    for batch in batches:
        time.sleep(1.2)
        yield batch

session = connect_session(sys.argv[1])
with watch_jobs(session, None, lambda line: print(line, flush=True), every=0.3):
    # Longer than the server's progress report interval (2 s) on a warm server.
    session.range(0, 6000, numPartitions=6).mapInArrow(slow, "id long").count()
"""


@pytest.mark.timeout(120)
def test_a_connect_analysis_is_told_from_connect_s_own_progress(spark_connect_server: ConnectServer, tmp_path):
    done = subprocess.run([sys.executable, "-c", WATCHED, spark_connect_server.url], capture_output=True, text=True,
                          env=connect_env(tmp_path / "cache"), timeout=100)
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    told = re.compile(r"running a Spark job \(\d+ stages? done, [1-9]\d* running: \d+ of [1-9][\d,]* tasks?\);"
                      r" [\d,]+ bytes read so far")
    assert any(told.fullmatch(line) for line in lines), done.stdout
