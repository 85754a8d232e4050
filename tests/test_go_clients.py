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
