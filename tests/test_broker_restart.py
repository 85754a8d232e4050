"""A consumer reading through the proxy goes on reading after its broker is SIGKILLed and restarted.

noida-db on a data directory of its own, so the restarted broker has the
topic again (docs/reliability.md: Tansu in memory forgets it, and answers a
Fetch past its new log's end with no error, which no proxy can change).
The proxy must drop the dead broker's connections at once and serve the
restarted one on the same listener.
"""

from __future__ import annotations

import signal
import time
import uuid
from pathlib import Path

import pytest

from kproxy.brokers import start_broker
from kproxy.proxy_process import running_proxy
from tests.fixtures.proxy import metric_value

pytestmark = pytest.mark.timeout(120)


def test_a_reading_consumer_reads_again_after_the_broker_restarts(tmp_path: Path) -> None:
    from confluent_kafka import Consumer, Producer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    data = tmp_path / "noida-data"
    data.mkdir()
    broker = start_broker(kind="noida", data_dir=data, log_path=tmp_path / "broker.log")
    try:
        with running_proxy(broker.bootstrap, log_path=tmp_path / "kproxy.log") as proxy:
            topic = f"restart-{uuid.uuid4().hex[:8]}"
            admin = AdminClient({"bootstrap.servers": proxy.bootstrap, "log_level": 0})
            for future in admin.create_topics([NewTopic(topic, 1, 1)]).values():
                future.result(20)
            producer = Producer({"bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "log_level": 0})
            consumer = Consumer({
                "bootstrap.servers": proxy.bootstrap, "group.id": topic, "enable.auto.commit": False,
                "auto.offset.reset": "earliest", "fetch.wait.max.ms": 200, "log_level": 0,
            })
            consumer.assign([TopicPartition(topic, 0, 0)])

            def read_value(wanted: bytes, within: float) -> float:
                """Produce `wanted` until the consumer has read it; seconds it took."""
                start = time.monotonic()
                while time.monotonic() - start < within:
                    producer.produce(topic, value=wanted)
                    producer.poll(0)
                    msg = consumer.poll(0.2)
                    if msg is not None and not msg.error() and msg.value() == wanted:
                        return time.monotonic() - start
                raise AssertionError(f"the consumer read no {wanted!r} in {within}s")

            read_value(b"before", 30)
            broker.process.send_signal(signal.SIGKILL)
            broker.process.wait(10)
            broker = start_broker(kind="noida", port=broker.port, data_dir=data, log_path=tmp_path / "broker-again.log")
            took = read_value(b"after", 30)
            # The dead broker's connections were dropped, not left to time out.
            assert metric_value(proxy, "kproxy_connections_closed_total", side="client", reason="upstream_closed") >= 1
            assert took < 15, f"the consumer took {took:.1f}s to read again after the restart"
            consumer.close()
            producer.flush(5)
    finally:
        broker.stop()
