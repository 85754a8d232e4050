"""noida-db, a single binary that speaks Kafka among other protocols (PyPI, MIT).

Pinned in pyproject.toml to a version whose binary runs on Debian 12:
0.2.3's wheel claims manylinux_2_17 but its binary needs glibc 2.39, so pip
would pick it here and it would fail at start. Only its Kafka service runs,
on a temporary data directory removed when it stops.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

from kproxy.brokers.process import BrokerError, EmbeddedBroker, free_port, launch

NAME = "noida"
DESCRIPTION = "noida-db 0.2.2 (PyPI): single node, Kafka service only, temporary data directory"
PINNED = "0.2.2"
FIX = f"pip install 'noida-db=={PINNED}' (0.2.0-0.2.2 run on Debian 12; 0.2.3's binary needs glibc 2.39)"


def binary() -> str:
    """The noida-db executable inside the installed wheel ($NOIDA_DB_BIN overrides)."""
    override = os.environ.get("NOIDA_DB_BIN")
    if override:
        if not (os.path.isfile(override) and os.access(override, os.X_OK)):
            raise BrokerError(f"NOIDA_DB_BIN={override!r} is not an executable file. Fix: {FIX}")
        return override
    try:
        from importlib.resources import files

        import noida_db  # noqa: F401 - only to find the wheel's files
    except ImportError:
        found = shutil.which("noida-db", path=os.path.dirname(sys.executable) + os.pathsep + os.environ.get("PATH", ""))
        if found is None:
            raise BrokerError(f"noida-db is not installed. Fix: {FIX}") from None
        return found
    path = files("noida_db").joinpath("noida-db")
    if not path.is_file():
        raise BrokerError(f"the noida-db wheel has no binary at {path}. Fix: {FIX}")
    if not os.access(str(path), os.X_OK):
        os.chmod(str(path), 0o755)  # the wheel's own launcher does the same
    return str(path)


def check() -> str:
    """Run `noida-db version`; return the version, or raise BrokerError naming the fix."""
    from kproxy.brokers.preflight import run_version

    return run_version(NAME, [binary(), "version"], FIX, prefix="noida-db ")


def start(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    advertise: str | None = None,
    advertise_port: int | None = None,
    log_path: Path | None = None,
    startup_timeout: float = 15.0,
    data_dir: Path | None = None,
) -> EmbeddedBroker:
    """Start noida-db's Kafka service on host:port (port 0 picks a free one).

    noida-db advertises the address it binds and has no option to advertise
    another, so `advertise` must be the listening host (or None).
    """
    if (advertise not in (None, host)) or (advertise_port not in (None, port)):
        raise BrokerError(
            f"noida-db advertises the address it listens on ({host}); it cannot advertise "
            f"{advertise or host}:{advertise_port or port}. Use --kind tansu for that."
        )
    version = check()
    port = port or free_port(host)
    scratch: list[Path] = []
    if data_dir is None:
        data_dir = Path(tempfile.mkdtemp(prefix="kproxy-noida-"))
        scratch.append(data_dir)
    cmd = [binary(), "start", "--only", "kafka", "--host", host, "--kafka-port", str(port), "--data-dir", str(data_dir)]
    return launch(NAME, cmd, host, port, log_path=log_path, env=dict(os.environ),
                  startup_timeout=startup_timeout, version=version, scratch_dirs=scratch)
