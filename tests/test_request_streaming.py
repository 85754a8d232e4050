"""Large plain requests go to the broker as they arrive; rules added at run time reach open connections.

A recording upstream sees the first half of a large request before the
client has sent its second half: a proxy that gathered the whole frame first
would fail that. Byte-exactness, the request behind it, a client that dies
inside a streamed request and a rule added while a producer stays connected
are checked too.
"""

from __future__ import annotations

import time
import uuid

import httpx
from confluent_kafka import KafkaException, Producer

from kproxy.io.connection import CUT_THROUGH_BYTES
from tests.fixtures.proxy import SILENT_UPSTREAM, metric_value
from tests.test_proxy_bad_input import RecordingUpstream, closed_by_peer, produce_works, raw_connect, request_frame


def wait_for(condition, timeout: float = 10.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def client_connection(upstream: RecordingUpstream, prefix: bytes):  # noqa: ANN201
    """The recorded upstream connection that carries the test client's bytes (the proxy's discovery has its own)."""
    mine = [c for c in upstream.connections if c.startswith(prefix)]
    return mine[0] if mine else None


def test_a_large_request_streams_to_the_broker_byte_exact(proxy_factory) -> None:
    big = request_frame(9999, 0, 1, bytes(range(256)) * (3 * CUT_THROUGH_BYTES // 256))
    small = request_frame(9999, 0, 2, b"behind it")
    with RecordingUpstream() as upstream:
        proxy = proxy_factory(*SILENT_UPSTREAM, upstream=upstream.address)
        s = raw_connect(proxy.bootstrap)
        half = len(big) // 2
        s.sendall(big[:half])
        assert wait_for(lambda: (c := client_connection(upstream, big[:10])) is not None and len(c) >= half - 4096), (
            "the broker saw nothing of the request before the client sent all of it"
        )
        s.sendall(big[half:] + small)
        assert wait_for(lambda: len(client_connection(upstream, big[:10])) >= len(big) + len(small))
        assert bytes(client_connection(upstream, big[:10])) == big + small
        s.close()


def test_a_client_dying_inside_a_streamed_request_closes_only_its_connection(proxy_factory, topic_name) -> None:
    proxy = proxy_factory()
    big = request_frame(9999, 0, 7, b"x" * (3 * CUT_THROUGH_BYTES))
    s = raw_connect(proxy.bootstrap)
    s.sendall(big[: len(big) // 2])
    time.sleep(0.3)
    s.close()
    assert wait_for(lambda: metric_value(proxy, "kproxy_protocol_errors_total", reason="truncated_frame") >= 1)
    assert produce_works(proxy.bootstrap, topic_name)
    assert proxy.alive()


def test_a_rule_added_at_run_time_reaches_an_open_connection(proxy_factory, topic_name) -> None:
    proxy = proxy_factory()
    producer = Producer({
        "bootstrap.servers": proxy.bootstrap, "linger.ms": 0, "acks": "all",
        "enable.idempotence": False, "retries": 0, "message.timeout.ms": 10000,
    })
    producer.produce(topic_name, value=b"before the rule")
    assert producer.flush(15) == 0

    rule = {"id": "refuse-produce", "match": {"api": "produce"},
            "action": {"type": "respond", "error": "POLICY_VIOLATION"}}
    answer = httpx.put(f"{proxy.admin_url}/rules/refuse-produce", json=rule, timeout=5)
    assert answer.status_code == 200, answer.text

    errors: list[object] = []
    producer.produce(topic_name, value=b"after the rule", on_delivery=lambda err, msg: errors.append(err))
    producer.flush(15)
    assert errors and errors[0] is not None, "the producer's open connection never met the new rule"
    assert metric_value(proxy, "kproxy_faults_applied_total", rule="refuse-produce", action="respond") >= 1
