"""Client adapters: one workload, several Kafka client libraries."""

from __future__ import annotations

from collections.abc import Mapping

from kproxy.workload.clients.base import ClientFactory


def client_factory(name: str, bootstrap: str, producer_overrides: Mapping[str, str],
                   consumer_overrides: Mapping[str, str], admin_overrides: Mapping[str, str] | None = None) -> ClientFactory:
    """The factory for a client library by name; each library is imported only when chosen."""
    if name == "confluent-kafka":
        from kproxy.workload.clients.confluent import ConfluentFactory

        return ConfluentFactory(bootstrap, producer_overrides, consumer_overrides, admin_overrides=admin_overrides or {})
    if name == "kafka-python":
        from kproxy.workload.clients.kafka_python import KafkaPythonFactory

        return KafkaPythonFactory(bootstrap, producer_overrides, consumer_overrides, admin_overrides=admin_overrides or {})
    if name == "java":
        from kproxy.workload.clients.java import JavaFactory

        return JavaFactory(bootstrap, producer_overrides, consumer_overrides, admin_overrides=admin_overrides or {})
    if name == "aiokafka":
        from kproxy.workload.clients.aiokafka_client import AiokafkaFactory

        return AiokafkaFactory(bootstrap, producer_overrides, consumer_overrides, admin_overrides=admin_overrides or {})
    if name == "franz-go":
        from kproxy.workload.clients.franz_go import FranzGoFactory

        return FranzGoFactory(bootstrap, producer_overrides, consumer_overrides, admin_overrides=admin_overrides or {})
    if name == "sarama":
        from kproxy.workload.clients.sarama import SaramaFactory

        return SaramaFactory(bootstrap, producer_overrides, consumer_overrides, admin_overrides=admin_overrides or {})
    raise ValueError(f"unknown client {name!r} (confluent-kafka, kafka-python, java, aiokafka, franz-go or sarama)")
