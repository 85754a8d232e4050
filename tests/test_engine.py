"""The warm engine: `kproxy engine start|status|stop`, and `kproxy analyze` answered by it.

The first test starts a real engine (Spark and its warm-up analysis) in a
directory of its own ($KPROXY_ENGINE_DIR), sends it analyses through the
CLI, and compares its report with the suite's own Spark's on the same
input. The others drive the engine's socket protocol and idle stop with the
Spark part left out (`warm` does nothing), which is what they are about.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Client
from pathlib import Path

import pytest

from kproxy.brokers.process import pid_alive
from kproxy.engine import client
from kproxy.engine.place import Place
from kproxy.engine.server import Engine

RUN = Path(__file__).parent / "data" / "recorded" / "tansu-torn-transaction"
RULE = "stale-commit-into-next-txn"


def kproxy(*args: str, env: dict[str, str], timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kproxy", *args], env=env, capture_output=True, text=True,
                          timeout=timeout, check=False)


@pytest.mark.spark
@pytest.mark.timeout(900)
def test_an_engine_answers_kproxy_analyze_as_local_spark_does_and_stops(spark, tmp_path: Path):
    from kproxy_spark.jobs import analyze

    env = {**os.environ, "KPROXY_ENGINE_DIR": str(tmp_path / "engine")}
    assert kproxy("engine", "status", env=env).returncode == 1
    started = kproxy("engine", "start", "--idle-stop", "10", env=env)
    assert started.returncode == 0, started.stderr
    assert "the engine is warm after" in started.stderr
    status = kproxy("engine", "status", env=env)
    assert status.returncode == 0 and ": warm, up" in status.stdout and "0 analyses" in status.stdout, status.stdout
    pid = json.loads((tmp_path / "engine" / "engine.json").read_text())["pid"]
    try:
        out = tmp_path / "by-engine"
        answered = kproxy("analyze", "--history", str(RUN / "history.jsonl"), "--traces", str(RUN / "traces"),
                          "--out", str(out), env=env)
        assert answered.returncode == 1, answered.stderr  # the rule tears transactions
        assert f"analysing in the warm engine (pid {pid}, local[*])" in answered.stderr
        assert "kproxy analyze: INVALID" in answered.stdout
        by_engine = json.loads((out / "report.json").read_text())
        here = analyze(str(RUN / "history.jsonl"), str(RUN / "traces"), str(tmp_path / "here"), spark=spark)
        assert by_engine["counts"] == here["counts"] and by_engine["errors"] == here["errors"]
        assert by_engine["stats"]["causes"]["torn-transaction"] == {f"rule:{RULE}": by_engine["counts"]["torn-transaction"]}
        assert (out / "report.html").is_file()
        # Input the analysis refuses is refused alike (exit 2), and the engine keeps serving.
        refused = kproxy("analyze", "--history", str(RUN / "history.jsonl"), "--traces", str(tmp_path / "none"),
                         "--out", str(tmp_path / "x"), env=env)
        assert refused.returncode == 2 and "trace directory not found" in refused.stderr, refused.stderr
        stopped = kproxy("engine", "stop", env=env)
        assert stopped.returncode == 0 and f"stopped the engine (pid {pid}) after 2 analyses" in stopped.stdout
        assert kproxy("engine", "status", env=env).returncode == 1
        assert not pid_alive(pid)
        assert not (tmp_path / "engine" / "engine.sock").exists()
    finally:
        if pid_alive(pid):
            os.kill(pid, 9)


class SparkFreeEngine(Engine):
    """The engine without Spark: its socket, requests and idle stop, which is what the tests below check."""

    def warm(self) -> float:
        return 0.0


def serving(place: Place, idle_stop_s: float) -> threading.Thread:
    engine = SparkFreeEngine(place, "local[1]", idle_stop_s, {})
    thread = threading.Thread(target=engine.serve, daemon=True)
    thread.start()
    deadline = time.monotonic() + 10
    while (client.status(place) or {}).get("ready") is not True:
        assert time.monotonic() < deadline, "the engine did not come up"
        time.sleep(0.05)
    return thread


def test_an_idle_engine_stops_by_itself_and_status_is_not_use(tmp_path: Path):
    place = Place(tmp_path / "e")
    thread = serving(place, idle_stop_s=2.0)
    begun = time.monotonic()
    while thread.is_alive() and time.monotonic() - begun < 15:
        assert client.status(place) is None or client.status(place)["analyses"] == 0
        time.sleep(0.3)
    assert not thread.is_alive(), "asking for the status kept the engine from its idle stop"
    assert time.monotonic() - begun >= 1.5
    assert client.status(place) is None and not place.socket.exists() and place.state() is None


def test_an_engine_refuses_a_stranger_and_an_unknown_request_and_keeps_serving(tmp_path: Path):
    place = Place(tmp_path / "e")
    thread = serving(place, idle_stop_s=0)
    with pytest.raises(Exception, match="digest"):  # multiprocessing.AuthenticationError
        Client(str(place.socket), family="AF_UNIX", authkey=b"not the key")
    with Client(str(place.socket), family="AF_UNIX", authkey=place.key()) as conn:
        conn.send({"op": "reformat"})
        assert conn.recv() == {"error": {"kind": "usage", "message": "unknown request 'reformat'"}}
    assert client.status(place)["ready"] is True
    with pytest.raises(client.EngineInputError, match="history not found"):
        client.analyze({"history": str(tmp_path / "none.jsonl"), "traces": None, "out": str(tmp_path / "o")},
                       progress=lambda _: None, place=place)
    assert client.stop(place, timeout=0)["analyses"] == 1  # not waiting for its pid: this very process
    thread.join(10)
    assert not thread.is_alive() and client.stop(place) is None
