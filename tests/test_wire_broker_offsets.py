"""What the embedded broker makes of transactional offset commits (docs/brokers.md).

A consumer that is (re)assigned resumes at its group's committed offset, so
when a transaction's TxnOffsetCommit is not visible to OffsetFetch the
consumer reads records again that a committed transaction already consumed
(the `reassigned` nonmonotonic-poll cases of a fault-free run), and when an
aborted transaction's offsets are published it skips records. Kafka makes a
transaction's offsets visible once EndTxn(commit) returns and discards them on
abort. These tests pin what Tansu does instead, so a broker upgrade that
changes it is noticed.
"""

from __future__ import annotations

import uuid

import pytest

from tests.fixtures.broker import create_topic

NO_OFFSET = -1001  # librdkafka's OFFSET_INVALID: the group has no committed offset


@pytest.fixture
def setup(broker):
    from confluent_kafka import Consumer, Producer, TopicPartition

    run = uuid.uuid4().hex[:8]
    consumed, output = f"in-{run}", f"out-{run}"
    for name in (consumed, output):
        create_topic(broker.bootstrap, name)
    group = f"g-{run}"
    consumer = Consumer({"bootstrap.servers": broker.bootstrap, "group.id": group,
                         "isolation.level": "read_committed", "enable.auto.commit": False})
    producers = []

    def producer(name):
        p = Producer({"bootstrap.servers": broker.bootstrap, "transactional.id": f"{name}-{run}",
                      "enable.idempotence": True})
        p.init_transactions(10)
        producers.append(p)
        return p

    def committed():
        return consumer.committed([TopicPartition(consumed, 0)], timeout=10)[0].offset

    def offsets(offset):
        return [TopicPartition(consumed, 0, offset)]

    yield producer, consumer.consumer_group_metadata(), committed, offsets, output
    consumer.close()
    for p in producers:
        p.flush(5)
    # Dropping the handles now keeps them from retrying a broker the session has stopped.
    producers.clear()


def test_offsets_of_a_transaction_that_produced_nothing_are_dropped(setup):
    producer, group, committed, offsets, output = setup
    p = producer("reader")
    p.begin_transaction()
    p.produce(output, value=b"1", partition=0)
    p.send_offsets_to_transaction(offsets(3), group, 10)
    p.commit_transaction(10)
    assert committed() == 3
    # A transaction that only commits offsets: Tansu's EndTxn finds the
    # producer's previous transaction, already committed, and ignores it
    # (its log: "WARN ... otherwise=Some(Committed)").
    p.begin_transaction()
    p.send_offsets_to_transaction(offsets(5), group, 10)
    p.commit_transaction(10)
    assert committed() == 3  # Kafka: 5


def test_offsets_of_a_transaction_that_produced_are_visible_after_its_commit(setup):
    producer, group, committed, offsets, output = setup
    p = producer("writer")
    p.begin_transaction()
    p.produce(output, value=b"1", partition=0)
    p.send_offsets_to_transaction(offsets(5), group, 10)
    p.commit_transaction(10)
    assert committed() == 5


def test_offsets_wait_until_no_other_transaction_is_open_on_the_produced_partition(setup):
    producer, group, committed, offsets, output = setup
    first, other = producer("first"), producer("other")
    first.begin_transaction()
    first.produce(output, value=b"1", partition=0)
    first.flush(5)
    other.begin_transaction()
    other.produce(output, value=b"2", partition=0)
    other.flush(5)
    first.send_offsets_to_transaction(offsets(7), group, 10)
    first.commit_transaction(10)
    assert committed() == NO_OFFSET  # Kafka: 7, whatever other producers do
    other.abort_transaction(10)
    assert committed() == 7


def test_held_offsets_are_replaced_by_the_next_transaction_even_when_it_aborts(setup):
    producer, group, committed, offsets, output = setup
    first, other = producer("first"), producer("other")
    other.begin_transaction()
    other.produce(output, value=b"2", partition=0)
    other.flush(5)
    first.begin_transaction()
    first.produce(output, value=b"1", partition=0)
    first.send_offsets_to_transaction(offsets(5), group, 10)
    first.commit_transaction(10)
    first.begin_transaction()
    first.send_offsets_to_transaction(offsets(8), group, 10)
    first.abort_transaction(10)
    other.commit_transaction(10)
    assert committed() == 8  # Kafka: 5; an aborted transaction's offsets are never committed
