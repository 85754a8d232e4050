"""The slow path: everything the proxy does beyond reading headers.

A request comes here when its API needs it (transactional APIs for the
tracker, APIs some fault rule wants, everything when tracing) and a response
when it names brokers, caps versions, or belongs to a request that came here.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kproxy.io.exchange import Exchange
from kproxy.obs import metrics
from kproxy.protocol import apis
from kproxy.protocol.codec import DecodeError, decode_response, encode_response, response_correlation_id
from kproxy.protocol.produce_peek import produce_acks, produce_transactional_id
from kproxy.protocol.rewrite import ADDRESS_APIS, LEADER_HINT_MIN_VERSION, cap_api_versions, rewrite_addresses

if TYPE_CHECKING:
    from kproxy.io.connection import ClientConnection
    from kproxy.io.proxy import Proxy

log = logging.getLogger("kproxy.inspect")


class Inspector:
    def __init__(self, proxy: Proxy) -> None:
        self.proxy = proxy
        self.slow_request_apis: frozenset[int] = frozenset()
        # api key -> lowest version whose responses must be looked at
        self.inspect_responses_from: dict[int, int] = {}
        self.refresh()

    def refresh(self) -> None:
        """Recompute which APIs leave the fast path (rules or tracing changed)."""
        slow: set[int] = set()
        responses = {key: 0 for key in ADDRESS_APIS}
        responses[apis.API_VERSIONS] = 0
        responses.update(LEADER_HINT_MIN_VERSION)
        self.slow_request_apis = frozenset(slow)
        self.inspect_responses_from = responses

    # ------------------------------------------------------------------ requests

    def produce_is_plain(self, payload: bytes, start: int, header, ex: Exchange) -> bool:  # noqa: ANN001
        """Fast-path check for Produce: non-transactional, and note acks=0."""
        try:
            if produce_transactional_id(payload, start, header) is not None:
                return False
            if produce_acks(payload, start, header) == 0:
                ex.expects_response = False
        except DecodeError:
            return False  # the slow path decodes it and reports the error
        return True

    async def on_request(self, conn: ClientConnection, ex: Exchange) -> None:
        frame = ex.frame
        assert frame is not None
        if ex.api_key == apis.PRODUCE:
            try:
                if produce_acks(frame, 4, ex.header) == 0:
                    ex.expects_response = False
            except DecodeError as exc:
                from kproxy.io.connection import ConnectionClosed

                metrics.protocol_errors.labels("undecodable").inc()
                raise ConnectionClosed("undecodable", f"undecodable Produce request: {exc}") from None
        await self.deliver(conn, ex)

    async def deliver(self, conn: ClientConnection, ex: Exchange) -> None:
        conn.track(ex)
        conn.expect_upstream_response(ex)
        ex.sent = conn.proxy.clock()
        assert ex.frame is not None
        await conn.send_upstream(ex.frame)

    # ------------------------------------------------------------------ responses

    async def on_response(self, conn: ClientConnection, ex: Exchange, frame: bytes, now: float) -> None:
        api_key = ex.api_key
        response = frame
        if api_key in ADDRESS_APIS or api_key == apis.API_VERSIONS or (
            api_key in LEADER_HINT_MIN_VERSION and self.proxy.addresses.may_name_brokers(frame)
        ):
            response = await self._rewrite(conn, ex, frame)
        ex.response = response
        self.proxy.latency_histogram(api_key).observe(now - ex.arrived)

    async def _rewrite(self, conn: ClientConnection, ex: Exchange, frame: bytes) -> bytes:
        payload = frame[4:]
        try:
            decoded = decode_response(ex.api_key, ex.api_version, payload)
        except DecodeError as exc:
            if ex.api_key == apis.API_VERSIONS and ex.api_version > 0:
                # A broker that does not support the client's ApiVersions
                # version answers in v0 format (KIP-511).
                try:
                    decoded = decode_response(ex.api_key, 0, payload)
                except DecodeError:
                    decoded = None
                if decoded is not None:
                    return encode_response(cap_api_versions(decoded), response_correlation_id(payload))
            if ex.api_key in ADDRESS_APIS:
                from kproxy.io.connection import ConnectionClosed

                metrics.protocol_errors.labels("undecodable").inc()
                raise ConnectionClosed(
                    "undecodable",
                    f"cannot decode {apis.api_name(ex.api_key)} v{ex.api_version} response to rewrite its addresses: {exc}",
                ) from None
            return frame  # leader hints are best effort: pass the response through
        if ex.api_key == apis.API_VERSIONS:
            new = cap_api_versions(decoded)
        else:
            new, learnt = rewrite_addresses(decoded, self.proxy.addresses)
            for node_id in learnt:
                await self.proxy.ensure_listener(node_id)
        if new is decoded:
            return frame
        return encode_response(new, ex.correlation_id)
