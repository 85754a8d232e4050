"""A reference proxy measured in the same run: HAProxy in TCP mode.

The targets are ratios to a direct connection, and on a small machine any
extra hop costs something (the broker, the clients and the proxy share the
cores, and on loopback the sender pays for the receiver's TCP work). HAProxy,
a mature C proxy that only copies bytes, shows what a hop costs here before
any Kafka awareness, so kproxy's figures can be read against it.

A TCP proxy does not rewrite broker addresses, so HAProxy gets a broker of
its own: a second embedded broker that advertises HAProxy's port, so every
connection after bootstrap goes through HAProxy too (as every connection goes
through kproxy). The two brokers are the same binary, both empty at start;
the same workloads write the records each path reads.
"""

from __future__ import annotations

import contextlib
import shutil
from collections.abc import Iterator, Sequence
from contextlib import AbstractContextManager
from pathlib import Path

from kproxy.brokers import BrokerError, free_port, start_broker
from kproxy.brokers.process import running_process

# What every HAProxy kproxy runs shares: TCP mode, Kafka-length client and server timeouts.
HAPROXY_GLOBALS = """\
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 5s
    timeout client 120s
    timeout server 120s
"""

HAPROXY_CONFIG = HAPROXY_GLOBALS + """\
frontend kafka
    bind {host}:{port}
    default_backend broker
backend broker
    server broker {host}:{broker_port}
"""


def haproxy_binary() -> str:
    path = shutil.which("haproxy")
    if path is None:
        raise BrokerError("the reference path needs HAProxy: install Debian's haproxy package (apt-get install haproxy)")
    return path


def running_haproxy(config: Path, log_path: Path, host: str, ports: Sequence[int]) -> AbstractContextManager[object]:
    """HAProxy with `config` while a `with` block lasts, once every one of `ports` listens."""
    # -db: stay in the foreground, so stopping this process stops HAProxy.
    return running_process([haproxy_binary(), "-db", "-f", str(config)], log_path, host, ports, 10.0)


@contextlib.contextmanager
def haproxy_path(work: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """A second embedded broker behind HAProxy; yields the bootstrap address clients use."""
    haproxy_binary()  # missing: fail before the broker starts
    port = free_port(host)
    broker = start_broker(host, advertise=host, advertise_port=port, log_path=work / "broker-haproxy.log")
    try:
        config = work / "haproxy.cfg"
        config.write_text(HAPROXY_CONFIG.format(host=host, port=port, broker_port=broker.port))
        with running_haproxy(config, work / "haproxy.log", host, [port]):
            yield f"{host}:{port}"
    finally:
        broker.stop()
