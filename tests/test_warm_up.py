"""WarmingSession: Spark started and warmed in the background (kproxy demo's analysis meets a warm JVM).
Its working path runs in every `kproxy demo` of 15 s or more; the suite's demos are shorter or share the
suite's session, so the working path is checked here too, each in a process of its own (a process that
already holds a session would be handed that one)."""

from __future__ import annotations

import subprocess
import sys

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]


def _in_a_fresh_process(code: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=200, check=False)


def test_a_session_that_cannot_start_raises_where_the_caller_asks_for_it() -> None:
    done = _in_a_fresh_process(
        "from kproxy.engine.warm_up import WarmingSession\n"
        "warming = WarmingSession(master='no-such-master://here').start()\n"
        "warming.wait_launched(timeout=150)  # a failed start does not leave the caller waiting\n"
        "try:\n"
        "    warming.session()\n"
        "except Exception as exc:\n"
        "    print('raised:', exc)\n")
    assert done.returncode == 0, done.stderr
    assert "raised:" in done.stdout and ("JAVA_GATEWAY_EXITED" in done.stdout or "no-such-master" in done.stdout), \
        done.stdout + done.stderr


def test_a_warmed_session_has_run_the_warm_up_analysis_s_jobs() -> None:
    done = _in_a_fresh_process(
        "from kproxy.engine.warm_up import WarmingSession\n"
        "warming = WarmingSession(master='local[2]').start()\n"
        "spark = warming.session()\n"
        "print('jobs:', spark.sparkContext._jsc.sc().statusStore().jobsList(None).size() > 0,"
        " 'seconds:', warming.seconds > 0, 'master:', spark.sparkContext.master)\n")
    assert done.returncode == 0, done.stderr
    assert "jobs: True seconds: True master: local[2]" in done.stdout, done.stdout + done.stderr
