"""Bodies the admin API will not read: 413 at once, and the rest discarded so that the client hears it.

An HTTP/1.1 client that sends a body writes all of it before it reads the
answer (urllib, curl without `Expect: 100-continue`, most scripts). A server
that answers early and closes with the body still arriving resets the
connection, and such a client sees "connection reset" or "broken pipe"
instead of the answer. So, as nginx's lingering close does, the answer goes
out first (413 as soon as the declared length is over the limit, before a
byte of the body is read), then what is left of the body is read and thrown
away, a chunk at a time and never kept, for a bounded time, and only then is
the answer finished and the connection closed. A client that keeps sending
past that bound is cut off, as before.

The same holds for any answer a route gives without reading the body (401,
403, 404): the connection ends cleanly for them too.
"""

from __future__ import annotations

import logging
from collections.abc import MutableMapping
from typing import Any

import trio
from starlette.datastructures import Headers
from starlette.responses import JSONResponse

from kproxy.faults.admin_routes import declares_more_than
from kproxy.faults.limits import MAX_DOCUMENT_BYTES
from kproxy.io.admin_guard import App, Receive, Scope, Send
from kproxy.obs.logs import LogEvery

log = logging.getLogger("kproxy.admin")

Message = MutableMapping[str, Any]

# How long an unread body is drained after the answer (nginx's lingering_time),
# and how long a silent client is waited for meanwhile (its lingering_timeout).
DRAIN_SECONDS = 30.0
DRAIN_IDLE_SECONDS = 5.0


class RefuseOversizedBody:
    """ASGI middleware: 413 for a body declared longer than `limit` bytes, before a byte of it is read."""

    def __init__(self, app: App, *, limit: int = MAX_DOCUMENT_BYTES) -> None:
        self.app = app
        self.limit = limit

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and declares_more_than(Headers(scope=scope).get("content-length"), self.limit):
            # Connection: close, as the rest of the body is read only to be thrown away (DrainUnreadBody).
            refusal = JSONResponse({"error": f"the body is larger than {self.limit} bytes"}, status_code=413,
                                   headers={"Connection": "close"})
            await refusal(scope, receive, send)
            return
        await self.app(scope, receive, send)


class DrainUnreadBody:
    """ASGI middleware, outermost: an answer given before the request's body ended is finished only once
    the rest of the body has been read and discarded (within bounds), so the client can read it."""

    def __init__(self, app: App, *, drain_seconds: float = DRAIN_SECONDS,
                 drain_idle_seconds: float = DRAIN_IDLE_SECONDS) -> None:
        self.app = app
        self.drain_seconds = drain_seconds
        self.drain_idle_seconds = drain_idle_seconds
        self.cut_off = LogEvery()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _RequestBody(receive)
        await self.app(scope, body.receive, _FinishAfterDrain(send, body, self, scope).send)

    async def drain(self, body: _RequestBody, scope: Scope) -> None:
        """Read and discard what is left of the request body, within the bounds."""
        discarded = 0
        with trio.move_on_after(self.drain_seconds) as overall:
            while not body.done:
                with trio.move_on_after(self.drain_idle_seconds) as idle:
                    message = await body.receive()
                if idle.cancelled_caught:
                    break
                discarded += len(message.get("body", b""))
        if not body.done:
            quiet = self.cut_off.due("cut off")
            if quiet is not None:
                waited = "its time" if overall.cancelled_caught else "a pause"
                log.warning("admin API: %s %s: the body was still arriving after %s (%d bytes discarded); "
                            "the connection is closed%s", scope.get("method"), scope.get("path"), waited, discarded,
                            self.cut_off.suffix(quiet))


class _RequestBody:
    """The request's receive channel, remembering whether the body has ended."""

    def __init__(self, receive: Receive) -> None:
        self._receive = receive
        self.done = False

    async def receive(self) -> Message:
        message = await self._receive()
        if message["type"] == "http.disconnect" or (message["type"] == "http.request"
                                                     and not message.get("more_body", False)):
            self.done = True
        return message


class _FinishAfterDrain:
    """Sends the answer as it comes, but holds its end until the unread body is drained."""

    def __init__(self, send: Send, body: _RequestBody, drainer: DrainUnreadBody, scope: Scope) -> None:
        self._send = send
        self._body = body
        self._drainer = drainer
        self._scope = scope

    async def send(self, message: Message) -> None:
        final = message["type"] == "http.response.body" and not message.get("more_body", False)
        if not final or self._body.done:
            await self._send(message)
            return
        # The answer's bytes go out now (the client may read them while it sends); its end waits.
        await self._send({**message, "more_body": True})
        await self._drainer.drain(self._body, self._scope)
        await self._send({"type": "http.response.body", "body": b"", "more_body": False})
