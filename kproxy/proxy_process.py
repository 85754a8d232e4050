"""Start `kproxy run` as a child process (bench, demo and tests use it)."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from kproxy.brokers import BrokerError, free_port, stop_process, wait_for_port
from kproxy.brokers.process import free_port_block, spawn

if TYPE_CHECKING:
    from kproxy.io.tls import UpstreamTls


@dataclass(frozen=True)
class UpstreamTlsFiles:
    """TLS towards brokers as `kproxy run --upstream-tls` is told it: the files, passed on to a proxy
    started as a child process, and the settings they make, for kproxy's own connections to the
    cluster (identifying the broker before a run)."""

    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None
    skip_hostname_check: bool = False

    def run_args(self) -> list[str]:
        """The `kproxy run` options that say the same."""
        args = ["--upstream-tls"]
        for option, path in (("--upstream-ca", self.ca), ("--upstream-cert", self.cert), ("--upstream-key", self.key)):
            if path is not None:
                args += [option, str(Path(path).absolute())]
        if self.skip_hostname_check:
            args.append("--upstream-skip-hostname-check")
        return args

    def settings(self) -> UpstreamTls:
        """The TLS context; TlsConfigError naming the file when one cannot be used."""
        from kproxy.io.tls import client_context

        return client_context(self.ca, self.cert, self.key, check_hostname=not self.skip_hostname_check)


@dataclass
class ProxyProcess:
    listen_port: int
    admin_port: int | None
    process: subprocess.Popen[bytes]
    log_path: Path | None
    host: str = "127.0.0.1"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.listen_port}"

    @property
    def admin_url(self) -> str:
        return f"http://{self.host}:{self.admin_port}"

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_text(self) -> str:
        return self.log_path.read_text(errors="replace") if self.log_path and self.log_path.exists() else ""

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 15.0) -> int | None:
        return stop_process(self.process, sig, timeout)


#: Tries of start_proxy when another process took one of its ports between their pick and the bind.
START_ATTEMPTS = 3


def start_proxy(
    upstream: str,
    *extra_args: str,
    log_path: Path | None = None,
    admin: bool = True,
    host: str = "127.0.0.1",
    admin_bind: str | None = None,
    startup_timeout: float = 20.0,
) -> ProxyProcess:
    """Run `kproxy run --upstream UPSTREAM` on free ports; returns once it listens.

    The admin API binds `admin_bind` (default: `host`); it is always reached at `host`.
    A free port can be taken by another process before the proxy binds it (tests and
    demos start several at once): a proxy that exits saying so, or whose admin port
    another process answers on, is started again on other ports, up to
    START_ATTEMPTS times in all. It is seen by its admin port, which it opens after
    its listeners and which names it (`/healthz`'s proxy_id: the one given with
    --proxy-id, else one made here in the proxy's own default form); without one,
    a listen port another process answers on passes for the proxy's.
    """
    attempt = 1
    while True:
        # The bootstrap listener and the per-broker listeners (by default listen
        # port + 1 + node id) come from one run of free ports.
        listen_port = free_port_block(host)
        admin_port = free_port(host) if admin else None
        cmd = [sys.executable, "-m", "kproxy", "run", "--upstream", upstream, "--listen", f"{host}:{listen_port}"]
        cmd += ["--admin", f"{admin_bind or host}:{admin_port}"] if admin else ["--no-admin"]
        proxy_id = given_proxy_id(extra_args)
        if proxy_id is None:
            # Named here, as the proxy would name itself, so that its admin API can be told from another
            # process's. (Imported here: the proxy's configuration pulls in the protocol's schemas.)
            from kproxy.io.config import new_proxy_id

            proxy_id = new_proxy_id()
            cmd += ["--proxy-id", proxy_id]
        cmd += list(extra_args)
        logged = log_path.stat().st_size if log_path is not None and log_path.exists() else 0
        proc = spawn(cmd, log_path, env=dict(os.environ))
        handle = ProxyProcess(listen_port, admin_port, proc, log_path, host)
        try:
            wait_for_port(host, listen_port, startup_timeout, proc)
            if admin_port:
                wait_for_port(host, admin_port, startup_timeout, proc)
                answered_by = admin_proxy_id(host, admin_port)
                if answered_by != proxy_id:
                    # Another process took the admin port between its pick and the proxy's bind, and
                    # answers there; this proxy is failing to bind it, or soon will.
                    raise PortTakenError(f"{host}:{admin_port} is answered by another process "
                                         f"({answered_by or 'not a kproxy admin API'})")
            if proc.poll() is not None:  # what answered was another process on the port it could not bind
                raise BrokerError(f"the process exited with status {proc.returncode}")
        except BrokerError as exc:
            handle.stop(signal.SIGKILL)
            said = log_path.read_bytes()[logged:].decode(errors="replace") if log_path is not None else ""
            taken = isinstance(exc, PortTakenError) or "Address already in use" in said
            if taken and attempt < START_ATTEMPTS:
                attempt += 1
                continue
            raise RuntimeError(f"kproxy did not start: {exc}\n{said[-3000:]}") from None
        return handle


class PortTakenError(BrokerError):
    """Another process answers on a port the proxy was started on."""


def admin_proxy_id(host: str, port: int, timeout: float = 5.0) -> str | None:
    """The proxy_id the admin API at host:port gives in /healthz (answered while it starts too, with
    status 503); None when what answers there is not a kproxy admin API."""
    import httpx

    try:
        said = httpx.get(f"http://{host}:{port}/healthz", timeout=timeout, trust_env=False).json()
    except (httpx.HTTPError, ValueError):
        return None
    return said.get("proxy_id") if isinstance(said, dict) and isinstance(said.get("proxy_id"), str) else None


def given_proxy_id(args: tuple[str, ...]) -> str | None:
    """The --proxy-id among `kproxy run` arguments, if any."""
    for i, arg in enumerate(args):
        if arg == "--proxy-id" and i + 1 < len(args):
            return args[i + 1]
        if arg.startswith("--proxy-id="):
            return arg.split("=", 1)[1]
    return None


@contextlib.contextmanager
def running_proxy(upstream: str, *extra_args: str, **kwargs: object) -> Iterator[ProxyProcess]:
    proxy = start_proxy(upstream, *extra_args, **kwargs)  # type: ignore[arg-type]
    try:
        yield proxy
    finally:
        proxy.stop()
