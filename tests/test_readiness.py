"""/readyz follows the broker, /healthz stays liveness.

A real broker of its own behind a real `kproxy run`: killed, /readyz answers
503 within a second while /healthz stays 200; started again on the same
port, /readyz answers 200 within a second of the broker listening.
"""

from __future__ import annotations

import time

import httpx
import pytest

from kproxy.brokers import start_broker
from kproxy.brokers.process import wait_for_port

pytestmark = pytest.mark.timeout(120)


def seconds_until(url: str, status: int, limit: float) -> float:
    start = time.monotonic()
    while True:
        got = httpx.get(url, timeout=2).status_code
        took = time.monotonic() - start
        if got == status:
            return took
        assert took < limit, f"{url} still {got} after {took:.2f}s"
        time.sleep(0.02)


def test_readyz_follows_the_broker_and_healthz_stays_live(proxy_factory, tmp_path) -> None:
    broker = start_broker(log_path=tmp_path / "broker.log")
    try:
        proxy = proxy_factory(upstream=broker.bootstrap)
        ready = httpx.get(f"{proxy.admin_url}/readyz", timeout=5)
        assert ready.status_code == 200, ready.text
        assert ready.json()["status"] == "ready" and broker.bootstrap in ready.json()["upstreams_reachable"]

        broker.stop()
        assert seconds_until(f"{proxy.admin_url}/readyz", 503, 5) < 1.0
        unready = httpx.get(f"{proxy.admin_url}/readyz", timeout=5).json()
        assert unready["status"] == "unready" and not any(unready["upstreams_reachable"].values())
        assert httpx.get(f"{proxy.admin_url}/healthz", timeout=5).status_code == 200

        broker = start_broker(port=broker.port, log_path=tmp_path / "broker-again.log")
        wait_for_port(broker.host, broker.port, 20)
        assert seconds_until(f"{proxy.admin_url}/readyz", 200, 5) < 1.0
    finally:
        broker.stop()
