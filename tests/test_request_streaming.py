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


def test_records_level_streams_a_large_produce_and_traces_its_batches(proxy_factory, tmp_path) -> None:  # noqa: ANN001
    """At level `records` a large plain Produce still streams to the broker, and its batches
    (read into one buffer as they pass) are traced and readable from the side file."""
    import struct

    from kproxy.obs.trace_files import iter_trace_events
    from kproxy.protocol import apis
    from kproxy.protocol.records import Record, encode_batches, make_batch

    data = [Record(offset=i, timestamp=1_700_000_000_000, key=b"k%d" % i, value=b"v" * 900) for i in range(300)]
    raw = encode_batches([make_batch(data, producer_id=5, producer_epoch=0, base_sequence=0)])
    assert len(raw) > 2 * CUT_THROUGH_BYTES
    # Produce v7: transactional id (null), acks, timeout, one topic with one partition.
    body = struct.pack(">hhi", -1, 1, 30_000) + struct.pack(">ih", 1, 6) + b"orders" + struct.pack(">iii", 1, 0, len(raw)) + raw
    big = request_frame(apis.PRODUCE, 7, 1, body)
    traces = tmp_path / "traces"
    with RecordingUpstream() as upstream:
        proxy = proxy_factory(*SILENT_UPSTREAM, "--traces", str(traces), "--trace-level", "records", upstream=upstream.address)
        s = raw_connect(proxy.bootstrap)
        half = len(big) // 2
        s.sendall(big[:half])
        assert wait_for(lambda: (c := client_connection(upstream, big[:10])) is not None and len(c) >= half - 4096), (
            "at level records the Produce was gathered whole before the broker saw any of it"
        )
        s.sendall(big[half:])
        assert wait_for(lambda: len(client_connection(upstream, big[:10])) >= len(big))
        assert bytes(client_connection(upstream, big[:10])) == big

        def produce_requests() -> list[dict]:
            return [e for e in iter_trace_events(traces) if e["api"] == "produce" and e["direction"] == "request"]

        assert wait_for(lambda: bool(produce_requests())), "the Produce request was not traced"
        s.close()
    (event,) = produce_requests()
    (orders,) = event["partitions"]
    assert orders["topic"] == "orders" and orders["records_length"] == len(raw)
    assert [(b["base_offset"], b["record_count"], b["producer_id"]) for b in orders["batches"]] == [(0, 300, 5)]
    assert [r["key"] for r in orders["records"]] == ["k%d" % i for i in range(300)]
    assert all(r["value"] == "v" * 900 for r in orders["records"])
