"""One request/response exchange on a client connection."""

from __future__ import annotations

from typing import Any


class Exchange:
    """Mutable bookkeeping for one request until its response goes back.

    A plain slotted class, not a dataclass: one is created per request on the
    hot path and most fields are filled in later (or never).
    """

    __slots__ = (
        "api_key",
        "api_version",
        "correlation_id",
        "client_id",
        "arrived",
        "sent",
        "frame",
        "header",
        "request",
        "txn",
        "txn_client",
        "txn_numbers",
        "txn_broker",
        "hazard",
        "decision",
        "outcome",
        "response",
        "expects_response",
        "suppress_response",
        "copy",
        "request_partitions",
    )

    def __init__(self, api_key: int, api_version: int, correlation_id: int, client_id: str | None, arrived: float) -> None:
        self.api_key = api_key
        self.api_version = api_version
        self.correlation_id = correlation_id
        self.client_id = client_id
        self.arrived = arrived
        self.sent = 0.0
        self.frame: bytes | None = None  # whole request frame, kept only off the fast path
        self.header: Any = None
        self.request: Any = None  # decoded kio payload, when something needed it
        self.txn: tuple[Any, ...] = ()  # TxnRequest events for the tracker
        self.txn_client: int | None = None  # client-side number of the first TxnRequest (for traces)
        self.txn_numbers: tuple[int, ...] = ()  # client-side number of each TxnRequest
        self.txn_broker: int | None = None
        self.hazard: Any = None
        self.decision: Any = None  # fault decision applied to the request, if any
        self.outcome = "delivered"
        self.response: bytes | None = None  # framed response ready for the client
        self.expects_response = True
        self.suppress_response = False  # the ack is lost on purpose
        self.copy = 0
        self.request_partitions: Any = None  # records-level trace of the request
