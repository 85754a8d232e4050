"""start_proxy: a port another process takes between its pick and the proxy's bind costs one more start, not a failure."""

from __future__ import annotations

import socket

import pytest

import kproxy.proxy_process as proxy_process
from kproxy.brokers.process import free_port, free_port_block


@pytest.fixture
def taken_port():
    """A port something else listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_proxy_whose_port_was_taken_starts_again_on_another(tmp_path, monkeypatch, taken_port):
    picks = taken_first(monkeypatch, "free_port_block", taken_port, free_port_block)
    log = tmp_path / "proxy.log"
    proxy = proxy_process.start_proxy("127.0.0.1:1", log_path=log)
    try:
        assert len(picks) == 2 and proxy.listen_port != taken_port and proxy.alive()
        said = log.read_text()
        assert f"127.0.0.1:{taken_port}" in said and "Address already in use" in said  # the first try, logged
        with socket.create_connection(("127.0.0.1", proxy.listen_port), timeout=5):
            pass
    finally:
        proxy.stop()


def test_a_port_taken_every_time_is_an_error_naming_it(tmp_path, monkeypatch, taken_port):
    monkeypatch.setattr(proxy_process, "free_port_block", lambda host: taken_port)
    with pytest.raises(RuntimeError, match="Address already in use"):
        proxy_process.start_proxy("127.0.0.1:1", log_path=tmp_path / "proxy.log")


@pytest.fixture
def foreign_admin():
    """A port another kproxy's admin API seems to answer on: /healthz names a proxy of another process."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class Healthz(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            body = json.dumps({"status": "ok", "proxy_id": "0badc0de"}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Healthz)
    serving = threading.Thread(target=server.serve_forever, daemon=True)
    serving.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_a_proxy_whose_admin_port_another_process_answers_on_starts_again(tmp_path, monkeypatch, foreign_admin):
    # The other process answers on the port: waiting for the port to answer would take it for the proxy's.
    picks = taken_first(monkeypatch, "free_port", foreign_admin, free_port)
    proxy = proxy_process.start_proxy("127.0.0.1:1", log_path=tmp_path / "proxy.log")
    try:
        assert len(picks) == 2 and proxy.admin_port != foreign_admin and proxy.alive()
        named = proxy_process.given_proxy_id(tuple(proxy.process.args))
        assert named and proxy_process.admin_proxy_id("127.0.0.1", proxy.admin_port) == named
    finally:
        proxy.stop()


def test_a_proxy_id_given_is_the_one_its_admin_api_must_name(tmp_path):
    proxy = proxy_process.start_proxy("127.0.0.1:1", "--proxy-id", "named-in-the-test", log_path=tmp_path / "proxy.log")
    try:
        assert proxy_process.admin_proxy_id("127.0.0.1", proxy.admin_port) == "named-in-the-test"
    finally:
        proxy.stop()


def taken_first(monkeypatch, picker: str, taken: int, then) -> list[str]:  # noqa: ANN001 - pytest's monkeypatch
    """start_proxy's `picker` gives `taken` first and `then`'s ports after; returns the hosts asked for."""
    picks: list[str] = []

    def pick(host: str) -> int:
        picks.append(host)
        return taken if len(picks) == 1 else then(host)

    monkeypatch.setattr(proxy_process, picker, pick)
    return picks
