"""Client adapters: one workload, several Kafka client libraries."""

from __future__ import annotations

import importlib
from collections.abc import Mapping

from kproxy.workload.clients.base import ClientFactory

#: client name (kproxy.workload.config.CLIENTS) -> (module, factory class); a library is imported only when chosen.
FACTORIES: dict[str, tuple[str, str]] = {
    "confluent-kafka": ("kproxy.workload.clients.confluent", "ConfluentFactory"),
    "kafka-python": ("kproxy.workload.clients.kafka_python", "KafkaPythonFactory"),
    "java": ("kproxy.workload.clients.java", "JavaFactory"),
    "aiokafka": ("kproxy.workload.clients.aiokafka_client", "AiokafkaFactory"),
    "franz-go": ("kproxy.workload.clients.franz_go", "FranzGoFactory"),
    "sarama": ("kproxy.workload.clients.sarama", "SaramaFactory"),
}


def client_factory(name: str, bootstrap: str, producer_overrides: Mapping[str, str],
                   consumer_overrides: Mapping[str, str], admin_overrides: Mapping[str, str] | None = None) -> ClientFactory:
    """The factory for a client library by name."""
    if name not in FACTORIES:
        raise ValueError(f"unknown client {name!r} ({', '.join(FACTORIES)})")
    module, factory = FACTORIES[name]
    return getattr(importlib.import_module(module), factory)(
        bootstrap, producer_overrides, consumer_overrides, admin_overrides=admin_overrides or {})
