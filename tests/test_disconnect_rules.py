"""A disconnect rule that cuts the broker side ends one connection cleanly.

The pumps of that connection fail after the cut (their socket was closed
under them); that is the fault's consequence, not a proxy error: the close is
counted as a fault disconnect on both sides and nothing is logged as an
internal error. The producer retries on a new connection and loses nothing.
"""

from __future__ import annotations

from pathlib import Path

from confluent_kafka import Producer

from tests.fixtures.proxy import metric_value

RULES = """\
version: 1
rules:
  - id: cut-broker
    match: {api: produce}
    action: {type: disconnect, side: upstream}
    limits: {count: 1}
"""


def test_cutting_the_broker_side_is_a_fault_disconnect_not_an_error(proxy_factory, topic_name, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    proxy = proxy_factory("--rules", str(rules))
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "message.timeout.ms": 15000})
    for i in range(5):
        producer.produce(topic_name, value=b"record %d" % i)
    assert producer.flush(20) == 0
    assert metric_value(proxy, "kproxy_faults_applied_total", rule="cut-broker", action="disconnect") == 1
    assert metric_value(proxy, "kproxy_connections_closed_total", side="client", reason="fault_disconnect") == 1
    assert metric_value(proxy, "kproxy_connections_closed_total", side="upstream", reason="fault_disconnect") == 1
    assert "internal error" not in proxy.log_text()
