"""Stage zero: which frames leave the fast path.

The fast path forwards a frame after reading its header; everything else
goes through the stages. A request leaves it when its API is transactional
(the tracker numbers it), it is a transactional Produce, or a rule wants its
API. A response leaves it when it names brokers (addresses), caps versions
(ApiVersions), may carry leader hints, answers a request that left it, or a
response rule wants its API. Recomputed whenever the rules change.
"""

from __future__ import annotations

from typing import Any

from kproxy.faults.engine import FaultEngine
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis
from kproxy.protocol.broker_addresses import ADDRESS_APIS, LEADER_HINT_MIN_VERSION
from kproxy.protocol.codec import DecodeError
from kproxy.protocol.produce_peek import produce_head


class Routing:
    __slots__ = ("slow_request_apis", "inspect_responses_from", "leader_hints_only")

    def __init__(self, engine: FaultEngine) -> None:
        self.slow_request_apis: frozenset[int] = frozenset()
        # api key -> lowest version whose responses must be looked at
        self.inspect_responses_from: dict[int, int] = {}
        # APIs whose responses are looked at only for leader hints: one that
        # names no upstream host cannot carry any and may pass untouched.
        self.leader_hints_only: frozenset[int] = frozenset()
        self.refresh(engine)

    def refresh(self, engine: FaultEngine) -> None:
        """Recompute which APIs leave the fast path (the rules changed)."""
        responses = {key: 0 for key in ADDRESS_APIS}
        responses[apis.API_VERSIONS] = 0
        responses.update(LEADER_HINT_MIN_VERSION)
        # Tracing at `records` keeps the fast path: the trace writer scans the
        # forwarded frames' batch headers on its own (kproxy.obs.trace_records).
        slow = set(apis.TRANSACTIONAL_APIS)
        # A response rule acts on the decoded response, so its exchanges
        # must carry their header through the stages too.
        slow.update(k for k in apis.API_NAMES if engine.wants(k, "request") or engine.wants(k, "response"))
        self.slow_request_apis = frozenset(slow)
        for key in apis.API_NAMES:
            if engine.wants(key, "response"):
                responses[key] = 0
        self.inspect_responses_from = responses
        self.leader_hints_only = frozenset(
            key for key, version in LEADER_HINT_MIN_VERSION.items() if responses.get(key) == version
        )

    @staticmethod
    def produce_is_plain(payload: bytes, start: int, header: Any, ex: Exchange) -> bool:
        """Fast-path check for Produce: non-transactional (and note acks=0)."""
        try:
            txn_id, acks = produce_head(payload, start, header)
        except DecodeError:
            return False  # the stages decode it and report the error
        if txn_id is not None:
            return False
        if acks == 0:
            ex.expects_response = False
        return True
