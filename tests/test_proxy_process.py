"""start_proxy: a port another process takes between its pick and the proxy's bind costs one more start, not a failure."""

from __future__ import annotations

import socket

import pytest

import kproxy.proxy_process as proxy_process
from kproxy.brokers.process import free_port_block


@pytest.fixture
def taken_port():
    """A port something else listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_proxy_whose_port_was_taken_starts_again_on_another(tmp_path, monkeypatch, taken_port):
    picks = []

    def taken_first(host: str) -> int:
        picks.append(host)
        return taken_port if len(picks) == 1 else free_port_block(host)

    monkeypatch.setattr(proxy_process, "free_port_block", taken_first)
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
