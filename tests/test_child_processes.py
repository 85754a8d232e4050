"""The one way kproxy starts and stops the servers it runs as children (kproxy/brokers/process.py):
real child processes, their output in a log, a port waited for, SIGTERM then SIGKILL."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

from kproxy.brokers.process import free_port, pid_alive, running_process, spawn, stop_process, wait_or_kill

# Prints to both streams, listens on argv[1] if given, and ignores SIGTERM if told to.
CHILD = """
import signal, socket, sys, time
print("to stdout", flush=True)
print("to stderr", file=sys.stderr, flush=True)
if "stubborn" in sys.argv:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
if len(sys.argv) > 1 and sys.argv[1].isdigit():
    server = socket.socket()
    server.bind(("127.0.0.1", int(sys.argv[1])))
    server.listen()
print("ready", flush=True)
time.sleep(60)
"""


def wait_for_line(log: Path, line: str) -> None:
    deadline = time.monotonic() + 30
    while line not in log.read_text():
        assert time.monotonic() < deadline, log.read_text()
        time.sleep(0.02)


def test_output_and_errors_are_appended_to_the_log_and_sigterm_stops(tmp_path: Path) -> None:
    log = tmp_path / "child.log"
    log.write_text("an earlier run\n")
    child = spawn([sys.executable, "-c", CHILD], log, new_session=True)
    wait_for_line(log, "ready")
    assert stop_process(child, timeout=10) == -signal.SIGTERM
    text = log.read_text()
    assert text.startswith("an earlier run\n") and "to stdout" in text and "to stderr" in text


def test_a_child_that_ignores_sigterm_is_killed_after_the_grace_period(tmp_path: Path) -> None:
    log = tmp_path / "stubborn.log"
    child = spawn([sys.executable, "-c", CHILD, "stubborn"], log)
    wait_for_line(log, "ready")
    child.send_signal(signal.SIGTERM)
    assert wait_or_kill(child, 0.5) is True
    assert child.returncode == -signal.SIGKILL


def test_running_process_yields_once_the_port_listens_and_stops_after(tmp_path: Path) -> None:
    port = free_port()
    with running_process([sys.executable, "-c", CHILD, str(port)], tmp_path / "server.log", "127.0.0.1", [port],
                         30) as child:
        with socket.create_connection(("127.0.0.1", port), timeout=5):
            pass
    assert child.poll() == -signal.SIGTERM


def test_a_process_is_alive_while_it_runs_and_not_once_it_exited_unreaped() -> None:
    child = subprocess.Popen([sys.executable, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    assert pid_alive(child.pid) and pid_alive(os.getpid())
    child.stdin.close()
    deadline = time.monotonic() + 10
    while pid_alive(child.pid):  # a zombie until waited for: not alive (a lock naming it is free)
        assert time.monotonic() < deadline, "an exited child still counted as alive"
        time.sleep(0.05)
    assert child.wait(1) == 0 and not pid_alive(child.pid)
    assert not pid_alive("1234") and not pid_alive(None)
