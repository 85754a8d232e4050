"""Finding, starting, asking and stopping the warm engine (kproxy.engine.server)."""

from __future__ import annotations

import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Client, Connection
from pathlib import Path
from typing import Any

from kproxy.brokers.process import pid_alive
from kproxy.engine.place import Place, default_place

Say = Callable[[str], None]
#: Seconds `start` waits for Spark to start and the warm-up analysis to finish.
START_TIMEOUT = 300.0


class EngineError(RuntimeError):
    """The engine could not be started, or went away during a request."""


class EngineInputError(EngineError):
    """The engine refused the analysis's input (as `kproxy analyze` does: exit 2)."""


def _connect(place: Place) -> Connection | None:
    key = place.key()
    if key is None or not place.socket.exists():
        return None
    try:
        return Client(str(place.socket), family="AF_UNIX", authkey=key)
    except (OSError, EOFError):
        return None  # a socket left by an engine that died
    except Exception:  # noqa: BLE001 - AuthenticationError: another engine's key; not ours to use
        return None


def status(place: Place | None = None) -> dict[str, Any] | None:
    """The running engine's status, or None when none answers (a stale socket is cleared)."""
    place = place or default_place()
    conn = _connect(place)
    if conn is None:
        state = place.state()
        if state and not pid_alive(state.get("pid")):
            place.clear()
        return None
    with conn:
        conn.send({"op": "status"})
        return conn.recv()


def analyze(args: Mapping[str, Any], progress: Say, place: Place | None = None) -> dict[str, Any] | None:
    """Run kproxy_spark.jobs.analyze(**args) in the running engine: the report, or None when no engine
    is running. Paths are made absolute here: the engine has its own working directory."""
    place = place or default_place()
    conn = _connect(place)
    if conn is None:
        return None
    absolute = {name: (str(Path(value).resolve()) if name in ("history", "traces", "out") and value is not None
                       and "://" not in str(value) else value) for name, value in args.items()}
    with conn:
        try:
            conn.send({"op": "analyze", "args": absolute})
            while True:
                message = conn.recv()
                if "progress" in message:
                    progress(message["progress"])
                    continue
                break
        except (EOFError, OSError) as exc:
            raise EngineError(f"the engine went away during the analysis ({exc}); see {place.log_file}") from None
    error = message.get("error")
    if error is not None:
        raise (EngineInputError if error["kind"] == "input" else EngineError)(error["message"])
    return message["report"]


def analyze_if_running(args: Mapping[str, Any], progress: Say, *, phases: bool = True) -> dict[str, Any] | None:
    """`analyze` in the running engine, saying so in `progress` (and, with `phases`, each phase's line);
    None when no engine runs."""
    state = status()
    if state is None:
        return None
    progress(f"analysing in the warm engine (pid {state['pid']}, {state['master']}"
             + (", busy: waiting for its current analysis" if state.get("busy") else "") + ")")
    return analyze(args, progress if phases else lambda _: None)


def start(*, master: str = "local[*]", idle_stop_min: float = 30.0, conf: Mapping[str, str] | None = None,
          say: Say = lambda _: None, place: Place | None = None, timeout: float = START_TIMEOUT) -> dict[str, Any]:
    """Start an engine in the background (or find the running one) and wait until it is warm; its status."""
    place = place or default_place()
    running = status(place)
    if running is not None:
        say(f"an engine is already running (pid {running.get('pid')}, {running.get('master')})")
        return running
    place.directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    argv = [sys.executable, "-m", "kproxy.engine.server", "--master", master, "--idle-stop", str(idle_stop_min),
            "--dir", str(place.directory)]
    for name, value in (conf or {}).items():
        argv += ["--conf", f"{name}={value}"]
    with open(place.log_file, "ab") as log:
        process = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                   start_new_session=True)  # outlives this command and its terminal
    say(f"starting the engine (pid {process.pid}, {master}): Spark, then one small analysis to warm it")
    begun = time.monotonic()
    said = begun
    while time.monotonic() - begun < timeout:
        if process.poll() is not None:
            raise EngineError(f"the engine exited with status {process.returncode} while starting:\n"
                              + _tail(place.log_file))
        state = status(place)
        if state is not None and state.get("ready"):
            say(f"the engine is warm after {time.monotonic() - begun:.0f} s (pid {state['pid']}, log {place.log_file})")
            return state
        if time.monotonic() - said >= 10:
            said = time.monotonic()
            say(f"  still starting: {said - begun:.0f} s ...")
        time.sleep(0.5)
    process.terminate()
    raise EngineError(f"the engine was not ready after {timeout:.0f} s; stopped it. Its log:\n" + _tail(place.log_file))


def stop(place: Place | None = None, timeout: float = 60.0) -> dict[str, Any] | None:
    """Ask the running engine to stop and wait until it has; its last status, or None if none was running."""
    place = place or default_place()
    conn = _connect(place)
    if conn is None:
        status(place)  # clears what a dead engine left
        return None
    with conn:
        conn.send({"op": "status"})
        last = conn.recv()
    conn = _connect(place)
    if conn is not None:  # else it stopped between the two requests
        with conn:
            conn.send({"op": "stop"})
            conn.recv()
    deadline = time.monotonic() + timeout
    while pid_alive(last.get("pid")) and time.monotonic() < deadline:
        time.sleep(0.2)
    return last


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return f"(no log at {path})"
