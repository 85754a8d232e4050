"""Apache Kafka itself: a KRaft cluster of one combined node or N on loopback (kproxy.kafka.kraft).

Its jars come from a Kafka download (`kafka_home`, or $KPROXY_KAFKA_HOME) or
from Maven Central through `mvn` into a per-version cache (docs/kafka.md).
The version is `version`, or $KPROXY_KAFKA_VERSION, or DEFAULT_VERSION.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from kproxy.brokers.process import BrokerError, EmbeddedBroker
from kproxy.kafka.jars import DEFAULT_VERSION, preflight
from kproxy.kafka.kraft import KafkaCluster, start_cluster

NAME = "kafka"
DESCRIPTION = "Apache Kafka (Maven Central or --kafka-home): KRaft, one combined node or N on loopback"
FIX = "install a JDK 17+ (openjdk-17-jdk-headless) and Maven (maven), or pass --kafka-home DIR of a Kafka download"


def default_version() -> str:
    return os.environ.get("KPROXY_KAFKA_VERSION") or DEFAULT_VERSION


def default_home() -> Path | None:
    home = os.environ.get("KPROXY_KAFKA_HOME")
    return Path(home) if home else None


def check(version: str | None = None, kafka_home: Path | None = None) -> str:
    """Java 17+ and a source of jars are here (in well under a second); the version that will run."""
    home = kafka_home or default_home()
    preflight(kafka_home=home, version=None if home else (version or default_version()))
    if home is not None:
        from kproxy.kafka.jars import from_home

        return from_home(home, version).version
    return version or default_version()


def binary() -> str:
    """Apache Kafka runs on the JVM: the `java` that will run it."""
    return preflight(kafka_home=default_home()).path


@dataclass
class KafkaBroker(EmbeddedBroker):
    """A KRaft cluster seen as one broker: `bootstrap` is its first node; `cluster` holds every node."""

    cluster: KafkaCluster | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.cluster is not None and all(n.alive() for n in self.cluster.nodes)

    def stop(self, timeout: float = 20.0) -> None:
        if self.cluster is not None:
            self.cluster.stop(timeout)


def start(
    host: str = "127.0.0.1",
    port: int = 0,
    *,
    advertise: str | None = None,
    advertise_port: int | None = None,
    log_path: Path | None = None,
    startup_timeout: float = 120.0,
    version: str | None = None,
    nodes: int = 1,
    kafka_home: Path | None = None,
    transaction_version: int | None | str = "default",
    say=lambda _: None,  # noqa: ANN001 - progress lines (jar downloads, formatting)
) -> KafkaBroker:
    """Start Apache Kafka; with `log_path`, storage and node logs go to `<its directory>/kafka/` (kept).

    advertise_port is for a single node only (each node advertises its own port).
    """
    if advertise_port not in (None, port) and nodes != 1:
        raise BrokerError("--advertise with another port works for a single Kafka node only")
    home = kafka_home or default_home()
    work_dir = log_path.parent / "kafka" if log_path is not None else None
    cluster = start_cluster(None if home and not version else (version or default_version()), nodes=nodes,
                            kafka_home=home, host=host, port=port, advertise=advertise,
                            advertise_port=advertise_port, work_dir=work_dir,
                            transaction_version=transaction_version, say=say, startup_timeout=startup_timeout)
    first = cluster.nodes[0]
    assert first.process is not None
    return KafkaBroker(host, first.port, first.process, first.log_path, NAME, cluster.version, cluster=cluster)
