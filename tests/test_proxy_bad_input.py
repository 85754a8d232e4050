"""Bad input costs one connection, never the proxy; passthrough is byte-exact."""

from __future__ import annotations

import socket
import struct
import time

import httpx
from confluent_kafka import Producer

from kproxy.brokers import free_port, start_broker
from tests.fixtures.proxy import SILENT_UPSTREAM, metric_value
from tests.fixtures.scripted import ScriptedUpstream


def raw_connect(bootstrap: str) -> socket.socket:
    host, port = bootstrap.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.settimeout(10)
    return s


def closed_by_peer(s: socket.socket) -> bool:
    try:
        while True:
            if not s.recv(65536):
                return True
    except ConnectionResetError:
        return True
    except socket.timeout:
        return False


def request_frame(api_key: int, version: int, corr: int, body: bytes, client_id: bytes = b"raw") -> bytes:
    payload = struct.pack(">hhih", api_key, version, corr, len(client_id)) + client_id + body
    return struct.pack(">i", len(payload)) + payload


def produce_works(bootstrap: str, topic: str) -> bool:
    p = Producer({"bootstrap.servers": bootstrap, "message.timeout.ms": 10000})
    p.produce(topic, value=b"still alive")
    return p.flush(15) == 0


def test_malformed_frames_close_only_their_connection(proxy_factory, topic_name: str) -> None:
    proxy = proxy_factory("--max-frame-bytes", "4096")
    bystander = raw_connect(proxy.bootstrap)  # an idle, well-behaved connection

    cases = {
        "negative_length": struct.pack(">i", -5),
        "frame_too_large": struct.pack(">i", 1 << 20),
        "undecodable": struct.pack(">i", 3) + b"\x00\x01\x02",  # shorter than a request header
    }
    for reason, data in cases.items():
        s = raw_connect(proxy.bootstrap)
        s.sendall(data)
        assert closed_by_peer(s), reason
        s.close()
    # An EndTxn (decoded for the tracker) whose body is garbage.
    s = raw_connect(proxy.bootstrap)
    s.sendall(request_frame(26, 3, 7, b"\xff\xff\xff\xff\xff"))
    assert closed_by_peer(s)
    s.close()
    # A frame cut short by the client hanging up.
    s = raw_connect(proxy.bootstrap)
    s.sendall(struct.pack(">i", 100) + b"partial")
    s.shutdown(socket.SHUT_WR)
    assert closed_by_peer(s)
    s.close()

    deadline = time.monotonic() + 5
    while metric_value(proxy, "kproxy_protocol_errors_total", reason="truncated_frame") < 1 and time.monotonic() < deadline:
        time.sleep(0.1)
    for reason in ("negative_length", "frame_too_large", "truncated_frame"):
        assert metric_value(proxy, "kproxy_protocol_errors_total", reason=reason) >= 1, reason
    assert metric_value(proxy, "kproxy_protocol_errors_total", reason="undecodable") >= 2
    log = proxy.log_text()
    assert "negative frame length -5" in log and "exceeds the limit of 4096 bytes" in log
    assert "truncated frame" in log

    assert proxy.alive()
    bystander.sendall(request_frame(18, 0, 1, b""))  # ApiVersions v0 still answered
    size = struct.unpack(">i", bystander.recv(4))[0]
    assert size > 0
    assert produce_works(proxy.bootstrap, topic_name)


class RecordingUpstream(ScriptedUpstream):
    """A TCP peer that records every byte it receives (to check byte-exact passthrough)."""

    def __init__(self) -> None:
        self.connections: list[bytearray] = []  # bytes received, one entry per connection
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        received = bytearray()
        self.connections.append(received)
        while data := conn.recv(65536):
            received += data


def test_unknown_apis_pass_through_byte_exact(proxy_factory) -> None:
    with RecordingUpstream() as upstream:
        proxy = proxy_factory(*SILENT_UPSTREAM, upstream=upstream.address)
        frames = (
            request_frame(9999, 3, 1, b"opaque body \x00\x01")  # unknown API key
            + request_frame(0, 2, 2, b"\x00\x01\x00\x00\x03\xe8\x00\x00\x00\x00")  # Produce v2: no decoder
            + request_frame(3, 99, 3, b"future version")  # unknown version of a known API
        )
        s = raw_connect(proxy.bootstrap)
        for i in range(0, len(frames), 7):  # dribble the bytes to cross frame boundaries
            s.sendall(frames[i : i + 7])
            time.sleep(0.001)
        # The proxy's own broker discovery is a separate connection; find the client's.
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline:
            mine = [c for c in upstream.connections if c.startswith(frames[:10])]
            if mine and len(mine[0]) >= len(frames):
                break
            time.sleep(0.05)
        assert mine and bytes(mine[0]) == frames
        s.close()


def test_unreachable_broker_disconnects_client_with_reason(proxy_factory) -> None:
    dead_port = free_port()
    proxy = proxy_factory("--connect-timeout", "2", upstream=f"127.0.0.1:{dead_port}")
    s = raw_connect(proxy.bootstrap)
    s.sendall(request_frame(18, 0, 1, b""))
    assert closed_by_peer(s)
    deadline = time.monotonic() + 5
    while "unreachable" not in proxy.log_text() and time.monotonic() < deadline:
        time.sleep(0.1)
    assert f"127.0.0.1:{dead_port}" in proxy.log_text() and "unreachable" in proxy.log_text()
    assert metric_value(proxy, "kproxy_connections_closed_total", side="client", reason="upstream_unreachable") >= 1
    assert proxy.alive()


def test_broker_death_disconnects_its_clients_and_proxy_keeps_working(proxy_factory, tmp_path, topic_name) -> None:
    doomed = start_broker(log_path=tmp_path / "doomed.log")
    try:
        proxy = proxy_factory(upstream=doomed.bootstrap)
        assert produce_works(proxy.bootstrap, topic_name)
        s = raw_connect(proxy.bootstrap)
        s.sendall(request_frame(18, 0, 1, b""))
        assert struct.unpack(">i", s.recv(4))[0] > 0
        s.recv(65536)
        doomed.stop()
        assert closed_by_peer(s), "a client of a dead broker must see a disconnect"
        assert proxy.alive()
        health = httpx.get(f"{proxy.admin_url}/healthz", timeout=5)
        assert health.status_code == 200
    finally:
        doomed.stop()
