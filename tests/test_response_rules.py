"""A rule on the response direction acts even on APIs that no request rule inspects."""

from __future__ import annotations

from confluent_kafka import Producer

from tests.fixtures.broker import create_topic
from tests.fixtures.proxy import metric_value


def produce_once_under(proxy_factory, tmp_path, topic_name, rule_id: str, action: str):  # noqa: ANN201
    """A proxy with one `once` response rule on Produce, and one plain record sent through it."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(
        "version: 1\n"
        "rules:\n"
        f"  - id: {rule_id}\n"
        "    match: {api: produce, direction: response}\n"
        f"    action: {action}\n"
        "    limits: {once: true}\n"
    )
    proxy = proxy_factory("--rules", str(rules))
    create_topic(proxy.bootstrap, topic_name)
    # Not transactional, not idempotent: nothing else takes this Produce off the fast path,
    # and a retry writes the record again.
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "enable.idempotence": False, "acks": 1})
    producer.produce(topic_name, value=b"x")
    assert producer.flush(20) == 0  # the client retries after the fault and succeeds
    return proxy


def test_response_rule_rewrites_a_plain_produce_response(proxy_factory, tmp_path, topic_name) -> None:
    proxy = produce_once_under(
        proxy_factory, tmp_path, topic_name, "ack-says-not-leader", "{type: replace_error, error: NOT_LEADER_OR_FOLLOWER}"
    )

    assert metric_value(proxy, "kproxy_faults_applied_total", rule="ack-says-not-leader", action="replace_error") == 1
    assert metric_value(proxy, "kproxy_response_errors_total", api="produce", error="not_leader_or_follower") == 1


def test_response_side_disconnect_loses_the_ack_after_the_write(proxy_factory, tmp_path, topic_name) -> None:
    from confluent_kafka import Consumer, TopicPartition

    proxy = produce_once_under(proxy_factory, tmp_path, topic_name, "cut-after-write", "{type: disconnect}")
    assert metric_value(proxy, "kproxy_faults_applied_total", rule="cut-after-write", action="disconnect") == 1
    assert metric_value(proxy, "kproxy_connections_closed_total", side="client", reason="fault_disconnect") == 1

    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": topic_name, "enable.auto.commit": False})
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    seen = []
    for _ in range(20):
        seen += [m.value() for m in consumer.consume(10, 0.5) if m.error() is None]
        if len(seen) >= 2:
            break
    consumer.close()
    assert seen == [b"x", b"x"], "the first write landed before its connection was cut"


def test_a_rewrite_that_does_not_fit_the_api_is_refused_by_the_running_proxy(proxy_factory, tmp_path, topic_name) -> None:
    # No `match`: the Fetch-only rewrite would also meet ApiVersions, Metadata and Produce answers.
    # It is refused when it is put; a rewrite that fails on an answer anyway passes the answer on
    # unchanged (tests/test_pipeline.py).
    import httpx

    rules = tmp_path / "rules.yaml"
    rules.write_text("version: 1\nrules: []\n")
    proxy = proxy_factory("--rules", str(rules))
    refused = httpx.put(f"{proxy.admin_url}/rules/misfit", json={"action": {"type": "rewrite", "field": "fetch_drop_records"}},
                        timeout=10)
    assert refused.status_code == 400 and "applies only to fetch" in refused.json()["error"], refused.text
    create_topic(proxy.bootstrap, topic_name)
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "acks": 1})
    for i in range(5):
        producer.produce(topic_name, value=b"%d" % i)
    assert producer.flush(20) == 0
    assert metric_value(proxy, "kproxy_connections_closed_total", side="client", reason="error") == 0
