"""The final read: after an application stops, read back everything it wrote, through the proxy.

A verdict derived from the wire can only call a write lost if some consumer
read past it. Many applications never read their own output, so `kproxy
test` ends the run as Jepsen does: a fresh read_committed consumer, in no
group, assigns every partition the run wrote to from offset 0 and reads
until its position reaches each partition's end (or the time runs out). It
connects through the proxy, so the trace holds what it was delivered; its
client id, FINAL_READER, is how the analysis (kproxy_spark.derived) knows
these reads close the history.
"""

from __future__ import annotations

import time
from collections.abc import Iterable
from dataclasses import dataclass

from kproxy.testing.client_ids import FINAL_READER


@dataclass(frozen=True)
class FinalReadResult:
    partitions: int
    records: int
    caught_up: bool
    lagging: tuple[str, ...]  # "topic[partition]" not read to its end in time


def user_topics(bootstrap: str) -> set[str]:
    """The cluster's topics, less Kafka's own (`__consumer_offsets`, `__transaction_state`, ...)."""
    from confluent_kafka.admin import AdminClient

    topics = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=15).topics
    return {name for name in topics if not name.startswith("__")}


def final_read(bootstrap: str, topics: Iterable[str], timeout: float = 30.0,
               config: dict[str, str] | None = None) -> FinalReadResult:
    """Read every partition of `topics` from offset 0 to its end (read_committed), through `bootstrap`."""
    from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaError, TopicPartition

    consumer = Consumer({
        **(config or {}),
        "bootstrap.servers": bootstrap,
        "client.id": FINAL_READER,
        "group.id": f"{FINAL_READER}-{time.time_ns()}",  # assign() needs one; nothing is committed to it
        "enable.auto.commit": False,
        "isolation.level": "read_committed",
        "enable.partition.eof": True,
    })
    deadline = time.monotonic() + timeout
    records = 0
    try:
        metadata = consumer.list_topics(timeout=max(1.0, deadline - time.monotonic()))
        wanted = [TopicPartition(topic, p, OFFSET_BEGINNING) for topic in sorted(set(topics))
                  if topic in metadata.topics for p in sorted(metadata.topics[topic].partitions)]
        ends: dict[tuple[str, int], int] = {}
        for tp in wanted:
            _, high = consumer.get_watermark_offsets(tp, timeout=max(1.0, deadline - time.monotonic()))
            ends[(tp.topic, tp.partition)] = high
        pending = {tp for tp, high in ends.items() if high > 0}
        consumer.assign(wanted)
        while pending and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            where = (message.topic(), message.partition())
            if message.error() is None:
                records += 1
            elif message.error().code() != KafkaError._PARTITION_EOF:
                continue
            position = consumer.position([TopicPartition(*where)])[0].offset
            if where in pending and (message.error() is not None or position >= ends[where]):
                pending.discard(where)
        return FinalReadResult(len(wanted), records, not pending,
                               tuple(f"{topic}[{partition}]" for topic, partition in sorted(pending)))
    finally:
        consumer.close()
