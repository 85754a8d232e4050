"""A cause that repeats logs one line per interval with a count, not one line (or traceback) each time."""

from __future__ import annotations

import logging
import socket
import struct
import time

from kproxy.obs.logs import LogEvery, OncePerInterval


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_one_line_per_cause_per_interval_with_the_count_of_the_rest() -> None:
    clock = Clock()
    every = LogEvery(10.0, clock)
    assert every.due("broker-a") == 0  # the first is always logged
    assert [every.due("broker-a") for _ in range(5)] == [None] * 5
    assert every.due("broker-b") == 0  # another cause has its own line
    clock.now += 10.0
    assert every.due("broker-a") == 5
    assert every.suffix(5) == " (5 more since the last report; at most one a 10 s)"
    assert every.due("broker-a") is None


def test_a_library_error_in_a_loop_logs_once_per_interval_without_its_traceback(caplog) -> None:
    clock = Clock()
    logger = logging.getLogger("test.accept-loop")
    logger.addFilter(OncePerInterval(LogEvery(10.0, clock)))
    with caplog.at_level(logging.ERROR, logger="test.accept-loop"):
        for _ in range(100):  # trio's accept loop at EMFILE: an error with a traceback every 0.1 s
            try:
                raise OSError(24, "Too many open files")
            except OSError:
                logger.error("accept returned %s (%s); retrying in %s seconds", "EMFILE", "100%", 0.1, exc_info=True)  # noqa: G201 (as trio logs it)
            clock.now += 0.1
    assert len(caplog.records) == 1 and caplog.records[0].exc_info is None
    assert caplog.records[0].getMessage() == (
        "accept returned EMFILE (100%); retrying in 0.1 seconds: OSError: [Errno 24] Too many open files")
    clock.now += 1.0  # past the interval
    with caplog.at_level(logging.ERROR, logger="test.accept-loop"):
        logger.error("accept returned %s (%s); retrying in %s seconds", "EMFILE", "x", 0.1)
    assert caplog.records[-1].getMessage().endswith("(99 more since the last report; at most one a 10 s)")


def test_puts_cut_short_log_one_line_and_no_traceback(proxy_factory) -> None:
    proxy = proxy_factory()
    host, port = proxy.admin_url.removeprefix("http://").rsplit(":", 1)
    for _ in range(20):
        with socket.create_connection((host, int(port))) as sock:
            sock.sendall(f"PUT /rules/x HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Type: application/json\r\n"
                         "Content-Length: 1000\r\n\r\n{\"action\":".encode())
            time.sleep(0.01)
    time.sleep(0.5)
    log = proxy.log_text()
    assert log.count("the client closed the connection before its body arrived whole") == 1, log[-3000:]
    assert "Traceback" not in log


def test_clients_refused_while_the_broker_is_down_log_one_line_per_broker(proxy_factory) -> None:
    with socket.socket() as unused:
        unused.bind(("127.0.0.1", 0))
        down = f"127.0.0.1:{unused.getsockname()[1]}"  # bound, never listening: connections are refused
        proxy = proxy_factory(upstream=down)
        body = struct.pack(">hhih", 18, 0, 1, 1) + b"c"  # ApiVersions v0
        for _ in range(200):
            with socket.create_connection((proxy.host, proxy.listen_port)) as client:
                client.sendall(struct.pack(">i", len(body)) + body)
                try:
                    client.recv(16)
                except OSError:
                    pass
        time.sleep(0.3)
        lines = [line for line in proxy.log_text().splitlines() if "is unreachable" in line]
    assert len(lines) == 1, lines[:5]
    assert f"broker {down}" in lines[0]
