"""The rule store's HTTP routes, mounted by the proxy's admin server.

They live next to the engine so the proxy and the tests serve the very same
API. Routes (JSON in and out):

    GET    /rules               {"rules": [...], "phase": name | null}
    PUT    /rules/{id}          body: one rule as in YAML -> 200 rule | 400 {"error"} | 413 {"error"}
    POST   /rules/{id}/enable   -> 200 rule | 404 {"error"}
    POST   /rules/{id}/disable  -> 200 rule | 404 {"error"}
    DELETE /rules/{id}          -> 200 {"deleted": id} | 404 {"error"}
    POST   /rules/reset         -> 200 {"reset": true}
    POST   /rules/reload        -> 200 {"reloaded": true, "rules": n} | 400 {"error"}

The engine is single-threaded by design: the proxy runs these handlers on the
same trio loop that calls `decide`, so no lock is needed. A body is read
only up to `MAX_DOCUMENT_BYTES` and checked whole before the engine changes,
so a refused request changes nothing; parsing and validating it (tens of ms
for a large one) run on a worker thread so the loop keeps moving traffic.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from starlette.concurrency import run_in_threadpool
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route

from kproxy.faults.engine import FaultEngine
from kproxy.faults.errors import RuleFileError
from kproxy.faults.json_source import read_json
from kproxy.faults.limits import MAX_DOCUMENT_BYTES

EngineGetter = Callable[[], FaultEngine]
# Re-reads the rule file and installs it; raises RuleFileError to refuse it. May be async.
ReloadCallback = Callable[[], Any]


def rules_routes(
    engine_getter: EngineGetter,
    reload_callback: ReloadCallback,
    *,
    clock: Callable[[], float] | None = None,
    on_change: Callable[[], None] | None = None,
) -> list[Route]:
    """Starlette routes for the rule store.

    `clock` (monotonic seconds, the clock the proxy gives `decide`) lets
    `GET /rules` report the phase now; without it the phase as of the last
    decision is reported. `on_change` runs after every accepted change, for
    example to refresh the rules-loaded gauge.
    """

    def changed() -> None:
        if on_change is not None:
            on_change()

    async def list_rules(request: Request) -> JSONResponse:
        engine = engine_getter()
        phase = engine.active_phase(clock() if clock is not None else None)
        return JSONResponse({"rules": engine.list_rules(), "phase": phase})

    async def put_rule(request: Request) -> JSONResponse:
        rule_id = request.path_params["rule_id"]
        raw = await _read_bounded_body(request, MAX_DOCUMENT_BYTES)
        if raw is None:
            return _error(413, f"the body is larger than {MAX_DOCUMENT_BYTES} bytes")
        try:
            body = await run_in_threadpool(read_json, raw or b"null", f"rule {rule_id!r}")
        except RuleFileError as exc:
            return _error(400, str(exc))
        if not isinstance(body, dict):
            return _error(400, "the body must be one rule, a JSON object")
        body = dict(body)
        # `counters` is what GET /rules shows; accepting it back lets a listed rule be PUT as is.
        body.pop("counters", None)
        body.setdefault("id", rule_id)
        if body["id"] != rule_id:
            return _error(400, f"the rule's id {body['id']!r} differs from the URL's {rule_id!r}")
        engine = engine_getter()
        try:
            checked = await run_in_threadpool(engine.check_rule, body)
            # Back on the loop; install_rule checks the phases again, which a reload may have changed meanwhile.
            described = engine.install_rule(checked)
        except RuleFileError as exc:
            return _error(400, str(exc))
        changed()
        return JSONResponse(described)

    def set_enabled(enabled: bool) -> Callable[[Request], Any]:
        async def handler(request: Request) -> JSONResponse:
            rule_id = request.path_params["rule_id"]
            engine = engine_getter()
            try:
                engine.set_enabled(rule_id, enabled)
            except KeyError:
                return _unknown(rule_id)
            changed()
            return JSONResponse(engine.get_rule(rule_id))

        return handler

    async def delete_rule(request: Request) -> JSONResponse:
        rule_id = request.path_params["rule_id"]
        try:
            engine_getter().delete_rule(rule_id)
        except KeyError:
            return _unknown(rule_id)
        changed()
        return JSONResponse({"deleted": rule_id})

    async def reset(request: Request) -> JSONResponse:
        engine_getter().reset_counters()
        return JSONResponse({"reset": True})

    async def reload(request: Request) -> JSONResponse:
        try:
            result = reload_callback()
            if inspect.isawaitable(result):
                await result
        except RuleFileError as exc:
            return _error(400, str(exc))
        changed()
        return JSONResponse({"reloaded": True, "rules": len(engine_getter().list_rules())})

    return [
        Route("/rules", list_rules, methods=["GET"]),
        Route("/rules/reset", reset, methods=["POST"]),
        Route("/rules/reload", reload, methods=["POST"]),
        Route("/rules/{rule_id}", put_rule, methods=["PUT"]),
        Route("/rules/{rule_id}", delete_rule, methods=["DELETE"]),
        Route("/rules/{rule_id}/enable", set_enabled(True), methods=["POST"]),
        Route("/rules/{rule_id}/disable", set_enabled(False), methods=["POST"]),
    ]


async def _read_bounded_body(request: Request, limit: int) -> bytes | None:
    """The body, or None as soon as it is known to exceed `limit` bytes (the rest is never read)."""
    if declares_more_than(request.headers.get("content-length"), limit):
        return None
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            return None
        chunks.append(chunk)
    return b"".join(chunks)


def declares_more_than(content_length: str | None, limit: int) -> bool:
    """Does this Content-Length header declare a body of more than `limit` bytes?"""
    declared = (content_length or "").strip()
    # Compared as text first: no body we take has a length of more than ten digits.
    return len(declared) > 10 or (declared.isdigit() and int(declared) > limit)


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _unknown(rule_id: str) -> JSONResponse:
    return _error(404, f"no rule has id {rule_id!r}")
