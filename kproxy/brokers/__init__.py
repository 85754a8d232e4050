"""Brokers kproxy can start: one module per kind (tansu, noida, kafka), named in KINDS.

A kind's module defines NAME, DESCRIPTION, FIX (how to install what it needs),
`check() -> version` (does its binary run here; raises BrokerError naming the
fix, in under a second) and `start(host, port, *, advertise, advertise_port,
log_path, startup_timeout, **kind options) -> EmbeddedBroker`. Adding a kind
is one module and one line in KINDS.

Used by `kproxy broker`, `kproxy demo`, `kproxy bench` and the tests.
"""

from __future__ import annotations

import contextlib
import importlib
from collections.abc import Iterator
from types import ModuleType
from typing import Any

from kproxy.brokers.process import BrokerError, EmbeddedBroker, free_port, stop_process, wait_for_port

KINDS: dict[str, str] = {
    "tansu": "kproxy.brokers.tansu",
    "noida": "kproxy.brokers.noida",
    "kafka": "kproxy.brokers.kafka",
}
DEFAULT_KIND = "tansu"

__all__ = [
    "BrokerError", "EmbeddedBroker", "KINDS", "DEFAULT_KIND", "kind_module", "check_broker",
    "start_broker", "running_broker", "free_port", "stop_process", "wait_for_port",
]


def kind_module(kind: str) -> ModuleType:
    if kind not in KINDS:
        raise BrokerError(f"unknown broker kind {kind!r}; choose one of: {', '.join(KINDS)}")
    return importlib.import_module(KINDS[kind])


def check_broker(kind: str = DEFAULT_KIND) -> str:
    """The version of `kind`'s binary, once it has been seen to run here (BrokerError otherwise)."""
    return kind_module(kind).check()


def start_broker(host: str = "127.0.0.1", port: int = 0, *, kind: str = DEFAULT_KIND, **options: Any) -> EmbeddedBroker:
    """Start a broker of `kind` on host:port (port 0 picks a free one); see the kind's `start`."""
    return kind_module(kind).start(host, port, **options)


@contextlib.contextmanager
def running_broker(**kwargs: Any) -> Iterator[EmbeddedBroker]:
    broker = start_broker(**kwargs)
    try:
        yield broker
    finally:
        broker.stop()
