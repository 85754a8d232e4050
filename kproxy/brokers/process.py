"""What every broker kind shares: a child process, its ports, its clean stop.

The one place that starts a server kproxy runs as a child (a broker of any
kind, a Kafka node, HAProxy in front of one, `kproxy run` itself) with its
output appended to a log file, waits for its ports, and stops it: SIGTERM,
then SIGKILL after a grace period.
"""

from __future__ import annotations

import contextlib
import logging
import os
import random
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from kproxy.protocol.endpoints import parse_endpoint

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """A broker could not be found, does not run here, or did not come up."""


def pid_alive(pid: object) -> bool:
    """Whether a process of this pid runs (one of another user's counts); anything but an int is no process.

    A zombie (exited, not yet waited for by its parent) is not running: a lock
    or a state file naming it belongs to no one."""
    if not isinstance(pid, int):
        return False
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat", "rb") as stat:
            state = stat.read().rsplit(b")", 1)[1].split(None, 1)[0]
    except (OSError, IndexError):
        return True  # no /proc here: the signal's answer stands
    return state != b"Z"


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out; good enough for tests and demos."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_range_start() -> int:
    try:
        return int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768


def free_port_block(host: str = "127.0.0.1", size: int = 257, attempts: int = 200) -> int:
    """The first of `size` consecutive ports that all bind right now.

    The proxy listens on one port and on `base + node id` per broker, so it
    needs a run of ports, not one. The run is taken below the kernel's
    ephemeral range: an ephemeral port can be handed to any outgoing
    connection a moment later (a client's, a broker's), which then holds the
    port a broker listener needs."""
    top = _ephemeral_range_start() - size
    for _ in range(attempts):
        start = random.randint(10000, max(10000, top))
        if all(_binds(host, port) for port in range(start, start + size)):
            return start
    raise BrokerError(f"no run of {size} free ports on {host} below {top + size}")


def _binds(host: str, port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def host_port(address: str) -> tuple[str, int]:
    """One HOST:PORT to connect to (kproxy.protocol.endpoints.parse_endpoint, a host required)."""
    try:
        endpoint = parse_endpoint(address, default_host=None)
    except ValueError:
        raise BrokerError(f"{address.strip()!r} is not HOST:PORT") from None
    return endpoint.host, endpoint.port


def unreachable(bootstrap: str, timeout: float = 5.0) -> str | None:
    """None when some address of a bootstrap list (HOST:PORT,...) accepts a TCP connection, else what each said."""
    said = []
    for address in (a.strip() for a in bootstrap.split(",") if a.strip()):
        try:
            with socket.create_connection(host_port(address), timeout=timeout):
                return None
        except BrokerError as exc:
            said.append(str(exc))
        except OSError as exc:
            said.append(f"{address}: {exc.strerror or exc}")
    return "; ".join(said) or f"no address in {bootstrap!r}"


def wait_for_port(host: str, port: int, timeout: float, process: subprocess.Popen[bytes] | None = None) -> None:
    """Return once host:port accepts connections; give up early if `process` exits."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if process is not None and process.poll() is not None:
                raise BrokerError(f"the process exited with status {process.returncode} before listening on {host}:{port}") from None
            if time.monotonic() > deadline:
                raise BrokerError(f"nothing is listening on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.05)


def spawn(
    cmd: Sequence[str],
    log_path: Path | None,
    *,
    env: dict[str, str] | None = None,
    new_session: bool = False,
    stdin: int | IO[bytes] | None = None,
) -> subprocess.Popen[bytes]:
    """Start `cmd` with its output and errors appended to `log_path` (discarded without one).

    new_session: the child gets a session of its own, so a Ctrl-C at the
    terminal reaches kproxy alone, which then stops the child in order.
    """
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL  # noqa: SIM115 - the child holds it; closed below
    try:
        return subprocess.Popen(list(cmd), stdout=out, stderr=subprocess.STDOUT, env=env, stdin=stdin,
                                start_new_session=new_session)
    finally:
        if log_path:
            out.close()  # type: ignore[union-attr]


def wait_or_kill(process: subprocess.Popen[bytes], timeout: float, kill_wait: float | None = None) -> bool:
    """Wait up to `timeout` for a process told to stop; kill it if it has not (then wait `kill_wait`,
    default `timeout`). True when it had to be killed."""
    try:
        process.wait(timeout)
    except subprocess.TimeoutExpired:
        process.kill()
        process.wait(timeout if kill_wait is None else kill_wait)
        return True
    return False


def stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 5.0) -> int | None:
    """Ask a child process to stop with `sig`; kill it if it has not within `timeout`."""
    if process.poll() is None:
        process.send_signal(sig)
        wait_or_kill(process, timeout)
    return process.returncode


@contextlib.contextmanager
def running_process(cmd: Sequence[str], log_path: Path | None, host: str, ports: Sequence[int],
                    timeout: float) -> Iterator[subprocess.Popen[bytes]]:
    """A server process for the length of a `with` block, once every one of `ports` on `host` listens."""
    process = spawn(cmd, log_path)
    try:
        for port in ports:
            wait_for_port(host, port, timeout)
        yield process
    finally:
        stop_process(process)


@dataclass
class EmbeddedBroker:
    """A broker process kproxy started, of one kind (see kproxy.brokers.KINDS)."""

    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path | None
    kind: str = "tansu"
    version: str | None = None
    # Removed after the process stopped (a broker's temporary storage).
    scratch_dirs: list[Path] = field(default_factory=list)
    # The signal that stops this kind at once (kproxy.brokers.tansu: SIGTERM waits out a grace period).
    stop_signal: int = signal.SIGTERM

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        stop_process(self.process, self.stop_signal, timeout=timeout)
        for directory in self.scratch_dirs:
            shutil.rmtree(directory, ignore_errors=True)


def launch(
    kind: str,
    cmd: list[str],
    host: str,
    port: int,
    *,
    log_path: Path | None,
    env: dict[str, str] | None = None,
    startup_timeout: float,
    version: str | None = None,
    scratch_dirs: list[Path] | None = None,
    stop_signal: int = signal.SIGTERM,
) -> EmbeddedBroker:
    """Run `cmd` in its own session, its output to `log_path`, and wait until host:port listens;
    `stop_signal` is what EmbeddedBroker.stop sends it."""
    proc = spawn(cmd, log_path, env=env, new_session=True)
    broker = EmbeddedBroker(host, port, proc, log_path, kind, version, list(scratch_dirs or ()), stop_signal)
    try:
        wait_for_port(host, port, startup_timeout, proc)
    except BrokerError as exc:
        broker.stop()
        raise BrokerError(f"the {kind} broker did not start on {host}:{port}: {exc} (see {log_path or 'its output'})") from None
    log.info("%s broker listening on %s:%d", kind, host, port)
    return broker
