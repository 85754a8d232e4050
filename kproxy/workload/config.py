"""What a workload run is asked to do; one frozen value shared by every worker."""

from __future__ import annotations

import uuid
from dataclasses import dataclass, field
from typing import Mapping

CLIENTS = ("confluent-kafka", "kafka-python", "java", "aiokafka", "franz-go", "sarama")


def _default_prefix() -> str:
    # Fresh topics per run: reusing a topic would let old records into the final reads.
    return f"kproxy-{uuid.uuid4().hex[:8]}"


@dataclass(frozen=True)
class WorkloadConfig:
    """A queue workload run. Defaults are the safe settings (see docs/workload.md)."""

    bootstrap: str
    client: str = "confluent-kafka"
    concurrency: int = 3
    duration: float | None = 10.0  # seconds; None: bounded by `ops` only
    ops: int | None = None  # invocations by the workers; None: bounded by `duration` only
    seed: int = 0
    txn: bool = False
    subscribe: bool = False
    abort_probability: float = 0.0
    rewind_on_abort: bool = False
    crash_probability: float = 0.02
    reassign_probability: float = 0.1
    key_count: int = 4  # keys in play at once
    max_writes_per_key: int = 32  # a key is retired after this many sends
    max_txn_length: int = 4  # micro-ops per send/txn operation
    partitions_per_topic: int = 1  # 1: a topic per key; N: keys spread over N partitions of a topic
    topic_prefix: str = field(default_factory=_default_prefix)
    group_id: str | None = None  # default: <topic_prefix>-group
    poll_timeout: float = 0.1  # seconds one poll micro-op waits for records
    max_poll_records: int = 100
    op_timeout: float = 5.0  # seconds for flush, commit, abort and other blocking calls
    final_reads_timeout: float = 10.0  # seconds the final reads may take to catch up
    # Settings of every client the run makes (producers, consumers, the admin client that creates
    # topics): what a secured cluster needs (security.protocol, SASL, CA); the two below win over it.
    client_config: Mapping[str, str] = field(default_factory=dict)
    producer_config: Mapping[str, str] = field(default_factory=dict)
    consumer_config: Mapping[str, str] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.client not in CLIENTS:
            raise ValueError(f"client must be one of {', '.join(CLIENTS)}, got {self.client!r}")
        if self.duration is None and self.ops is None:
            raise ValueError("bound the run with a duration, an op count, or both")
        if self.concurrency < 1 or self.key_count < 1 or self.max_writes_per_key < 1:
            raise ValueError("concurrency, key_count and max_writes_per_key must be at least 1")
        if self.max_txn_length < 1 or self.partitions_per_topic < 1:
            raise ValueError("max_txn_length and partitions_per_topic must be at least 1")
        for name in ("abort_probability", "crash_probability", "reassign_probability"):
            p = getattr(self, name)
            if not 0.0 <= p <= 1.0:
                raise ValueError(f"{name} must be within [0, 1], got {p}")
        if self.abort_probability and not self.txn:
            raise ValueError("abort_probability needs transactional mode (txn=True)")
        if self.rewind_on_abort and not self.txn:
            raise ValueError("rewind_on_abort needs transactional mode (txn=True)")

    @property
    def consumer_group(self) -> str:
        return self.group_id or f"{self.topic_prefix}-group"

    def transactional_id(self, worker: int) -> str:
        # Per worker, not per process: a worker's replacement client fences its
        # crashed predecessor, so a transaction left open cannot pin the LSO.
        return f"{self.topic_prefix}-txn-{worker}"
