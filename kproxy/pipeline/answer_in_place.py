"""The proxy answering a request in the broker's stead: the bytes of an error answer."""

from __future__ import annotations

from kproxy.pipeline.decode import request_body
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol.codec import encode_response
from kproxy.protocol.error_responses import error_response

# Kafka error a guard-mode refusal answers with: the transaction is not in a
# state where this request belongs (the client sees a definite failure).
INVALID_TXN_STATE = 48


def error_answer(ex: Exchange, error_code: int) -> bytes | None:
    """The framed answer to `ex` failing with `error_code`; None when its API has no decoder."""
    body = request_body(ex)
    if body is None:
        return None
    return encode_response(error_response(ex.api_key, ex.api_version, body, error_code), ex.correlation_id)
