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
import subprocess
from collections.abc import Iterator
from pathlib import Path

from kproxy.brokers import BrokerError, free_port, start_broker, stop_process, wait_for_port

HAPROXY_CONFIG = """\
global
    maxconn 4096
defaults
    mode tcp
    timeout connect 5s
    timeout client 120s
    timeout server 120s
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


@contextlib.contextmanager
def haproxy_path(work: Path, host: str = "127.0.0.1") -> Iterator[str]:
    """A second embedded broker behind HAProxy; yields the bootstrap address clients use."""
    binary = haproxy_binary()
    port = free_port(host)
    broker = start_broker(host, advertise=host, advertise_port=port, log_path=work / "broker-haproxy.log")
    try:
        config = work / "haproxy.cfg"
        config.write_text(HAPROXY_CONFIG.format(host=host, port=port, broker_port=broker.port))
        with open(work / "haproxy.log", "ab") as log:
            # -db: stay in the foreground, so stopping this process stops HAProxy.
            process = subprocess.Popen([binary, "-db", "-f", str(config)], stdout=log, stderr=subprocess.STDOUT)
        try:
            wait_for_port(host, port, 10.0)
            yield f"{host}:{port}"
        finally:
            stop_process(process)
    finally:
        broker.stop()
