"""Admin HTTP: /metrics, /healthz, /readyz, /txns, /debug/memory and the rules API, served on trio
behind `AdminGuard`, with oversized bodies refused and unread ones drained (`kproxy.io.admin_body`)."""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING

import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from kproxy.faults.admin_routes import rules_routes
from kproxy.io.admin_body import DrainUnreadBody, RefuseOversizedBody
from kproxy.io.admin_guard import AdminGuard, check_exposure, is_loopback
from kproxy.obs import metrics
from kproxy.obs.memory import memory_figures, object_counts, traced_lines

if TYPE_CHECKING:
    from kproxy.io.proxy import Proxy

log = logging.getLogger("kproxy.admin")


def admin_app(proxy: Proxy, reload_rules: Callable[[], Awaitable[None] | None]) -> DrainUnreadBody:
    # Rendered on a worker thread, shared by the scrapes that arrive together (kproxy.obs.metrics).
    rendered = metrics.SharedRender(metrics.REGISTRY, prepare=proxy.flush_txn_stats)

    async def metrics_endpoint(request: Request) -> Response:
        return Response(await rendered.latest(), media_type=CONTENT_TYPE_LATEST)

    async def healthz(request: Request) -> JSONResponse:
        ok = proxy.started.is_set()
        return JSONResponse(
            {
                "status": "ok" if ok else "starting",
                "proxy_id": proxy.config.proxy_id,
                "connections": len(proxy.connections),
                "brokers": {str(n): str(e) for n, e in sorted(proxy.addresses.upstream.items())},
                "listeners": sorted(proxy.listeners),
                "guard": proxy.config.guard,
                "tracing": proxy.trace is not None,
            },
            status_code=200 if ok else 503,
        )

    async def readyz(request: Request) -> JSONResponse:
        # Readiness, not liveness: a proxy whose brokers are all unreachable can only
        # refuse clients, so a load balancer should send them elsewhere meanwhile.
        ready, brokers = await proxy.readiness()
        return JSONResponse(
            {
                "status": "ready" if ready else "unready",
                "upstreams_reachable": {name: why is None for name, why in brokers.items()},
                "upstream_errors": {name: why for name, why in brokers.items() if why is not None},
            },
            status_code=200 if ready else 503,
        )

    async def txns(request: Request) -> JSONResponse:
        stats = proxy.tracker.stats()
        return JSONResponse(
            {
                "producers": proxy.tracker.snapshot(),
                "stats": {
                    "producers": stats.producers,
                    "open_client": stats.open_client,
                    "open_broker": stats.open_broker,
                    "hazards_by_kind": stats.hazards_by_kind,
                    "opened_client": stats.opened_client,
                    "opened_broker": stats.opened_broker,
                },
                "guard": proxy.config.guard,
            }
        )

    async def debug_memory(request: Request) -> JSONResponse:
        # Which allocator holds the process's memory (kproxy.obs.memory); read on the loop, a few milliseconds.
        # With the requests the proxy holds (in flight to the brokers; awaiting their turn to go back
        # to the client), whose peaks a soak ties its memory's steps to.
        # ?types=N adds the N most numerous types of tracked objects (a walk of them all: debugging only).
        # Most on one connection, and the connections that stopped reading at their bound
        # (--max-outstanding-requests).
        per_connection = [len(c.order) for c in proxy.connections]
        held = {"in_flight": proxy.in_flight_count(), "connections": len(per_connection),
                "exchanges": sum(per_connection), "exchanges_one_connection": max(per_connection, default=0),
                "paused_connections": sum(c.paused for c in proxy.connections)}
        if "held" in request.query_params:  # the requests held alone: cheap enough to ask every second
            return JSONResponse(held)
        figures = {**memory_figures(), **held}
        if (types := request.query_params.get("types", "")).isdigit():
            figures["types"] = object_counts(int(types))
        # ?traced=N: the N source lines holding the most memory, when tracemalloc runs (PYTHONTRACEMALLOC=1).
        if (traced := request.query_params.get("traced", "")).isdigit():
            figures["traced"] = traced_lines(int(traced))
        return JSONResponse(figures)

    routes = [
        Route("/metrics", metrics_endpoint),
        Route("/debug/memory", debug_memory),
        Route("/healthz", healthz),
        Route("/readyz", readyz),
        Route("/txns", txns),
        *rules_routes(lambda: proxy.engine, reload_rules, clock=proxy.clock, on_change=proxy.rules_changed),
    ]
    endpoint = proxy.config.admin
    loopback = endpoint is not None and is_loopback(endpoint.host)
    # Who may call comes first (403, 401), then the body's declared size (413); every answer given before
    # the body ended is finished only after the rest is drained, so the client can read it.
    guarded = AdminGuard(RefuseOversizedBody(Starlette(routes=routes)), token=proxy.config.admin_token,
                         loopback=loopback)
    return DrainUnreadBody(guarded)


async def serve_admin(
    proxy: Proxy,
    reload_rules: Callable[[], Awaitable[None] | None],
    *,
    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED,
) -> None:
    endpoint = proxy.config.admin
    assert endpoint is not None
    # `kproxy run` checks this before anything starts; here it holds for every other caller too.
    check_exposure(endpoint.host, endpoint.port, proxy.config.admin_token)
    config = HypercornConfig()
    host = f"[{endpoint.host}]" if ":" in endpoint.host else endpoint.host
    config.bind = [f"{host}:{endpoint.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("kproxy.admin.http")
    config.graceful_timeout = 1.0
    log.info("admin HTTP on http://%s:%d (/metrics, /healthz, /readyz, /txns, /rules, /debug/memory)%s",
             endpoint.host, endpoint.port,
             "; the rules API, /txns and /debug/memory need the bearer token" if proxy.config.admin_token else "")
    await hypercorn_serve(admin_app(proxy, reload_rules), config, task_status=task_status)
