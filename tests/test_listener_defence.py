"""Kafka listeners that defend themselves, against a real `kproxy run` and the real broker.

- A client socket costs no broker connection until it sends a frame.
- A frame stalled half-way is cut after --read-timeout; a connection with
  nothing to say after --idle-timeout, but never one awaiting an answer.
- Out of file descriptors, the accept loop backs off, logs once per interval,
  counts the failures, and serves again once descriptors are free.
"""

from __future__ import annotations

import resource
import socket
import struct
import time
from pathlib import Path

import pytest

from tests.fixtures.proxy import metric_value
from tests.test_proxy_bad_input import raw_connect, request_frame

API_VERSIONS = 18


def api_versions(s: socket.socket, corr: int = 1) -> int:
    """Send an ApiVersions v0 request and read its response; returns the correlation id answered."""
    s.sendall(request_frame(API_VERSIONS, 0, corr, b""))
    head = recv_exactly(s, 8)
    size, answered = struct.unpack(">ii", head)
    recv_exactly(s, size - 4)
    return answered


def recv_exactly(s: socket.socket, n: int) -> bytes:
    data = b""
    while len(data) < n:
        chunk = s.recv(n - len(data))
        if not chunk:
            raise ConnectionError("closed by the proxy")
        data += chunk
    return data


def closed_within(s: socket.socket, seconds: float, since: float | None = None) -> float | None:
    """Seconds from `since` (default: now) until the proxy closed the socket, or None if it stayed open."""
    start = time.monotonic() if since is None else since
    s.settimeout(seconds)
    try:
        while s.recv(65536):
            pass
    except (socket.timeout, TimeoutError):
        return None
    except ConnectionResetError:
        pass
    return time.monotonic() - start


def wait_for_metric(proxy, name: str, value: float, timeout: float = 5.0, **labels: str) -> float:
    deadline = time.monotonic() + timeout
    while (got := metric_value(proxy, name, **labels)) != value and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


def test_idle_sockets_cost_no_broker_connection(proxy_factory) -> None:
    proxy = proxy_factory()
    idle = [raw_connect(proxy.bootstrap) for _ in range(20)]
    assert wait_for_metric(proxy, "kproxy_connections_open", 20, side="client") == 20
    time.sleep(0.3)
    assert metric_value(proxy, "kproxy_connections_opened_total", side="upstream") == 0
    # The first frame opens the broker connection, and it is answered.
    assert api_versions(idle[0], corr=7) == 7
    assert metric_value(proxy, "kproxy_connections_open", side="upstream") == 1
    for s in idle:
        s.close()


def test_a_stalled_frame_is_cut_after_the_read_timeout(proxy_factory) -> None:
    proxy = proxy_factory("--read-timeout", "1", "--idle-timeout", "30")
    # Stalled in the first frame: the broker connection was never opened.
    first = raw_connect(proxy.bootstrap)
    first.sendall(struct.pack(">i", 100) + b"ten bytes.")
    stalled = {first: time.monotonic()}
    # Stalled after a request answered: the timeout sweep cuts it.
    later = raw_connect(proxy.bootstrap)
    assert api_versions(later) == 1
    later.sendall(struct.pack(">i", 100) + b"ten bytes.")
    stalled[later] = time.monotonic()
    for s, since in stalled.items():
        took = closed_within(s, 5, since)
        assert took is not None and 0.9 < took < 3, took
    assert wait_for_metric(proxy, "kproxy_connections_closed_total", 2, side="client", reason="read_timeout") == 2
    assert metric_value(proxy, "kproxy_connections_opened_total", side="upstream") == 1


def test_the_idle_timeout_spares_a_connection_awaiting_an_answer(proxy_factory, tmp_path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text("""\
version: 1
rules:
  - id: slow-answer
    match: {api: api_versions, client_id: waiting}
    action: {type: delay, ms: 3000}
""")
    proxy = proxy_factory("--idle-timeout", "1", "--read-timeout", "30", "--rules", str(rules))
    silent = raw_connect(proxy.bootstrap)  # never says a word
    quiet = raw_connect(proxy.bootstrap)  # says one thing, then nothing
    assert api_versions(quiet) == 1
    waiting = raw_connect(proxy.bootstrap)  # its answer takes 3 s, three idle timeouts
    waiting.sendall(request_frame(API_VERSIONS, 0, 9, b"", b"waiting"))
    for s in (silent, quiet):
        took = closed_within(s, 5)
        assert took is not None and took < 3, took
    waiting.settimeout(10)
    assert struct.unpack(">ii", recv_exactly(waiting, 8))[1] == 9
    assert wait_for_metric(proxy, "kproxy_connections_closed_total", 2, side="client", reason="idle_timeout") == 2
    # Answered, it is idle in turn.
    assert closed_within(waiting, 5) is not None


@pytest.mark.timeout(60)
def test_out_of_descriptors_the_listener_backs_off_and_recovers(proxy_factory) -> None:
    proxy = proxy_factory()
    probe = raw_connect(proxy.bootstrap)
    assert api_versions(probe) == 1
    # Leave the proxy a few descriptors beyond what it holds now.
    in_use = len(list(Path(f"/proc/{proxy.process.pid}/fd").iterdir()))
    soft, hard = resource.prlimit(proxy.process.pid, resource.RLIMIT_NOFILE)
    resource.prlimit(proxy.process.pid, resource.RLIMIT_NOFILE, (in_use + 5, hard))
    flood = []
    for _ in range(40):  # the kernel completes these handshakes; the proxy cannot accept most of them
        flood.append(socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=5))
    time.sleep(3)
    reports = proxy.log_text().count("accept failed on")
    assert 1 <= reports <= 2, proxy.log_text()[-2000:]  # once per 10 s interval, not per failure
    for s in flood:
        s.close()
    resource.prlimit(proxy.process.pid, resource.RLIMIT_NOFILE, (soft, hard))
    # (The admin API shares the descriptors: it is asked only now.)
    assert metric_value(proxy, "kproxy_accept_errors_total", reason="EMFILE") >= 2
    # The backlog drains (those clients are gone) and a new client is served.
    deadline = time.monotonic() + 10
    while True:
        try:
            s = raw_connect(proxy.bootstrap)
            assert api_versions(s, corr=5) == 5
            break
        except (ConnectionError, OSError):
            assert time.monotonic() < deadline
            time.sleep(0.2)
    assert api_versions(probe, corr=2) == 2  # the connection that was open all along still works
    assert proxy.alive()
