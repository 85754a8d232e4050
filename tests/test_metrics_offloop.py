"""`/metrics` renders off the event loop, and scrapes that arrive together share one render.

A collector that blocks until the test lets it go stands for a slow render:
while it blocks, the loop must keep answering (here `/healthz` through the
same app); were the render on the loop, the collector would wait for a
release only the loop can give and the test would fail, not time out on a
clock. The render's cost on a real data path is measured by
scripts/metrics-scrape-cost.py (docs/reliability.md), not here.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator

import httpx
import trio
import trio.testing
from prometheus_client import CollectorRegistry
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from kproxy.io.admin import admin_app
from kproxy.io.config import ProxyConfig
from kproxy.io.proxy import Proxy
from kproxy.obs import metrics
from kproxy.obs.metrics import SharedRender
from kproxy.protocol.broker_addresses import Endpoint

ADMIN = "127.0.0.1:19080"


class Gate(Collector):
    """A collector that blocks each render until released; notes the thread it ran on."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.threads: list[int] = []
        self.renders = 0

    def describe(self) -> list[GaugeMetricFamily]:
        # Registering asks for the names; without this, registering would collect (and block).
        return [self._family(0)]

    def collect(self) -> Iterator[GaugeMetricFamily]:
        self.renders += 1
        self.threads.append(threading.get_ident())
        self.entered.set()
        released = self.release.wait(30)  # bounded only so a broken build fails instead of hanging
        yield self._family(1 if released else 0)

    @staticmethod
    def _family(value: int) -> GaugeMetricFamily:
        return GaugeMetricFamily("kproxy_test_gate_released", "1 once the test released the render.", value=value)


def make_proxy() -> Proxy:
    return Proxy(ProxyConfig(
        upstreams=[Endpoint("127.0.0.1", 9)],
        listen=Endpoint("127.0.0.1", 19092),
        advertise_host="127.0.0.1",
        broker_port_base=19093,
        admin=Endpoint("127.0.0.1", 19080),
    ))


def test_the_loop_answers_other_requests_while_a_scrape_renders() -> None:
    gate = Gate()
    app = admin_app(make_proxy(), lambda: None)
    metrics.REGISTRY.register(gate)
    answers: dict[str, httpx.Response] = {}

    async def main() -> int:
        async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url=f"http://{ADMIN}") as client:
            async def scrape() -> None:
                answers["metrics"] = await client.get("/metrics")

            async with trio.open_nursery() as nursery:
                nursery.start_soon(scrape)
                await trio.to_thread.run_sync(gate.entered.wait, 30)
                # The render is under way and blocked: the loop still serves.
                answers["healthz"] = await client.get("/healthz")
                assert "metrics" not in answers
                gate.release.set()
        return threading.get_ident()

    try:
        loop_thread = trio.run(main)
    finally:
        metrics.REGISTRY.unregister(gate)
        gate.release.set()
    assert answers["healthz"].status_code in (200, 503)  # answered while the render was blocked
    assert answers["metrics"].status_code == 200
    assert "kproxy_test_gate_released 1.0" in answers["metrics"].text
    assert "kproxy_frames_total" in answers["metrics"].text
    assert gate.threads and loop_thread not in gate.threads


def test_scrapes_arriving_during_a_render_share_the_next_one() -> None:
    registry = CollectorRegistry()
    gate = Gate()
    registry.register(gate)
    prepared: list[int] = []
    shared = SharedRender(registry, prepare=lambda: prepared.append(threading.get_ident()))
    bodies: list[bytes] = []

    async def main() -> int:
        async def scrape() -> None:
            bodies.append(await shared.latest())

        async with trio.open_nursery() as nursery:
            nursery.start_soon(scrape)
            await trio.to_thread.run_sync(gate.entered.wait, 30)
            for _ in range(4):
                nursery.start_soon(scrape)
            await trio.testing.wait_all_tasks_blocked()  # the four are waiting behind the first render
            gate.release.set()
        return threading.get_ident()

    try:
        loop_thread = trio.run(main)
    finally:
        gate.release.set()
    assert len(bodies) == 5 and all(b"kproxy_test_gate_released 1.0" in body for body in bodies)
    # The first scrape's own render, then one for the four that came while it ran.
    assert gate.renders == shared.renders == 2
    # `prepare` ran on the loop, before each render; the renders did not.
    assert prepared == [loop_thread, loop_thread]
    assert loop_thread not in gate.threads


def test_a_scrape_never_reads_a_render_older_than_itself() -> None:
    registry = CollectorRegistry()
    counter = metrics.Counter("kproxy_test_ticks", "Ticks.", registry=registry)
    shared = SharedRender(registry, idle_ratio=0.0)

    async def main() -> list[bytes]:
        seen = []
        for _ in range(3):
            counter.inc()
            seen.append(await shared.latest())
        return seen

    seen = trio.run(main)
    assert [b"kproxy_test_ticks_total 1.0" in seen[0], b"kproxy_test_ticks_total 2.0" in seen[1],
            b"kproxy_test_ticks_total 3.0" in seen[2]] == [True, True, True]
    assert shared.renders == 3
