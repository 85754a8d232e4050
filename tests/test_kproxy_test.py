"""`kproxy test -- COMMAND`: the user's command through a tracing proxy, and everything stopped after.

Each run gets a marker in its environment, which every process it starts
inherits (the broker, the proxy, the command and the command's children):
after the run no process may still carry it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from click.testing import CliRunner

from kproxy.cli import main
from kproxy.testing.runner import (
    EXIT_COMMAND,
    EXIT_INTERRUPTED,
    EXIT_INVALID,
    EXIT_KPROXY,
    EXIT_UNKNOWN,
    EXIT_USAGE,
    EXIT_VALID,
    exit_status,
)

ROOT = Path(__file__).resolve().parent.parent
EOS_APP = ROOT / "tests" / "apps" / "eos_app.py"
MARK = "KPROXY_TEST_RUN_MARK"

pytestmark = pytest.mark.timeout(240)


def _marked(mark: str) -> list[str]:
    """The command lines of live processes whose environment carries the run's marker."""
    found = []
    needle = f"{MARK}={mark}".encode()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            if needle in (entry / "environ").read_bytes().split(b"\0"):
                state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
                if state != "Z":  # a zombie is gone, only not yet reaped by its new parent
                    found.append((entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
        except OSError:
            continue
    return found


def _env(mark: str) -> dict[str, str]:
    return {**os.environ, MARK: mark}


def kproxy_test(*args: str, mark: str, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "kproxy", "test", *args], capture_output=True, text=True, check=False,
                          timeout=timeout, env=_env(mark), cwd=ROOT)


def assert_nothing_left(mark: str) -> None:
    deadline = time.monotonic() + 5
    while _marked(mark) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert _marked(mark) == []


def test_help_lists_every_option_the_exit_codes_and_examples():
    from kproxy.cli.test import kproxy_test as command

    result = CliRunner().invoke(main, ["test", "--help"], terminal_width=100)
    assert result.exit_code == 0
    for param in command.params:
        for opt in param.opts:
            if opt.startswith("-"):
                assert opt in result.output, opt
    for code in ("0  the command succeeded", "1  the verdict", "2  bad usage", "3  kproxy itself failed",
                 "4  the verdict is unknown", "5  the command failed", "130 interrupted"):
        assert code in result.output
    assert "Examples:" in result.output and "{bootstrap}" in result.output and "KAFKA_BOOTSTRAP_SERVERS" in result.output


@pytest.mark.parametrize(("args", "message"), [
    ((), "no command to run"),
    (("--broker", "tansu", "--bootstrap", "127.0.0.1:9092", "--", "true"), "give one of them"),
    (("--bootstrap", "not-an-address", "--", "true"), "is not one HOST:PORT"),
    (("--transaction-version", "2", "--", "true"), "the tansu broker has no transaction.version"),
    (("--broker", "noida", "--transaction-version", "1", "--", "true"), "--broker kafka"),
    (("--bootstrap", "127.0.0.1:9092", "--transaction-version", "2", "--", "true"), "not on the broker at --bootstrap"),
])
def test_usage_errors_exit_2_before_anything_starts(tmp_path, args, message):
    result = CliRunner().invoke(main, ["test", "--out", str(tmp_path / "out"), *args])
    assert result.exit_code == EXIT_USAGE, result.output
    assert message in result.output
    assert not (tmp_path / "out").exists()


def test_a_bad_rule_file_and_an_earlier_runs_output_are_refused(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("rules:\n  - id: x\n    action: {type: delay, ms: -1}\n")
    result = CliRunner().invoke(main, ["test", "--rules", str(bad), "--out", str(tmp_path / "out"), "--", "true"])
    assert result.exit_code == EXIT_USAGE and "bad.yaml:" in result.output
    (tmp_path / "used" / "traces").mkdir(parents=True)
    (tmp_path / "used" / "traces" / "trace-1.events").write_bytes(b"x")
    result = CliRunner().invoke(main, ["test", "--out", str(tmp_path / "used"), "--", "true"])
    assert result.exit_code == EXIT_USAGE and "traces of an earlier run" in result.output


def test_java_is_asked_for_only_when_the_analysis_runs_here(tmp_path, monkeypatch):
    import kproxy.prereqs as prereqs

    def no_java(command: str) -> None:
        raise prereqs.MissingPrerequisite(f"kproxy {command}: no Java here")

    monkeypatch.setattr(prereqs, "check_java", no_java)
    result = CliRunner().invoke(main, ["test", "--out", str(tmp_path / "a"), "--", "no-such-command-here"])
    assert result.exit_code == EXIT_USAGE and "no Java here" in result.output
    # On Spark Connect no JVM runs here: it goes on, to the command that is not found.
    result = CliRunner().invoke(main, ["test", "--remote", "sc://127.0.0.1:15002", "--out", str(tmp_path / "b"),
                                       "--", "no-such-command-here"])
    assert result.exit_code == EXIT_COMMAND and "command not found" in result.output


def test_a_command_that_is_not_found_fails_at_once_and_starts_nothing(tmp_path):
    mark = uuid.uuid4().hex
    began = time.monotonic()
    done = kproxy_test("--out", str(tmp_path / "out"), "--", "no-such-command-kproxy", "{bootstrap}", mark=mark)
    assert done.returncode == EXIT_COMMAND, done.stderr
    assert "command not found: no-such-command-kproxy" in done.stderr and "nothing was started" in done.stderr
    assert time.monotonic() - began < 10
    assert_nothing_left(mark)


def test_a_command_that_exits_at_once_stops_the_broker_and_the_proxy(tmp_path):
    mark = uuid.uuid4().hex
    out = tmp_path / "out"
    done = kproxy_test("--out", str(out), "--", "sh", "-c", "echo to-stdout; echo to-stderr >&2; exit 7", mark=mark)
    assert done.returncode == EXIT_COMMAND, done.stderr
    assert "the command exited with status 7" in done.stdout
    assert "the command sent no request through the proxy" in done.stdout
    # Its output went to the terminal, each stream to its own, and to the log.
    assert "to-stdout" in done.stdout and "to-stderr" in done.stderr
    assert {"to-stdout", "to-stderr"} <= set((out / "command.log").read_text().split())
    run = json.loads((out / "run.json").read_text())
    assert run["command"]["returncode"] == 7 and run["client_requests"] == 0 and run["exit_code"] == EXIT_COMMAND
    for phase in ("starting the embedded tansu broker", "starting kproxy", "running the command", "stopping kproxy"):
        assert phase in done.stderr
    assert_nothing_left(mark)


def test_duration_stops_the_command_and_its_whole_process_group(tmp_path):
    mark = uuid.uuid4().hex
    out = tmp_path / "out"
    began = time.monotonic()
    done = kproxy_test("--duration", "2", "--no-analyze", "--out", str(out), "--",
                       "sh", "-c", "sleep 60 & sleep 60", mark=mark)
    assert time.monotonic() - began < 30
    run = json.loads((out / "run.json").read_text())
    assert run["command"]["stopped_at_duration"] is True and run["command"]["failed"] is False
    assert 2 <= run["command"]["elapsed_s"] < 15
    assert "--duration 2 s reached" in done.stderr
    # A command stopped at --duration has not failed; one that sent nothing through the proxy has.
    assert done.returncode == EXIT_COMMAND and "did nothing through the proxy" in done.stdout
    assert_nothing_left(mark)


def test_the_command_gets_the_proxy_address_in_its_arguments_and_environment(tmp_path):
    mark = uuid.uuid4().hex
    out = tmp_path / "out"
    script = ("import os, sys; from confluent_kafka.admin import AdminClient; "
              "print('seeds', sys.argv[1], os.environ['KAFKA_BOOTSTRAP_SERVERS'], os.environ['KPROXY_ADMIN']); "
              "AdminClient({'bootstrap.servers': os.environ['KAFKA_BOOTSTRAP_SERVERS']}).list_topics(timeout=10)")
    done = kproxy_test("-q", "--no-analyze", "--out", str(out), "--", sys.executable, "-c", script,
                       "KGO_SEEDS={bootstrap}", mark=mark)
    assert done.returncode == EXIT_VALID, done.stdout + done.stderr
    assert "[kproxy test]" not in done.stderr  # --quiet
    words = next(line for line in done.stdout.splitlines() if line.startswith("seeds")).split()
    assert words[1] == f"KGO_SEEDS={words[2]}" and words[2].startswith("127.0.0.1:") and words[3] != words[2]
    assert json.loads((out / "run.json").read_text())["client_requests"] > 0
    assert any((out / "traces").iterdir())
    assert_nothing_left(mark)


def _wait_for(path: Path, text: str, process: subprocess.Popen, timeout: float = 30) -> None:
    deadline = time.monotonic() + timeout
    while text not in (path.read_text() if path.exists() else ""):
        assert process.poll() is None and time.monotonic() < deadline, path.read_text() if path.exists() else ""
        time.sleep(0.1)


def test_ctrl_c_stops_the_command_the_proxy_and_the_broker(tmp_path):
    mark = uuid.uuid4().hex
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        # Its own session, as a terminal's foreground job: Ctrl-C goes to the whole group.
        process = subprocess.Popen([sys.executable, "-m", "kproxy", "test", "--no-analyze", "--out", str(tmp_path / "o"),
                                    "--", "sleep", "60"], stdout=subprocess.DEVNULL, stderr=stderr, env=_env(mark),
                                   cwd=ROOT, start_new_session=True)
        try:
            _wait_for(err, "running the command", process)
            os.killpg(process.pid, signal.SIGINT)
            assert process.wait(60) == EXIT_INTERRUPTED
        finally:
            if process.poll() is None:
                os.killpg(process.pid, signal.SIGKILL)
    assert "interrupted" in err.read_text()
    assert_nothing_left(mark)


def test_a_proxy_that_dies_stops_the_command_and_is_kproxys_failure(tmp_path):
    mark = uuid.uuid4().hex
    err = tmp_path / "stderr"
    with open(err, "w") as stderr:
        process = subprocess.Popen([sys.executable, "-m", "kproxy", "test", "--no-analyze", "--out", str(tmp_path / "o"),
                                    "--", "sleep", "60"], stdout=subprocess.PIPE, stderr=stderr, env=_env(mark),
                                   cwd=ROOT, text=True)
        try:
            _wait_for(err, "running the command", process)
            (proxy,) = [pid for pid in _marked_pids(mark) if "kproxy run" in _cmdline(pid)]
            os.kill(proxy, signal.SIGKILL)
            out, _ = process.communicate(timeout=60)
        finally:
            if process.poll() is None:
                process.kill()
    assert process.returncode == EXIT_KPROXY
    assert "kproxy failed: kproxy exited with status -9 while the command ran" in out
    assert_nothing_left(mark)


def _marked_pids(mark: str) -> list[int]:
    needle = f"{MARK}={mark}".encode()
    pids = []
    for entry in Path("/proc").iterdir():
        try:
            if entry.name.isdigit() and needle in (entry / "environ").read_bytes().split(b"\0"):
                pids.append(int(entry.name))
        except OSError:
            continue
    return pids


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


@pytest.mark.parametrize(("kproxy_failed", "verdict", "command_failed", "expected"), [
    (True, EXIT_INVALID, True, EXIT_KPROXY),
    (False, EXIT_INVALID, True, EXIT_INVALID),
    (False, EXIT_VALID, True, EXIT_COMMAND),
    (False, EXIT_UNKNOWN, True, EXIT_COMMAND),
    (False, None, True, EXIT_COMMAND),
    (False, EXIT_UNKNOWN, False, EXIT_UNKNOWN),
    (False, EXIT_VALID, False, EXIT_VALID),
    (False, None, False, EXIT_VALID),
])
def test_exit_status_precedence(kproxy_failed, verdict, command_failed, expected):
    assert exit_status(kproxy_failed=kproxy_failed, verdict_code=verdict, command_failed=command_failed) == expected


def test_an_eos_application_torn_by_the_rule_is_judged_and_the_rule_blamed(tmp_path, worker_engine):
    """The consume-transform-produce app of tests/apps (JSON values, aborts, offsets sent to each
    transaction), through the proxy with the torn-transaction rule on noida-db, then the verdict with no
    history: every error is the rule's, and the final read made the run judgeable. The verdict comes
    from a warm engine, as a user's loop of such runs would get it (`kproxy analyze`'s tests start Spark of their own).
    """
    mark = uuid.uuid4().hex
    out = tmp_path / "out"
    done = kproxy_test("--broker", "noida", "--rules", str(ROOT / "rules" / "torn-transaction.yaml"),
                       "--out", str(out), "--",
                       sys.executable, str(EOS_APP), "{bootstrap}", mark=mark, timeout=220)
    assert (out / "report" / "report.json").is_file(), done.stdout + done.stderr
    assert (out / "report" / "report.html").is_file()
    report = json.loads((out / "report" / "report.json").read_text())
    run = json.loads((out / "run.json").read_text())
    assert run["client_requests"] > 0, done.stdout + done.stderr
    assert report["broker"]["kind"] == "noida" and report["broker"]["started_by_kproxy"] is True
    assert done.returncode == EXIT_INVALID == run["exit_code"], done.stdout + done.stderr
    assert report["stats"]["final_reads"] is True
    causes = report["stats"]["causes"]
    assert {"G1a", "client-outcome-mismatch"} <= set(report["errors"])
    for name in report["errors"]:
        assert set(causes[name]) == {"rule:stale-commit-into-next-txn"}, (name, causes[name])
    assert "kproxy analyze: INVALID" in done.stdout and "processed 50 records" in done.stdout
    assert "final read: " in done.stderr and "analysing the trace" in done.stderr
    assert f"analysing in the warm engine (pid {worker_engine['pid']}" in done.stderr
    assert_nothing_left(mark)
