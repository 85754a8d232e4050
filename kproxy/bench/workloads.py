"""The benchmark workloads: real confluent-kafka producers and consumers.

Each returns a `Sample` for one run against one bootstrap address. The same
function runs against the broker directly and through the proxy.
"""

from __future__ import annotations

import os
import time
import uuid
from dataclasses import dataclass, field

from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


# Settings every client of a run adds (`kproxy bench --tls`: SSL and the test CA).
_security: dict[str, object] = {}


def set_client_security(settings: dict[str, object]) -> None:
    """Make every client of the following runs use these settings (empty: plaintext)."""
    _security.clear()
    _security.update(settings)


@dataclass
class Sample:
    records: int
    bytes: int
    seconds: float
    latencies_ms: list[float] = field(default_factory=list)

    @property
    def records_per_s(self) -> float:
        return self.records / self.seconds if self.seconds else 0.0

    @property
    def mib_per_s(self) -> float:
        return self.bytes / self.seconds / 1048576 if self.seconds else 0.0


def create_topic(bootstrap: str, partitions: int = 1) -> str:
    name = f"bench-{uuid.uuid4().hex[:10]}"
    admin = AdminClient({"bootstrap.servers": bootstrap, **_security})
    for f in admin.create_topics([NewTopic(name, partitions, 1)], operation_timeout=15).values():
        f.result(20)
    return name


def _producer(bootstrap: str, **config: object) -> Producer:
    return Producer({"bootstrap.servers": bootstrap, "acks": "all", "enable.idempotence": True, **_security, **config})


def produce(bootstrap: str, topic: str, count: int, size: int, linger_ms: int, batch_bytes: int) -> Sample:
    """Produce `count` records of `size` bytes as fast as the client can, acks=all."""
    producer = _producer(
        bootstrap, **{"linger.ms": linger_ms, "batch.size": batch_bytes, "queue.buffering.max.messages": 1_000_000}
    )
    payload = os.urandom(size)
    failures: list[object] = []

    def on_delivery(err: object, msg: object) -> None:
        if err is not None:
            failures.append(err)

    start = time.perf_counter()
    for i in range(count):
        while True:
            try:
                producer.produce(topic, value=payload, key=b"%d" % (i % 64), on_delivery=on_delivery)
                break
            except BufferError:
                producer.poll(0.001)
        producer.poll(0)
    remaining = producer.flush(60)
    seconds = time.perf_counter() - start
    if remaining or failures:
        raise RuntimeError(f"produce failed: {len(failures)} errors, {remaining} undelivered ({failures[:1]})")
    return Sample(count, count * size, seconds)


def consume(bootstrap: str, topic: str, count: int, passes: int = 3) -> Sample:
    """Read `count` records from offset 0, `passes` times, each with a fresh assigned consumer.

    Each pass is timed from its first record to its last: throughput is the
    steady-state transfer rate, not the consumer's start-up (bootstrap,
    metadata, first connection), which would otherwise be a large share of a
    pass this short. A fresh consumer per pass, rather than a seek back,
    because a consumer at the end of the log has a Fetch parked at the broker
    for fetch.wait.max.ms, and waiting it out would be timed too.
    """
    got = 0
    nbytes = 0
    seconds = 0.0
    for _ in range(passes):
        read, size, elapsed = _consume_pass(bootstrap, topic, count)
        got += read
        nbytes += size
        seconds += elapsed
    return Sample(got, nbytes, seconds)


def _consume_pass(bootstrap: str, topic: str, count: int) -> tuple[int, int, float]:
    consumer = Consumer(
        {
            "bootstrap.servers": bootstrap,
            "group.id": f"bench-{uuid.uuid4().hex[:6]}",
            "enable.auto.commit": False,
            "fetch.max.bytes": 16 * 1048576,
            "max.partition.fetch.bytes": 8 * 1048576,
            **_security,
        }
    )
    consumer.assign([TopicPartition(topic, 0, 0)])
    read = 0
    nbytes = 0
    first = last = 0.0
    deadline = time.perf_counter() + 120
    try:
        while read < count and time.perf_counter() < deadline:
            for msg in consumer.consume(10000, 0.5):
                if msg.error() is None:
                    if not read:
                        first = time.perf_counter()
                    read += 1
                    nbytes += len(msg.value() or b"")
            last = time.perf_counter()
    finally:
        consumer.close()
    if read < count:
        raise RuntimeError(f"consume read {read} of {count} records")
    return read, nbytes, last - first


def fixed_rate_latency(bootstrap: str, topic: str, rate: int, seconds: float, size: int = 100) -> Sample:
    """Send at a fixed, moderate rate; record each record's send-to-ack latency."""
    producer = _producer(bootstrap, **{"linger.ms": 0})
    payload = os.urandom(size)
    latencies: list[float] = []
    failures: list[object] = []

    def on_delivery(sent: float):  # noqa: ANN202
        def done(err: object, msg: object) -> None:
            if err is not None:
                failures.append(err)
            else:
                latencies.append((time.perf_counter() - sent) * 1000.0)

        return done

    # Warm the connections so connection set-up is not measured.
    producer.produce(topic, value=payload)
    producer.flush(10)
    interval = 1.0 / rate
    count = int(rate * seconds)
    start = time.perf_counter()
    for i in range(count):
        target = start + i * interval
        while (now := time.perf_counter()) < target:
            producer.poll(min(target - now, 0.001))
        producer.produce(topic, value=payload, on_delivery=on_delivery(time.perf_counter()))
        producer.poll(0)
    producer.flush(30)
    elapsed = time.perf_counter() - start
    if failures:
        raise RuntimeError(f"fixed-rate produce failed: {failures[:1]}")
    return Sample(count, count * size, elapsed, latencies)
