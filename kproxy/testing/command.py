"""The user's command under `kproxy test`: started with the proxy's address, watched, stopped.

It runs in a session (and so a process group) of its own: a Ctrl-C at the
terminal reaches kproxy alone, which then stops the command's whole group
in order (SIGTERM, SIGKILL after a grace period) before the proxy and the
broker. Its stdin is /dev/null (a process outside the terminal's foreground
group cannot read it); its stdout and stderr go to the terminal, each to its
own, and both to one log file.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

#: Where the proxy's address goes in the command's arguments (anywhere inside one).
PLACEHOLDER = "{bootstrap}"
#: The variable that tells the command the proxy's address.
BOOTSTRAP_VARIABLE = "KAFKA_BOOTSTRAP_SERVERS"
#: How long a command told to stop (SIGTERM) has before its group is killed.
GRACE_S = 10.0
#: A progress line while the command runs, this often.
PROGRESS_EVERY_S = 10.0

Say = Callable[[str], None]


def substitute(argv: Sequence[str], bootstrap: str) -> list[str]:
    """The command with every {bootstrap} in any argument replaced by the proxy's address."""
    return [arg.replace(PLACEHOLDER, bootstrap) for arg in argv]


def find_executable(program: str) -> str | None:
    """What would run for `program`, as the shell looks it up; None when nothing would."""
    if os.sep in program:
        return program if os.path.isfile(program) and os.access(program, os.X_OK) else None
    return shutil.which(program)


def command_text(argv: Sequence[str]) -> str:
    return shlex.join(argv)


@dataclass
class CommandOutcome:
    argv: list[str]
    returncode: int | None = None  # None: it never ran
    error: str | None = None  # why it could not start
    stopped_at_duration: bool = False
    interrupted: bool = False
    elapsed_s: float = 0.0

    @property
    def failed(self) -> bool:
        """It did not run, or it ended on its own with a non-zero status. A command kproxy stopped
        at --duration has not failed: a service runs until it is stopped."""
        if self.error is not None or self.returncode is None:
            return True
        return not self.stopped_at_duration and not self.interrupted and self.returncode != 0

    def describe(self) -> str:
        if self.error is not None:
            return f"the command could not start: {self.error}"
        took = f"after {self.elapsed_s:.1f} s"
        if self.interrupted:
            return f"the command was stopped by an interrupt {took}"
        if self.stopped_at_duration:
            return f"the command was stopped at --duration {took} (status {_status(self.returncode)})"
        return f"the command exited with status {_status(self.returncode)} {took}"

    def to_json(self) -> dict[str, Any]:
        return {"argv": self.argv, "returncode": self.returncode, "error": self.error,
                "stopped_at_duration": self.stopped_at_duration, "interrupted": self.interrupted,
                "elapsed_s": round(self.elapsed_s, 3), "failed": self.failed}


def _status(code: int | None) -> str:
    if code is not None and code < 0:
        try:
            return f"{code} ({signal.Signals(-code).name})"
        except ValueError:
            pass
    return str(code)


def _pump(source: IO[bytes], terminal: IO[Any], log: IO[bytes], lock: threading.Lock) -> None:
    """Copy one of the command's streams to the terminal and to the log, as it comes."""
    sink = getattr(terminal, "buffer", None)
    for chunk in iter(lambda: source.read1(65536), b""):
        with lock:
            log.write(chunk)
            log.flush()
        try:
            if sink is not None:
                sink.write(chunk)
                sink.flush()
            else:
                terminal.write(chunk.decode(errors="replace"))
                terminal.flush()
        except (OSError, ValueError):
            pass  # a closed terminal: the log still has it


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int, leader: subprocess.Popen[bytes]) -> bool:
    """Whether a process of the group is still running. A zombie does not count: it has ended, and a
    container's first process may never reap the orphans (while kill(0) would still find them)."""
    leader.poll()  # reaps our own child
    proc = Path("/proc")
    if not proc.is_dir():
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return False
        return True
    for entry in proc.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            state, _parent, group = (entry / "stat").read_text().rsplit(")", 1)[1].split()[:3]
        except (OSError, ValueError):
            continue
        if int(group) == pgid and state not in ("Z", "X"):
            return True
    return False


def _wait_group_gone(pgid: int, leader: subprocess.Popen[bytes], timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while _group_alive(pgid, leader):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def stop_group(process: subprocess.Popen[bytes], grace: float = GRACE_S) -> None:
    """SIGTERM to the command's whole process group, SIGKILL to what is left after `grace`."""
    pgid = process.pid  # the leader of its own session
    if _group_alive(pgid, process):
        _signal_group(pgid, signal.SIGTERM)
        if not _wait_group_gone(pgid, process, grace):
            _signal_group(pgid, signal.SIGKILL)
            _wait_group_gone(pgid, process, 5.0)
    try:
        process.wait(5.0)
    except subprocess.TimeoutExpired:
        pass


@contextlib.contextmanager
def held_signals() -> Iterator[list[int]]:
    """SIGINT and SIGTERM are recorded in the yielded list instead of acting, for the block's length.

    A recording handler rather than SIG_IGN or a blocked signal mask: a child
    started meanwhile gets the default action at exec, where it would inherit
    an ignored or blocked signal."""
    held: list[int] = []
    if threading.current_thread() is not threading.main_thread():
        yield held
        return
    before = {sig: signal.signal(sig, lambda signum, _frame: held.append(signum))
              for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield held
    finally:
        for sig, handler in before.items():
            signal.signal(sig, handler)


@contextlib.contextmanager
def deferred_interrupt() -> Iterator[None]:
    """The block runs to its end; an interrupt that came meanwhile is raised after it, as KeyboardInterrupt.

    For starting and stopping children: interrupted halfway, a child would be
    running with nobody left who knows its pid."""
    with held_signals() as held:
        yield
    if held:
        raise KeyboardInterrupt


def run_command(
    argv: Sequence[str],
    *,
    env: Mapping[str, str],
    log_path: Path,
    duration: float | None = None,
    grace: float = GRACE_S,
    say: Say = lambda _: None,
    keep_running: Callable[[], str | None] = lambda: None,
    stdout: IO[Any] | None = None,
    stderr: IO[Any] | None = None,
) -> CommandOutcome:
    """Run `argv` until it exits, `duration` seconds pass, or `keep_running` names a reason to stop it.

    Whatever ends it, its whole process group is gone on return (also on
    KeyboardInterrupt, which is re-raised). `keep_running` is asked about
    once a second: a string (the proxy died, say) stops the command and is
    raised as RuntimeError.
    """
    outcome = CommandOutcome(list(argv))
    started = time.monotonic()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    process: subprocess.Popen[bytes] | None = None
    pumps: list[threading.Thread] = []
    reason = None
    held_while_stopping: list[int] = []
    with open(log_path, "ab") as log:
        try:
            # An interrupt while the child starts would lose its pid: it waits until `process` holds it
            # (and is raised inside this try, whose finally stops the child).
            with held_signals() as held:
                try:
                    process = subprocess.Popen(list(argv), env=dict(env), stdin=subprocess.DEVNULL,
                                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
                except OSError as exc:
                    outcome.error = f"{argv[0]}: {exc.strerror or exc}"
                    log.write(f"kproxy test: {outcome.error}\n".encode())
                if process is not None:
                    pumps = _start_pumps(process, log, stdout or sys.stdout, stderr or sys.stderr)
            if held:
                raise KeyboardInterrupt
            next_progress = started + PROGRESS_EVERY_S
            next_check = started + 1.0
            while process is not None and process.poll() is None:
                now = time.monotonic()
                if duration is not None and now - started >= duration:
                    outcome.stopped_at_duration = True
                    say(f"--duration {duration:g} s reached: stopping the command (SIGTERM, SIGKILL after {grace:g} s)")
                    break
                if now >= next_check:
                    next_check = now + 1.0
                    reason = keep_running()
                    if reason is not None:
                        break
                if now >= next_progress:
                    next_progress = now + PROGRESS_EVERY_S
                    say(f"the command has run for {now - started:.0f} s")
                time.sleep(0.1)
        except KeyboardInterrupt:
            outcome.interrupted = True
            raise
        finally:
            if process is not None:
                # The leader may be gone and its children not: the group goes either way, uninterrupted.
                with held_signals() as held_while_stopping:
                    stop_group(process, grace)
                    outcome.returncode = process.returncode
                    outcome.elapsed_s = time.monotonic() - started
                    for pump in pumps:
                        pump.join(5.0)
    if held_while_stopping and not outcome.interrupted:
        outcome.interrupted = True
        raise KeyboardInterrupt  # it came while the command was being stopped: honoured now
    if reason is not None:
        raise RuntimeError(reason)
    return outcome


def _start_pumps(process: subprocess.Popen[bytes], log: IO[bytes], stdout: IO[Any],
                 stderr: IO[Any]) -> list[threading.Thread]:
    lock = threading.Lock()
    assert process.stdout is not None and process.stderr is not None
    pumps = [threading.Thread(target=_pump, args=(stream, terminal, log, lock), daemon=True, name=f"kproxy-test-{name}")
             for stream, terminal, name in ((process.stdout, stdout, "stdout"), (process.stderr, stderr, "stderr"))]
    for pump in pumps:
        pump.start()
    return pumps
