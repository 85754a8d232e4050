"""Who may call the admin API: Host and Origin checks, and a bearer token.

The admin API changes what the proxy does to traffic, so it must not obey a
web page the operator happens to have open, nor anyone on the network
(docs/security.md):

- A request whose `Origin` is not the admin API's own (a browser page of
  another site, or `Origin: null`) is refused (403). We serve no pages, so
  no browser has a reason to call us across sites.
- On a loopback listener the `Host` must be a loopback name (localhost,
  127.0.0.1, [::1]): a DNS-rebinding page reaches 127.0.0.1 under its own
  name, which is refused (403). A listener other machines can reach has no
  fixed name (containers and scrapers call it by theirs), so there the
  token is what keeps strangers out.
- With a token, every route but /metrics, /healthz and /readyz needs
  `Authorization: Bearer TOKEN` (401 otherwise). A listener beyond loopback
  must have one: `check_exposure` refuses to start without it.
"""

from __future__ import annotations

import hmac
import ipaddress
import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any
from urllib.parse import urlsplit

from starlette.datastructures import Headers
from starlette.requests import ClientDisconnect
from starlette.responses import JSONResponse

from kproxy.obs.logs import LogEvery

log = logging.getLogger("kproxy.admin")

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
App = Callable[[Scope, Receive, Send], Awaitable[None]]

# Monitoring reads these without the token: Prometheus and health checks
# should not need the key that changes the rules.
OPEN_PATHS = frozenset({"/metrics", "/healthz", "/readyz"})


class AdminExposureError(ValueError):
    """The admin API would be reachable from other machines without a token."""


def is_loopback(host: str) -> bool:
    """Is `host` (a name or address, IPv6 without brackets) reachable only from this machine?"""
    if host.lower() == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # another name may resolve anywhere


def check_exposure(host: str, port: int, token: str | None) -> None:
    """AdminExposureError unless the listener is on loopback or has a token."""
    if token is None and not is_loopback(host):
        shown = f"[{host}]" if ":" in host else host
        raise AdminExposureError(
            f"the admin API on {shown}:{port} would let anyone who can reach it change the fault rules: "
            "give it a bearer token with --admin-token-file FILE (or --generate-admin-token), "
            "or bind it to loopback (--admin 127.0.0.1:PORT)"
        )


class AdminGuard:
    """ASGI middleware in front of the admin app that refuses requests the rules above forbid."""

    def __init__(self, app: App, *, token: str | None, loopback: bool) -> None:
        self.app = app
        self.token = token.encode() if token is not None else None
        self.loopback = loopback
        self.cut_short = LogEvery()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            refusal = self.refusal(scope["path"], Headers(scope=scope))
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        try:
            await self.app(scope, receive, send)
        except ClientDisconnect:
            # A body cut short changed nothing (a body is checked whole before any
            # change) and there is no one left to answer: one line, not a traceback.
            quiet = self.cut_short.due("cut short")
            if quiet is not None:
                log.warning("admin API: %s %s: the client closed the connection before its body arrived whole; "
                            "nothing changed%s", scope.get("method"), scope.get("path"), self.cut_short.suffix(quiet))

    def refusal(self, path: str, headers: Headers) -> JSONResponse | None:
        host = headers.get("host")
        if host is not None and self.loopback and not is_loopback(_hostname(host)):
            return _refuse(403, f"Host {host!r} does not name this admin API, which listens on loopback only")
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin, host):
            return _refuse(403, f"cross-site request refused (Origin {origin!r})")
        if self.token is not None and path not in OPEN_PATHS and not self._authorised(headers.get("authorization")):
            response = _refuse(401, "this admin API needs its bearer token (kproxy rules --admin-token-file FILE)")
            response.headers["WWW-Authenticate"] = "Bearer"
            return response
        return None

    def _authorised(self, authorization: str | None) -> bool:
        assert self.token is not None
        scheme, _, credentials = (authorization or "").partition(" ")
        # compare_digest: how long a comparison takes says nothing about the token.
        return scheme.lower() == "bearer" and hmac.compare_digest(credentials.strip().encode(), self.token)


def _hostname(host_header: str) -> str:
    """`example:80` -> `example`, `[::1]:80` -> `::1`."""
    if host_header.startswith("["):
        return host_header[1:].partition("]")[0]
    return host_header.rpartition(":")[0] if host_header.count(":") == 1 else host_header


def _same_origin(origin: str, host: str | None) -> bool:
    try:
        parts = urlsplit(origin)
    except ValueError:
        return False
    return parts.scheme in ("http", "https") and host is not None and parts.netloc.lower() == host.lower()


def _refuse(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)
