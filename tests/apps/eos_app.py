#!/usr/bin/env python3
"""A consume-transform-produce application with exactly-once semantics, written
as any confluent-kafka user would write one (it knows nothing of kproxy).

    python eos_app.py BOOTSTRAP [--records N] [--batch B] [--abort-every K]

It creates a fresh input and output topic, writes N JSON records to the
input with an idempotent producer, then repeats one transaction after
another: consume a batch from the input (read_committed, consumer group),
upper-case each record's "word", produce the results to the output and
flush them, add the consumed offsets to the transaction, commit. Every K-th
transaction is aborted on purpose at that point, its output and offsets
already sent; its batch is read again from where it started and goes into
the next transaction. Then it reads the output back
(read_committed, a new consumer) and checks that every input record is
there exactly once. Exits 0 when it is, 1 otherwise.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
import uuid

from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

WORDS = ("apple", "birch", "cedar", "delta", "ember", "fjord", "grove", "heron")


def create_topics(bootstrap: str, names: list[str], partitions: int) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap})
    for future in admin.create_topics([NewTopic(n, partitions, 1) for n in names]).values():
        future.result(30)


def write_input(bootstrap: str, topic: str, count: int) -> None:
    producer = Producer({"bootstrap.servers": bootstrap, "enable.idempotence": True})
    for i in range(count):
        producer.produce(topic, key=str(i), value=json.dumps({"id": i, "word": WORDS[i % len(WORDS)]}))
    if producer.flush(30) != 0:
        raise RuntimeError("the input records were not all acknowledged")


def transform(value: bytes) -> str:
    record = json.loads(value)
    return json.dumps({**record, "word": record["word"].upper()})


def check_output(bootstrap: str, topic: str, partitions: int, count: int, deadline_s: float) -> list[str]:
    """Read the whole output as a new read_committed consumer; what is wrong with it (nothing: [])."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": f"{topic}-check",
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    ends = {p: consumer.get_watermark_offsets(TopicPartition(topic, p), 10)[1] for p in range(partitions)}
    consumer.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    seen: dict[int, int] = {}
    deadline = time.monotonic() + deadline_s
    while time.monotonic() < deadline:
        for m in consumer.consume(100, timeout=0.5):
            if m.error() is None:
                record = json.loads(m.value())
                seen[record["id"]] = seen.get(record["id"], 0) + int(record["word"].isupper())
        positions = consumer.position([TopicPartition(topic, p) for p in range(partitions)])
        if all(tp.offset >= ends[tp.partition] for tp in positions):
            break
    consumer.close()
    problems = []
    missing = sorted(i for i in range(count) if not seen.get(i))
    twice = sorted(i for i, n in seen.items() if n > 1)
    if missing:
        problems.append(f"{len(missing)} input records missing from the output: ids {missing[:10]}")
    if twice:
        problems.append(f"{len(twice)} input records in the output more than once: ids {twice[:10]}")
    return problems


def run(bootstrap: str, count: int, batch: int, abort_every: int, partitions: int, deadline_s: float) -> int:
    name = f"eos-app-{uuid.uuid4().hex[:8]}"
    source, sink = f"{name}-in", f"{name}-out"
    create_topics(bootstrap, [source, sink], partitions)
    write_input(bootstrap, source, count)
    print(f"wrote {count} records to {source}", flush=True)

    consumer = Consumer({
        "bootstrap.servers": bootstrap, "group.id": f"{name}-group", "isolation.level": "read_committed",
        "enable.auto.commit": False, "auto.offset.reset": "earliest",
    })
    # Assigned rather than subscribed: no rebalance to wait for, the offsets are still the group's.
    consumer.assign([TopicPartition(source, p, 0) for p in range(partitions)])
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": f"{name}-txn"})
    producer.init_transactions(30)

    done, transactions, aborted = set(), 0, 0
    deadline = time.monotonic() + deadline_s
    while len(done) < count:
        if time.monotonic() > deadline:
            print(f"timed out: {len(done)} of {count} records processed", file=sys.stderr)
            return 1
        messages = [m for m in consumer.consume(batch, timeout=1.0) if m.error() is None]
        if not messages:
            continue
        transactions += 1
        producer.begin_transaction()
        for m in messages:
            producer.produce(sink, key=m.key(), value=transform(m.value()))
        producer.flush(30)  # the output is on the broker before the transaction is decided
        first, after = {}, {}
        for m in messages:
            first.setdefault(m.partition(), m.offset())
            after[m.partition()] = m.offset() + 1
        offsets = [TopicPartition(source, p, o) for p, o in sorted(after.items())]
        producer.send_offsets_to_transaction(offsets, consumer.consumer_group_metadata(), 30)
        if transactions % abort_every == 0:
            producer.abort_transaction(30)
            aborted += 1
            # Read the batch again: the next transaction does its work.
            for partition, offset in first.items():
                consumer.seek(TopicPartition(source, partition, offset))
            print(f"transaction {transactions}: aborted on purpose ({len(messages)} records)", flush=True)
            continue
        producer.commit_transaction(30)
        done.update(json.loads(m.value())["id"] for m in messages)
        print(f"transaction {transactions}: committed {len(messages)} records ({len(done)}/{count})", flush=True)
    consumer.close()
    print(f"processed {count} records in {transactions} transactions, {aborted} aborted on purpose", flush=True)
    problems = check_output(bootstrap, sink, partitions, count, max(5.0, deadline - time.monotonic()))
    for problem in problems or [f"each of the {count} records is in {sink} exactly once"]:
        print(f"output check{' failed' if problems else ''}: {problem}", file=sys.stderr if problems else sys.stdout)
    return 1 if problems else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("bootstrap", help="HOST:PORT of the Kafka cluster")
    parser.add_argument("--records", type=int, default=50, help="input records (default 50)")
    parser.add_argument("--batch", type=int, default=5, help="most records per transaction (default 5)")
    parser.add_argument("--abort-every", type=int, default=5, help="abort every K-th transaction (default 5)")
    parser.add_argument("--partitions", type=int, default=2, help="partitions of each topic (default 2)")
    parser.add_argument("--deadline", type=float, default=60.0, help="give up after this many seconds")
    args = parser.parse_args()
    try:
        return run(args.bootstrap, args.records, args.batch, args.abort_every, args.partitions, args.deadline)
    except KafkaException as exc:
        print(f"eos_app: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
