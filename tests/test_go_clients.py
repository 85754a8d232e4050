"""The Go clients (franz-go, sarama) need Go to be built: without it they say so at once, before any work.

Go is taken away the way a user's machine lacks it: $KPROXY_GO names a go
that is not there (the finder's fallback, /usr/local/go/bin/go, exists on
this machine, so PATH alone cannot hide it), or a go too old for go.mod, and
$XDG_CACHE_HOME is empty, so no bridge built earlier is found. The clients
themselves run against the session's Kafka in tests/test_kafka_live.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kproxy.workload.clients import client_factory
from kproxy.workload.clients.go_build import GoSetupError, required_go


@pytest.fixture
def empty_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache"


@pytest.mark.parametrize("client", ["franz-go", "sarama"])
def test_a_missing_go_is_named_in_under_a_second(client: str, empty_cache: Path, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("KPROXY_GO", str(tmp_path / "no-go-here"))
    started = time.monotonic()
    with pytest.raises(GoSetupError) as raised:
        client_factory(client, "127.0.0.1:1", {}, {})
    assert time.monotonic() - started < 1.0
    major, minor = required_go()
    assert f"Go {major}.{minor}+" in str(raised.value) and "KPROXY_GO" in str(raised.value)
    assert not (empty_cache / "kproxy" / "go-clients").exists() or not any((empty_cache / "kproxy" / "go-clients").iterdir())


def test_a_go_too_old_for_the_module_is_named(empty_cache: Path, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    old = tmp_path / "go"
    old.write_text("#!/bin/sh\necho 'go version go1.20.14 linux/amd64'\n")
    old.chmod(0o755)
    monkeypatch.setenv("KPROXY_GO", str(old))
    with pytest.raises(GoSetupError, match=r"is Go 1\.20"):
        client_factory("franz-go", "127.0.0.1:1", {}, {})


@pytest.mark.parametrize("command", [["workload", "--bootstrap", "127.0.0.1:1", "--history", "h.jsonl"],
                                     ["demo", "--broker", "kafka", "--out", "out"]], ids=["workload", "demo"])
def test_the_commands_stop_before_any_work_naming_go(command: list[str], empty_cache: Path, tmp_path: Path) -> None:
    env = {**os.environ, "XDG_CACHE_HOME": str(empty_cache), "KPROXY_GO": str(tmp_path / "no-go-here")}
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-m", "kproxy", *command, "--client", "sarama", "--no-progress"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode in (2, 3), done.stderr  # workload: 2, a failed run; demo: 3, the demo could not run
    assert "built with Go, which is missing" in done.stderr and "Traceback" not in done.stderr
    assert not (tmp_path / "out" / "broker.log").exists()  # the demo started no broker
    assert time.monotonic() - started < 15  # the interpreter's start-up, not a broker's


def test_the_demo_sets_a_transaction_version_only_on_the_kafka_it_starts(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-m", "kproxy", "demo", "--transaction-version", "0", "--client", "franz-go"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=60, check=False)
    assert done.returncode == 2 and "add --broker kafka" in done.stderr


# `kproxy demo --broker kafka --client franz-go` as a user runs it, on each transaction version: two Kafka
# starts and two analyses (about three minutes), so with the slow tests; the default suite shows the same
# fencing on the session's Kafka (tests/test_kafka_live.py).
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)
@pytest.mark.parametrize(("transaction_version", "torn"), [(2, False), (0, True)])
def test_the_franz_go_demo_is_fenced_on_transaction_version_2_and_torn_on_0(spark, tmp_path: Path,
                                                                            transaction_version: int,
                                                                            torn: bool) -> None:
    from kproxy.demo import run_demo

    result = run_demo("torn-transaction", tmp_path, broker="kafka", transaction_version=transaction_version,
                      client="franz-go", duration=8, spark=spark, say=lambda line: None, progress=False)
    report = result.report
    assert report["broker"]["software"] == "Apache Kafka"
    answers = {case["response_error_code"] for case in report["anomalies"].get("stale-end-txn", [])}
    assert answers, "the rule copied no EndTxn"
    if torn:
        assert report["counts"]["torn-transaction"] >= 1
        impact = {(i["rule"], i["anomaly"]): i["cases"] for i in report["stats"]["fault_impact"]}
        assert impact.get(("stale-commit-into-next-txn", "torn-transaction"), 0) >= 1
    else:
        assert 0 not in answers, "Kafka accepted a stale commit from franz-go"
        # What a run may still show (poll-skip, exactly-once) is the workload's consumer keeping its position
        # after an abort, blamed on the client; nothing of the rule's.
        for name in ("torn-transaction", "client-outcome-mismatch", "G1a"):
            assert report["counts"][name] == 0, name
