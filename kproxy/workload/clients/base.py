"""The client adapter interface: what the workload needs from a Kafka client library.

Each library of `kproxy.workload.config.CLIENTS` implements it (confluent-kafka,
kafka-python and aiokafka in Python; Kafka's Java client, franz-go and Sarama
behind the JSON-lines bridge of clients/bridge.py); the workload is written
once against this interface. Adapters raise `ClientFailure` (see
`kproxy.workload.errors`) for every library error, so classification never
depends on the library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from kproxy.workload.errors import ClientFailure

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class Record:
    """One record a consumer returned."""

    topic: str
    partition: int
    offset: int
    key: bytes | None
    value: bytes | None


class Delivery:
    """The pending outcome of one send: an offset, or a failure."""

    def __init__(self) -> None:
        self.done = False
        self.offset: int | None = None
        self.failure: ClientFailure | None = None

    def succeed(self, offset: int | None) -> None:
        self.done, self.offset = True, offset

    def fail(self, failure: ClientFailure) -> None:
        self.done, self.failure = True, failure


class ProducerClient(Protocol):
    def send(self, topic: str, partition: int, key: bytes, value: bytes) -> Delivery: ...

    def flush(self, timeout: float) -> None:
        """Wait until every send so far has a delivery outcome (or the timeout passed)."""

    def init_transactions(self, timeout: float) -> None: ...

    def begin_transaction(self) -> None: ...

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], consumer: ConsumerClient,
                                    timeout: float) -> None: ...

    def commit_transaction(self, timeout: float) -> None: ...

    def abort_transaction(self, timeout: float) -> None: ...

    def close(self, clean: bool, timeout: float) -> None:
        """clean=False tears the client down without flushing or finishing anything (a crash)."""


class ConsumerClient(Protocol):
    def assign(self, partitions: Sequence[TopicPartition], offsets: Mapping[TopicPartition, int] | None = None) -> None:
        """Read exactly these partitions; `offsets` start some of them at a given offset."""

    def subscribe(self, topics: Sequence[str]) -> None: ...

    def poll(self, max_records: int, timeout: float) -> list[Record]: ...

    def positions(self) -> dict[TopicPartition, int]:
        """Next offset to read of every partition the consumer holds and has a position for."""

    def commit(self, offsets: Mapping[TopicPartition, int], timeout: float) -> None: ...

    def committed(self, partitions: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int | None]: ...

    def assignment(self) -> list[TopicPartition]: ...

    def seek(self, partition: TopicPartition, offset: int) -> None: ...

    def close(self, clean: bool, timeout: float) -> None: ...


class ClientFactory(Protocol):
    """Builds a library's clients with the workload's safe defaults and the user's overrides."""

    name: str

    def producer(self, client_id: str, transactional_id: str | None) -> ProducerClient: ...

    def consumer(self, client_id: str, group_id: str) -> ConsumerClient: ...

    def create_topics(self, topics: Sequence[tuple[str, int]], timeout: float) -> None:
        """Create (topic, partitions) pairs; a topic that already exists is fine."""


def parse_setting(text: str) -> tuple[str, str]:
    """`KEY=VALUE` from the command line."""
    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise ValueError(f"expected KEY=VALUE, got {text!r}")
    return key.strip(), value.strip()
