"""Real clients through the real proxy on the real broker: they must not tell the difference."""

from __future__ import annotations

import shutil
import subprocess
import time

import pytest
from confluent_kafka import Consumer, Producer, TopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kproxy.proxy_process import ProxyProcess
from tests.fixtures.broker import create_topic


def proxy_ports(proxy: ProxyProcess) -> set[int]:
    """Every port the proxy may hand out: bootstrap plus one per broker node."""
    return {proxy.listen_port} | {proxy.listen_port + 1 + node for node in range(0, 1000)}


def consume(bootstrap: str, topic: str, partitions: int, want: int, timeout: float = 15.0, **config: object) -> list:
    c = Consumer({"bootstrap.servers": bootstrap, "group.id": f"g-{topic}", "enable.auto.commit": False, **config})
    c.assign([TopicPartition(topic, p, 0) for p in range(partitions)])
    got = []
    deadline = time.monotonic() + timeout
    try:
        while len(got) < want and time.monotonic() < deadline:
            m = c.poll(0.2)
            if m is not None and not m.error():
                got.append((m.partition(), m.offset(), m.key(), m.value()))
    finally:
        c.close()
    return got


def test_admin_topic_creation_and_metadata_name_only_proxy_addresses(proxy: ProxyProcess, broker, topic_name: str) -> None:
    admin = AdminClient({"bootstrap.servers": proxy.bootstrap})
    for f in admin.create_topics([NewTopic(topic_name, 3, 1)], operation_timeout=10).values():
        f.result(15)
    md = admin.list_topics(timeout=10)
    assert topic_name in md.topics and len(md.topics[topic_name].partitions) == 3
    for b in md.brokers.values():
        assert b.host == "127.0.0.1"
        assert b.port == proxy.listen_port + 1 + b.id, "broker port must follow the port scheme"
        assert b.port != broker.port


def test_confluent_produce_consume_roundtrip(proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name, partitions=2)
    p = Producer({"bootstrap.servers": proxy.bootstrap, "acks": "all", "enable.idempotence": True, "linger.ms": 5})
    sent = {(b"k%d" % i, b"v%d" % i) for i in range(200)}
    for k, v in sorted(sent):
        p.produce(topic_name, key=k, value=v)
    assert p.flush(15) == 0
    got = consume(proxy.bootstrap, topic_name, 2, len(sent))
    assert {(k, v) for _, _, k, v in got} == sent


def test_kafka_python_produce_consume_and_learns_only_proxy_addresses(proxy: ProxyProcess, topic_name: str) -> None:
    kafka = pytest.importorskip("kafka")
    create_topic(proxy.bootstrap, topic_name)
    producer = kafka.KafkaProducer(bootstrap_servers=proxy.bootstrap, acks="all")
    for i in range(50):
        producer.send(topic_name, key=b"k", value=b"kp%d" % i)
    producer.flush(15)
    brokers = producer._metadata.brokers()  # what the client learnt from Metadata
    producer.close()
    assert brokers and all(b.host == "127.0.0.1" and b.port in proxy_ports(proxy) for b in brokers)
    consumer = kafka.KafkaConsumer(
        bootstrap_servers=proxy.bootstrap, auto_offset_reset="earliest", consumer_timeout_ms=10000
    )
    consumer.assign([kafka.TopicPartition(topic_name, 0)])
    values = []
    for msg in consumer:
        values.append(msg.value)
        if len(values) == 50:
            break
    consumer.close()
    assert values == [b"kp%d" % i for i in range(50)]


def test_transactional_producer_commits_and_aborts(proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": proxy.bootstrap, "transactional.id": f"tx-{topic_name}"})
    p.init_transactions(15)
    p.begin_transaction()
    p.produce(topic_name, value=b"committed")
    p.commit_transaction(15)
    p.begin_transaction()
    p.produce(topic_name, value=b"aborted")
    p.abort_transaction(15)
    got = consume(proxy.bootstrap, topic_name, 1, 2, timeout=5, **{"isolation.level": "read_uncommitted"})
    values = [v for *_, v in got]
    assert b"committed" in values


def test_consumer_group_subscribe_through_proxy(proxy: ProxyProcess, topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name)
    p = Producer({"bootstrap.servers": proxy.bootstrap})
    for i in range(10):
        p.produce(topic_name, value=b"s%d" % i)
    p.flush(10)
    c = Consumer(
        {
            "bootstrap.servers": proxy.bootstrap,
            "group.id": f"grp-{topic_name}",
            "auto.offset.reset": "earliest",
            "session.timeout.ms": 6000,
        }
    )
    c.subscribe([topic_name])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 10 and time.monotonic() < deadline:
        m = c.poll(0.3)
        if m is not None and not m.error():
            got.append(m.value())
    c.commit(asynchronous=False)
    committed = c.committed([TopicPartition(topic_name, 0)], timeout=10)
    c.close()
    assert sorted(got) == sorted(b"s%d" % i for i in range(10))
    assert committed[0].offset == 10


@pytest.mark.skipif(shutil.which("kcat") is None, reason="kcat (Debian package) is not installed")
def test_kcat_lists_only_proxy_addresses_and_consumes(proxy: ProxyProcess, broker, topic_name: str) -> None:
    create_topic(proxy.bootstrap, topic_name)
    subprocess.run(
        ["kcat", "-P", "-b", proxy.bootstrap, "-t", topic_name], input=b"one\ntwo\n", check=True, timeout=30
    )
    listing = subprocess.run(["kcat", "-L", "-b", proxy.bootstrap], capture_output=True, text=True, timeout=30).stdout
    assert f":{broker.port}" not in listing
    broker_lines = [line for line in listing.splitlines() if line.strip().startswith("broker ")]
    assert broker_lines and all("127.0.0.1:" in line for line in broker_lines)
    for line in broker_lines:
        port = int(line.split("127.0.0.1:")[1].split()[0])
        assert port in proxy_ports(proxy)
    out = subprocess.run(
        ["kcat", "-C", "-b", proxy.bootstrap, "-t", topic_name, "-o", "beginning", "-e", "-q"],
        capture_output=True, text=True, timeout=30,
    ).stdout
    assert out.split() == ["one", "two"]
