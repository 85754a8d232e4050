"""The worked example of docs/testing.md, as a user of the pytest plugin writes it.

A transactional confluent-kafka test goes through the `kproxy` fixture's
proxy; a delay rule slows every commit while it runs; the test checks what
its consumer read, then asks for the verdict on what crossed the wire.
"""

import json
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic


@pytest.fixture(autouse=True)
def _the_suites_spark_session(spark):
    """Not part of the example: in kproxy's own suite, the verdict finds the worker's one Spark session
    (tests/fixtures/spark.py) running and uses it, rather than starting one with other settings."""


def create_topic(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)


def write_orders(bootstrap, topic, transactional_id, batches=3, per_batch=4):
    producer = Producer({"bootstrap.servers": bootstrap, "transactional.id": transactional_id})
    producer.init_transactions(15)
    for batch in range(batches):
        producer.begin_transaction()
        for n in range(per_batch):
            producer.produce(topic, key=f"order-{batch}-{n}", value=json.dumps({"batch": batch, "n": n}))
        producer.commit_transaction(15)


def read_committed(bootstrap, topic, group, count, timeout=20.0):
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic, 0, 0)])
    values, deadline = [], time.monotonic() + timeout
    while len(values) < count and time.monotonic() < deadline:
        values += [json.loads(m.value()) for m in consumer.consume(count, timeout=0.5) if m.error() is None]
    consumer.close()
    return values


def test_committed_orders_are_read_once(kproxy):
    topic = kproxy.fresh_name("orders")
    create_topic(kproxy.bootstrap, topic)

    slow_commit = {"id": "slow-commit", "match": {"api": "EndTxn"}, "action": {"type": "delay", "ms": 300}}
    with kproxy.admin.rule(slow_commit):
        write_orders(kproxy.bootstrap, topic, kproxy.fresh_name("orders-tx"))
        assert kproxy.admin.get_rule("slow-commit")["counters"]["applied"] == 3
    assert kproxy.admin.rules() == []

    orders = read_committed(kproxy.bootstrap, topic, kproxy.fresh_name("readers"), 12)
    assert sorted((o["batch"], o["n"]) for o in orders) == [(b, n) for b in range(3) for n in range(4)]

    verdict = kproxy.verdict()  # stops the proxy: the clients are closed by now
    verdict.assert_valid()
    assert verdict.by_rule == {"slow-commit": {}}  # it acted, and caused nothing
