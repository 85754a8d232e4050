"""One transactional round trip through a Kafka endpoint with confluent-kafka (librdkafka).

A fresh topic, one transaction of a few records committed, and a read_committed
consumer that must read back exactly those records. Exit 0 and one line, or
exit 1 and what went wrong. scripts/container-check.py runs it from the host
through the image's proxy, and inside the compose stack's kproxy container
(`python - BOOTSTRAP < scripts/txn-roundtrip.py`); it needs nothing but
confluent-kafka, which the image has.

    python scripts/txn-roundtrip.py HOST:PORT [--records N] [--timeout S]
"""

from __future__ import annotations

import argparse
import sys
import time
import uuid

from confluent_kafka import OFFSET_BEGINNING, Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


def round_trip(bootstrap: str, records: int, timeout: float) -> str:
    started = time.monotonic()
    run = uuid.uuid4().hex[:10]
    topic = f"kproxy-roundtrip-{run}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(topic, num_partitions=1, replication_factor=1)],
                                      request_timeout=timeout).values():
        future.result(timeout=timeout)
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"kproxy-roundtrip-{run}",
                         "transaction.timeout.ms": 60000})
    producer.init_transactions(timeout)
    producer.begin_transaction()
    sent = [f"{run}-{i}".encode() for i in range(records)]
    for value in sent:
        producer.produce(topic, value=value, key=b"k")
    producer.commit_transaction(timeout)
    # Assigned, not subscribed: a group's join and rebalance would add seconds and test nothing here.
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"kproxy-roundtrip-{run}",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, OFFSET_BEGINNING)])
    read: list[bytes] = []
    deadline = time.monotonic() + timeout
    try:
        while len(read) < records and time.monotonic() < deadline:
            message = consumer.poll(0.5)
            if message is None:
                continue
            if message.error():
                raise KafkaException(message.error())
            read.append(message.value())
    finally:
        consumer.close()
    if read != sent:
        raise AssertionError(f"read back {read!r}, expected the committed {sent!r}")
    return (f"round trip: {records} records in one committed transaction, read back read_committed "
            f"through {bootstrap} in {time.monotonic() - started:.1f} s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("bootstrap")
    parser.add_argument("--records", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=60.0)
    options = parser.parse_args()
    try:
        print(round_trip(options.bootstrap, options.records, options.timeout))
    except Exception as failure:  # noqa: BLE001 - one line for any client failure, then a non-zero exit
        print(f"round trip through {options.bootstrap} failed: {type(failure).__name__}: {failure}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
