"""A client connection's bound on the requests the proxy holds (--max-outstanding-requests).

At the bound the proxy reads no more of that client's requests until one
of its answers has gone back: nothing is dropped or reordered, and a
connection whose answers are stuck behind a dropped request is read on
once its client hangs up. A broker scripted here answers only when told,
so what reached it shows exactly when the proxy read.
"""

from __future__ import annotations

import json
import socket
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path

import httpx

from kproxy.io.backpressure import client_hung_up
from kproxy.proxy_process import ProxyProcess, running_proxy
from tests.fixtures.scripted import ScriptedUpstream

OPAQUE_API = 9999  # unknown to the proxy: forwarded and answered untouched
HEARTBEAT = 12  # known: rules can match it (its body is never decoded here)


def request(corr: int, client_id: bytes = b"raw", api_key: int = OPAQUE_API) -> bytes:
    payload = struct.pack(">hhih", api_key, 0, corr, len(client_id)) + client_id
    return struct.pack(">i", len(payload)) + payload


class AnsweringUpstream(ScriptedUpstream):
    """A broker for requests of OPAQUE_API: records their correlation ids, answers when told (or at once)."""

    def __init__(self, answer_at_once: bool = False) -> None:
        self.answer_at_once = answer_at_once
        self.received: list[int] = []
        self.answered = 0
        self.lock = threading.Lock()
        self.client: socket.socket | None = None
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        buf = b""
        mine = None  # the proxy's own broker discovery connects too: only OPAQUE_API requests are a client's
        while data := conn.recv(65536):
            buf += data
            while len(buf) >= 4 and len(buf) >= 4 + struct.unpack_from(">i", buf)[0]:
                size = struct.unpack_from(">i", buf)[0]
                api_key, _, corr = struct.unpack_from(">hhi", buf, 4)
                buf = buf[4 + size:]
                if mine is None:
                    mine = api_key in (OPAQUE_API, HEARTBEAT)
                    if mine:
                        self.client = conn
                if not mine:
                    continue
                with self.lock:
                    self.received.append(corr)
                if self.answer_at_once:
                    self._send(conn, corr)
        # The proxy passes on a client's half-close: answer what is still unanswered before closing.
        if mine:
            wait_for(lambda: self.answered >= len(self.seen()), timeout=10)

    def _send(self, conn: socket.socket, corr: int) -> None:
        with self.lock:
            conn.sendall(struct.pack(">ii", 4, corr))
            self.answered += 1

    def answer_next(self, n: int = 1) -> None:
        """Answer the next n requests received and not yet answered."""
        assert self.client is not None
        for _ in range(n):
            with self.lock:
                corr = self.received[self.answered]
            self._send(self.client, corr)

    def seen(self) -> list[int]:
        with self.lock:
            return list(self.received)


def wait_for(check: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.02)
    return check()


def read_answers(s: socket.socket, n: int) -> list[int]:
    buf = b""
    while len(buf) < 8 * n:
        data = s.recv(65536)
        assert data, "the proxy closed the connection"
        buf += data
    return [struct.unpack_from(">ii", buf, 8 * i)[1] for i in range(n)]


def connect(bootstrap: str) -> socket.socket:
    host, port = bootstrap.rsplit(":", 1)
    s = socket.create_connection((host, int(port)), timeout=10)
    s.settimeout(10)
    return s


def held(proxy: ProxyProcess) -> dict:
    return httpx.get(f"{proxy.admin_url}/debug/memory?held", timeout=5).json()


def rule_file(tmp_path: Path, rule: dict) -> str:
    path = tmp_path / "rules.yaml"
    path.write_text(json.dumps({"version": 1, "rules": [rule]}))
    return str(path)


def test_at_the_bound_the_proxy_reads_on_only_as_answers_go_back(tmp_path) -> None:
    with AnsweringUpstream() as upstream, running_proxy(
        upstream.address, "--connect-timeout", "2", "--max-outstanding-requests", "3",
        log_path=tmp_path / "kproxy.log",
    ) as proxy:
        s = connect(proxy.bootstrap)
        s.sendall(b"".join(request(corr) for corr in range(1, 11)))  # ten at once, in one read
        assert wait_for(lambda: len(upstream.seen()) >= 3)
        time.sleep(0.5)
        assert upstream.seen() == [1, 2, 3]  # the rest wait in the client's socket
        figures = held(proxy)
        assert figures["paused_connections"] == 1 and figures["exchanges_one_connection"] == 3
        upstream.answer_next()
        assert read_answers(s, 1) == [1]
        assert wait_for(lambda: len(upstream.seen()) >= 4)
        time.sleep(0.3)
        assert upstream.seen() == [1, 2, 3, 4]
        for _ in range(9):
            assert wait_for(lambda: len(upstream.seen()) > upstream.answered)
            upstream.answer_next()
        assert read_answers(s, 9) == list(range(2, 11))  # every answer, in order
        assert upstream.seen() == list(range(1, 11))
        assert held(proxy)["paused_connections"] == 0
        s.close()


def test_no_limit_reads_everything_at_once(tmp_path) -> None:
    with AnsweringUpstream() as upstream, running_proxy(
        upstream.address, "--connect-timeout", "2", "--max-outstanding-requests", "0",
        log_path=tmp_path / "kproxy.log",
    ) as proxy:
        s = connect(proxy.bootstrap)
        s.sendall(b"".join(request(corr) for corr in range(1, 201)))
        assert wait_for(lambda: len(upstream.seen()) == 200)
        upstream.answer_next(200)
        assert read_answers(s, 200) == list(range(1, 201))
        s.close()


def test_answers_stuck_behind_a_dropped_request_pause_the_client_until_it_hangs_up(tmp_path) -> None:
    rules = rule_file(tmp_path, {"id": "lose-it", "match": {"api": "heartbeat", "client_id": "lost"},
                                 "action": {"type": "drop"}})
    with AnsweringUpstream(answer_at_once=True) as upstream, running_proxy(
        upstream.address, "--connect-timeout", "2", "--max-outstanding-requests", "3", "--rules", rules,
        log_path=tmp_path / "kproxy.log",
    ) as proxy:
        s = connect(proxy.bootstrap)
        s.sendall(request(1, b"lost", HEARTBEAT) + b"".join(request(corr) for corr in range(2, 12)))
        # The dropped request and two answers behind it (which cannot go back before it) fill the bound.
        assert wait_for(lambda: len(upstream.seen()) >= 2)
        time.sleep(0.5)
        assert upstream.seen() == [2, 3]
        assert held(proxy)["paused_connections"] == 1
        # The client gives up. Nothing more could be answered on this connection (no answer overtakes
        # the dropped one): it closes at once, without the requests the proxy had not read.
        s.shutdown(socket.SHUT_WR)
        assert wait_for(lambda: held(proxy)["connections"] == 0, timeout=5)
        assert upstream.seen() == [2, 3]
        assert s.recv(100) == b""
        s.close()


def test_a_client_that_half_closes_while_paused_gets_every_answer(tmp_path) -> None:
    with AnsweringUpstream() as upstream, running_proxy(
        upstream.address, "--connect-timeout", "2", "--max-outstanding-requests", "3",
        log_path=tmp_path / "kproxy.log",
    ) as proxy:
        s = connect(proxy.bootstrap)
        s.sendall(b"".join(request(corr) for corr in range(1, 11)))
        assert wait_for(lambda: held(proxy)["paused_connections"] == 1)
        # Forwarded before the pause; the scripted broker may read them a moment later on a loaded machine.
        assert wait_for(lambda: len(upstream.seen()) >= 3)
        assert upstream.seen() == [1, 2, 3]
        # Its hang-up is seen behind the requests it sent before it, which are then read and forwarded.
        s.shutdown(socket.SHUT_WR)
        assert wait_for(lambda: upstream.seen() == list(range(1, 11)), timeout=5)
        upstream.answer_next(10)
        assert read_answers(s, 10) == list(range(1, 11))
        s.close()


def test_a_reset_client_is_seen_while_paused(tmp_path) -> None:
    rules = rule_file(tmp_path, {"id": "lose-it", "match": {"api": "heartbeat", "client_id": "lost"}, "action": {"type": "drop"}})
    with AnsweringUpstream(answer_at_once=True) as upstream, running_proxy(
        upstream.address, "--connect-timeout", "2", "--max-outstanding-requests", "2", "--rules", rules,
        log_path=tmp_path / "kproxy.log",
    ) as proxy:
        s = connect(proxy.bootstrap)
        s.sendall(request(1, b"lost", HEARTBEAT) + b"".join(request(corr) for corr in range(2, 12)))
        assert wait_for(lambda: held(proxy)["paused_connections"] == 1)
        s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        s.close()  # a reset
        assert wait_for(lambda: held(proxy)["connections"] == 0, timeout=5)
        assert proxy.alive()


def test_a_hold_released_by_a_later_request_is_never_starved_by_the_bound(tmp_path) -> None:
    # The hold waits for the client's retry, which comes after more requests than the bound:
    # reading on while it waits lets the retry release it long before its timeout.
    rules = rule_file(tmp_path, {"id": "keep-it", "match": {"api": "heartbeat", "client_id": "retry-me"},
                                 "action": {"type": "hold", "until": "client_retry", "timeout_ms": 30000}})
    with AnsweringUpstream(answer_at_once=True) as upstream, running_proxy(
        upstream.address, "--connect-timeout", "2", "--max-outstanding-requests", "3", "--rules", rules,
        log_path=tmp_path / "kproxy.log",
    ) as proxy:
        s = connect(proxy.bootstrap)
        s.sendall(request(1, b"retry-me", HEARTBEAT) + b"".join(request(corr) for corr in range(2, 8))
                  + request(8, b"retry-me", HEARTBEAT))
        assert wait_for(lambda: 1 in upstream.seen(), timeout=5), upstream.seen()
        assert proxy.alive()
        s.close()


def test_client_hung_up_sees_a_close_behind_unread_bytes() -> None:
    a, b = socket.socketpair()
    with a, b:
        assert not client_hung_up(a)
        b.sendall(b"unread")
        assert not client_hung_up(a)  # bytes to read are not a hang-up
        b.shutdown(socket.SHUT_WR)
        assert client_hung_up(a)  # though the bytes before it are still unread
        assert a.recv(100) == b"unread"
