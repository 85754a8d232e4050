"""Large responses on the fast path reach the client as they arrive (cut-through).

A scripted broker sends a large response in two halves and only sends the
second half once the client has read the first through the proxy: a proxy
that waited for the whole frame would stall, so these tests fail on
store-and-forward. Byte-exactness, the order of the responses behind it, the
trace's error codes and a real consumer's records are checked too.
"""

from __future__ import annotations

import socket
import struct
import threading
import time
import uuid
from pathlib import Path

from confluent_kafka import Consumer, Producer, TopicPartition

from kproxy.obs.trace_files import iter_trace_events
from kproxy.protocol import apis
from kproxy.protocol.codec import encode_response
from kproxy.io.connection import CUT_THROUGH_BYTES
from kproxy.protocol.framing import FrameBuffer
from tests.fixtures.broker import create_topic
from tests.fixtures.proxy import SILENT_UPSTREAM
from tests.fixtures.scripted import ScriptedUpstream
from tests.test_proxy_bad_input import raw_connect, request_frame
from tests.test_response_faults import fetch_response


class HalfThenRestBroker(ScriptedUpstream):
    """Answers one client's requests with scripted frames; the first frame's second
    half waits until `release` is set."""

    def __init__(self, responses: list[bytes], requests_expected: int) -> None:
        self.responses = responses
        self.requests_expected = requests_expected
        self.release = threading.Event()
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        received = b""
        while received.count(b"raw") < self.requests_expected:  # every test request carries client id "raw"
            data = conn.recv(65536)
            if not data:
                return
            received += data
        first, *rest = self.responses
        half = len(first) // 2
        conn.sendall(first[:half])
        if not self.release.wait(10):
            return
        for i in range(half, len(first), 8192):  # the rest in small pieces
            conn.sendall(first[i : i + 8192])
        for frame in rest:
            conn.sendall(frame)
        time.sleep(2)


def read_exactly(s: socket.socket, n: int, timeout: float = 10.0) -> bytes:
    s.settimeout(timeout)
    out = bytearray()
    while len(out) < n:
        data = s.recv(n - len(out))
        if not data:
            break
        out += data
    return bytes(out)


def response_frame(corr: int, body: bytes) -> bytes:
    payload = struct.pack(">i", corr) + body
    return struct.pack(">i", len(payload)) + payload


def test_a_large_response_streams_through_byte_exact(proxy_factory) -> None:
    big = response_frame(1, bytes(range(256)) * (3 * CUT_THROUGH_BYTES // 256))
    small = response_frame(2, b"small answer")
    with HalfThenRestBroker([big, small], requests_expected=2) as upstream:
        proxy = proxy_factory(*SILENT_UPSTREAM, upstream=upstream.address)
        s = raw_connect(proxy.bootstrap)
        # An API key the proxy does not know stays on the fast path, untouched.
        s.sendall(request_frame(9999, 0, 1, b"a") + request_frame(9999, 0, 2, b"b"))
        first_half = read_exactly(s, len(big) // 2)
        assert first_half == big[: len(big) // 2], "the first half did not arrive before the rest was sent"
        upstream.release.set()
        rest = read_exactly(s, len(big) - len(big) // 2 + len(small))
        assert first_half + rest == big + small
        s.close()


def test_traced_fetch_response_keeps_its_error_codes(proxy_factory, tmp_path: Path) -> None:
    value = fetch_response(
        12,
        {
            "orders": [{"partition_index": 0, "high_watermark": 9, "records": b"r" * (2 * CUT_THROUGH_BYTES)}],
            "audit": [{"partition_index": 3, "high_watermark": 0, "error_code": _error(6)}],
        },
    )
    big = encode_response(value, 1)
    traces = tmp_path / "traces"
    with HalfThenRestBroker([big], requests_expected=1) as upstream:
        proxy = proxy_factory(*SILENT_UPSTREAM, "--traces", str(traces), "--trace-level", "headers", upstream=upstream.address)
        s = raw_connect(proxy.bootstrap)
        s.sendall(request_frame(apis.FETCH, 12, 1, b"\x00", client_id=b"raw"))
        first_half = read_exactly(s, len(big) // 2)
        assert first_half == big[: len(big) // 2]
        upstream.release.set()
        assert first_half + read_exactly(s, len(big) - len(big) // 2) == big
        s.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events = [e for e in iter_trace_events(traces) if e["api"] == "fetch" and e["direction"] == "response"]
        if events:
            break
        time.sleep(0.2)
    (event,) = events
    assert event["size"] == len(big) - 4
    assert event["error_codes"] == [6] and event["error_code"] == 6
    assert event["latency_ms"] >= 0


def _error(code: int):  # noqa: ANN202
    from kio.schema.errors import ErrorCode

    return ErrorCode(code)


def test_real_consumer_reads_large_fetches_through_the_proxy(broker, proxy_factory, topic_name, tmp_path) -> None:
    create_topic(broker.bootstrap, topic_name)
    values = [uuid.uuid4().bytes * 64 for _ in range(3000)]  # 1 KiB each: ~3 MiB of Fetch responses
    producer = Producer({"bootstrap.servers": broker.bootstrap, "linger.ms": 5})
    for v in values:
        producer.produce(topic_name, value=v)
    assert producer.flush(30) == 0
    traces = tmp_path / "traces"
    proxy = proxy_factory("--traces", str(traces), "--trace-level", "headers")
    consumer = Consumer({
        "bootstrap.servers": proxy.bootstrap,
        "group.id": f"cut-{uuid.uuid4().hex[:6]}",
        "enable.auto.commit": False,
        "max.partition.fetch.bytes": 4 * 1048576,
    })
    consumer.assign([TopicPartition(topic_name, 0, 0)])
    got: list[bytes] = []
    deadline = time.monotonic() + 30
    while len(got) < len(values) and time.monotonic() < deadline:
        for msg in consumer.consume(1000, 0.5):
            assert msg.error() is None, msg.error()
            got.append(msg.value())
    consumer.close()
    assert got == values
    proxy.stop()
    fetches = [e for e in iter_trace_events(traces) if e["api"] == "fetch" and e["direction"] == "response"]
    assert max(e["size"] for e in fetches) >= CUT_THROUGH_BYTES, "no Fetch response was large enough to stream"
    assert all(e["error_code"] == 0 for e in fetches)


def _api_versions_through(proxy) -> dict[int, int]:
    from kproxy.protocol.codec import decode_response

    s = raw_connect(proxy.bootstrap)
    s.sendall(request_frame(apis.API_VERSIONS, 0, 1, b"", client_id=b"raw"))
    size = struct.unpack(">i", read_exactly(s, 4))[0]
    payload = read_exactly(s, size)
    s.close()
    return {int(k.api_key): int(k.max_version) for k in decode_response(apis.API_VERSIONS, 0, payload).api_keys}


def test_clients_are_offered_fetch_without_leader_hints_unless_asked(proxy_factory) -> None:
    """Fetch v16+ responses carry leader hints to rewrite, which rules out streaming them."""
    assert _api_versions_through(proxy_factory())[apis.FETCH] == 15
    assert _api_versions_through(proxy_factory("--fetch-leader-hints"))[apis.FETCH] >= 16


class SizedAnswerBroker(ScriptedUpstream):
    """Answers each test request (client id "raw") with a frame of the size its body names."""

    def answer(self, conn: socket.socket) -> None:
        frames = FrameBuffer()
        while data := conn.recv(65536):
            block, offsets = frames.feed(data)
            ends = offsets[1:] + [len(block)]
            for start, end in zip(offsets, ends):
                frame = block[start + 4 : end]
                if b"raw" not in frame:
                    continue  # the proxy's own discovery: left unanswered
                corr = struct.unpack_from(">i", frame, 4)[0]
                want = struct.unpack_from(">i", frame, len(frame) - 4)[0]
                conn.sendall(response_frame(corr, bytes(range(256)) * (want // 256)))


def test_a_client_that_stops_reading_a_large_response_holds_up_no_one_else(proxy_factory) -> None:
    # The stalled response is far larger than the socket buffers on its way,
    # so the proxy is left mid-frame with the slow client's socket full.
    with SizedAnswerBroker() as upstream:
        proxy = proxy_factory(*SILENT_UPSTREAM, upstream=upstream.address)
        slow = raw_connect(proxy.bootstrap)
        big_size = 48 * 1024 * 1024
        slow.sendall(request_frame(9999, 0, 1, struct.pack(">i", big_size)))
        head = read_exactly(slow, 1024 * 1024)
        assert len(head) == 1024 * 1024
        time.sleep(0.5)  # the proxy now waits for the slow client to drain
        others = [raw_connect(proxy.bootstrap) for _ in range(3)]
        started = time.monotonic()
        for i, s in enumerate(others):
            s.sendall(request_frame(9999, 0, 7, struct.pack(">i", 4 * CUT_THROUGH_BYTES * (i + 1))))
        for i, s in enumerate(others):
            expected = response_frame(7, bytes(range(256)) * (4 * CUT_THROUGH_BYTES * (i + 1) // 256))
            assert read_exactly(s, len(expected), timeout=5) == expected
            s.close()
        assert time.monotonic() - started < 5
        rest = read_exactly(slow, 4 + 4 + big_size - len(head), timeout=30)
        assert head + rest == response_frame(1, bytes(range(256)) * (big_size // 256))
        slow.close()


def test_records_level_keeps_a_traced_fetch_streaming_and_its_batches_readable(proxy_factory, tmp_path: Path) -> None:
    from kproxy.protocol.records import Record, encode_batches, make_batch, make_control_batch

    # A transactional batch (zstd), its COMMIT marker, and a plain batch: large enough to go cut-through.
    data = [Record(offset=100 + i, timestamp=1_700_000_000_000, key=b"k%d" % i, value=b"v" * 900) for i in range(450)]
    batches = [
        make_batch(data[:150], compression="zstd", producer_id=7, producer_epoch=2, base_sequence=0, transactional=True),
        make_control_batch("commit", offset=250, timestamp=1_700_000_000_000, producer_id=7, producer_epoch=2),
        make_batch([Record(offset=251 + i, timestamp=1, key=None, value=r.value) for i, r in enumerate(data[150:])]),
    ]
    raw = encode_batches(batches)
    assert len(raw) > 2 * CUT_THROUGH_BYTES
    value = fetch_response(
        12,
        {"orders": [{"partition_index": 0, "high_watermark": 551, "last_stable_offset": 551, "records": raw,
                     "aborted_transactions": [(9, 40)]}],
         "audit": [{"partition_index": 3, "high_watermark": 0, "error_code": _error(6)}]},
    )
    big = encode_response(value, 1)
    traces = tmp_path / "traces"
    with HalfThenRestBroker([big], requests_expected=1) as upstream:
        proxy = proxy_factory(*SILENT_UPSTREAM, "--traces", str(traces), "--trace-level", "records", upstream=upstream.address)
        s = raw_connect(proxy.bootstrap)
        s.sendall(request_frame(apis.FETCH, 12, 1, b"\x00", client_id=b"raw"))
        first_half = read_exactly(s, len(big) // 2)
        assert first_half == big[: len(big) // 2], "at level records the Fetch response stopped streaming"
        upstream.release.set()
        assert first_half + read_exactly(s, len(big) - len(big) // 2) == big
        s.close()
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        events = [e for e in iter_trace_events(traces) if e["api"] == "fetch" and e["direction"] == "response"]
        if events:
            break
        time.sleep(0.2)
    (event,) = events
    assert event["error_codes"] == [6]
    (orders,) = [p for p in event["partitions"] if p["topic"] == "orders"]
    assert orders["aborted_transactions"] == [{"producer_id": 9, "first_offset": 40}]
    assert orders["last_stable_offset"] == 551 and orders["records_length"] == len(raw)
    assert [(b["base_offset"], b["record_count"], b["compression"], b["transactional"], b["marker"])
            for b in orders["batches"]] == [(100, 150, "zstd", True, None), (250, 1, "none", True, "commit"),
                                            (251, 300, "none", False, None)]
    records = orders["records"]  # decoded by the reader from the side file, as version 2 carried them
    assert [r["offset"] for r in records] == list(range(100, 551))
    assert [r["control"] for r in records if r["control"]] == ["commit"]
    assert records[0]["key"] == "k0" and records[0]["value"] == "v" * 900 and records[0]["producer_id"] == 7
    (audit,) = [p for p in event["partitions"] if p["topic"] == "audit"]
    assert audit["error_code"] == 6 and audit["records"] == []
