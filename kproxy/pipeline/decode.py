"""Stage: decode a frame's body, once, only when something needs it.

Requests are decoded when the tracker, a rule or an answer in the broker's
stead needs the body; a request that cannot be decoded ends its connection
(`Undecodable`). Responses are decoded for their facts (error codes, what the
tracker learns) and never fatally: what cannot be read passes through.
"""

from __future__ import annotations

import logging
from typing import Any

from kproxy.obs import metrics
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis
from kproxy.protocol.codec import DecodeError, decode_request, decode_response, error_codes
from kproxy.protocol.produce_peek import produce_head

log = logging.getLogger("kproxy.pipeline")


class Undecodable(Exception):
    """A frame the data path must read and cannot: its connection closes (reason `undecodable`)."""

    reason = "undecodable"

    def __init__(self, what: str, exc: Exception) -> None:
        metrics.protocol_errors.labels("undecodable").inc()
        super().__init__(f"undecodable {what}: {exc}")


def request_body(ex: Exchange) -> Any:
    """The decoded request (decoded on first use; None for an API without a decoder)."""
    if ex.request_body is None and ex.header.body_offset >= 0:
        try:
            ex.request_body = decode_request(ex.header, ex.request_frame, 4)
        except DecodeError as exc:
            raise Undecodable(f"{apis.api_name(ex.api_key)} v{ex.api_version} request", exc) from None
    return ex.request_body


def produce_facts(ex: Exchange, payload: bytes, start: int, header: Any) -> str | None:
    """A Produce's transactional id, read in place; notes acks=0 (no answer will come)."""
    try:
        txn_id, acks = produce_head(payload, start, header)
    except DecodeError as exc:
        raise Undecodable("Produce request", exc) from None
    if acks == 0:
        ex.expects_response = False
    return txn_id


def response_facts(ex: Exchange, frame: bytes) -> tuple[Any, list[int]]:
    """The decoded response and its error codes; (None, []) when it cannot be decoded."""
    try:
        decoded = decode_response(ex.api_key, ex.api_version, frame[4:])
    except DecodeError as exc:
        log.debug("response to %s v%d not decodable: %s", apis.api_name(ex.api_key), ex.api_version, exc)
        return None, []
    return decoded, error_codes(decoded)
