"""One request/response exchange on a client connection: what the stages learn of it."""

from __future__ import annotations

from typing import Any

from kproxy.pipeline.plans import PASS, ResponsePlan


class Exchange:
    """Mutable bookkeeping for one request until its response goes back.

    A plain slotted class, not a dataclass: one is created per request on the
    hot path and most fields are filled in later (or never). The stages fill
    in the facts (numbers, decision, hazard, outcome); the trace and the
    metrics read them from here.
    """

    __slots__ = (
        "api_key",
        "api_version",
        "correlation_id",
        "client_id",
        "arrived",
        "sent",
        "request_frame",
        "header",
        "request_body",
        "txn",
        "txn_client",
        "txn_numbers",
        "txn_broker",
        "hazard",
        "decision",
        "then",
        "outcome",
        "response_frame",
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
        self.request_frame: bytes | None = None  # the whole request frame, kept only off the fast path
        self.header: Any = None  # its parsed header; None on the fast path
        self.request_body: Any = None  # the decoded kio request, when a stage needed it
        self.txn: tuple[Any, ...] = ()  # TxnRequest events for the tracker
        self.txn_client: int | None = None  # client-side number of the first TxnRequest (for traces)
        self.txn_numbers: tuple[int, ...] = ()  # client-side number of each TxnRequest
        self.txn_broker: int | None = None
        self.hazard: Any = None
        self.decision: Any = None  # the fault decision applied, if any
        self.then: ResponsePlan = PASS  # what becomes of the broker's answer
        self.outcome = "delivered"
        self.response_frame: bytes | None = None  # framed response ready for the client
        self.expects_response = True
        self.suppress_response = False  # the ack is lost on purpose
        self.copy = 0
        self.request_partitions: Any = None  # records-level trace of the request

    def copy_for_delivery(self, copy: int) -> Exchange:
        """A copy of this request delivered over the proxy's own connection (0: the request itself, late)."""
        ghost = Exchange(self.api_key, self.api_version, self.correlation_id, self.client_id, self.arrived)
        ghost.request_frame = self.request_frame
        ghost.header = self.header
        ghost.request_body = self.request_body
        ghost.txn = self.txn
        ghost.txn_client = self.txn_client
        ghost.txn_numbers = self.txn_numbers
        ghost.decision = self.decision
        ghost.copy = copy
        ghost.expects_response = self.expects_response
        ghost.request_partitions = self.request_partitions
        return ghost
