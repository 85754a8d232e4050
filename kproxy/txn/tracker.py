"""TxnTracker: synthetic transaction numbers per transactional id, both sides.

The shell calls, per transactional request:

    n = tracker.on_request(req)              # as it arrives from the client
    hazard = tracker.check_delivery(req, n)  # guard mode: refuse if not None
    d = tracker.on_delivery(req, n)          # as it is written to the broker
    tracker.on_response(req, update)         # with extract.response_update()

The numbering rules live in `kproxy.txn.machine`; this module keeps one
machine per side per transactional id, the producer identity, and counters.

Memory is bounded by `max_ids` (least recently used ids are forgotten first;
100_000 ids of a few hundred bytes each is tens of MB) and, for a shell that
wants time-based expiry, by `expire(older_than_seq)`: every call that touches
an id stamps it with the tracker's operation sequence number `seq`, so the
shell can remember `seq` at some moment and later drop ids untouched since.
A forgotten id that comes back starts again at number 0, as if new.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Any

from kproxy.txn.events import Delivery, Hazard, HazardKind, ResponseUpdate, TxnRequest
from kproxy.txn.identity import ProducerIdentity
from kproxy.txn.machine import SideState, step

DEFAULT_MAX_IDS = 100_000
HAZARD_KINDS: tuple[HazardKind, ...] = ("stale_end_txn", "late_produce", "fenced")


@dataclass(frozen=True, slots=True)
class TrackerStats:
    producers: int
    open_client: int
    open_broker: int
    hazards_by_kind: dict[str, int]
    # Transactions opened since start, per side: lets the shell feed counters.
    opened_client: int = 0
    opened_broker: int = 0


@dataclass(slots=True)
class _Producer:
    client: SideState = field(default_factory=SideState)
    broker: SideState = field(default_factory=SideState)
    identity: ProducerIdentity = field(default_factory=ProducerIdentity)
    hazards: int = 0
    last_hazard: Hazard | None = None
    last_seq: int = 0


class TxnTracker:
    def __init__(self, max_ids: int = DEFAULT_MAX_IDS) -> None:
        if max_ids < 1:
            raise ValueError("max_ids must be at least 1")
        self._max_ids = max_ids
        self._producers: OrderedDict[str, _Producer] = OrderedDict()
        self._seq = 0
        self._hazards_by_kind = dict.fromkeys(HAZARD_KINDS, 0)
        self._opened_client = 0
        self._opened_broker = 0

    @property
    def seq(self) -> int:
        """Operations applied so far; ids are stamped with it for `expire`."""
        return self._seq

    def on_request(self, req: TxnRequest) -> int:
        """Number `req` on the client side as it arrives; returns its client number.

        A request from an identity already fenced (a zombie producer) does not
        move the client side: the broker will refuse it, and it must not
        open a transaction the live producer never started.
        """
        producer = self._touch(req.transactional_id)
        if producer.identity.is_fenced(req, producer.client.phase == "ending"):
            return producer.client.number
        producer.identity = producer.identity.seen_request(req)
        result = step(producer.client, req)
        producer.client = result.state
        self._opened_client += result.opened
        return result.number

    def check_delivery(self, req: TxnRequest, client_number: int) -> Hazard | None:
        """The hazard delivering `req` now would cause; changes nothing."""
        producer = self._producers.get(req.transactional_id) or _Producer()
        return self._delivery_step(producer, req, client_number)[1]

    def on_delivery(self, req: TxnRequest, client_number: int) -> Delivery:
        """Advance the broker side as `req` is written to the broker."""
        producer = self._touch(req.transactional_id)
        result, hazard = self._delivery_step(producer, req, client_number)
        if result is not None:
            producer.broker = result.state
            self._opened_broker += result.opened
        if hazard is not None:
            producer.hazards += 1
            producer.last_hazard = hazard
            self._hazards_by_kind[hazard.kind] += 1
        opened = result.opened if result is not None else False
        return Delivery(producer.broker.number, hazard, opened)

    def on_response(self, req: TxnRequest, update: ResponseUpdate | None) -> None:
        """Apply what the broker's response to `req` taught (see extract.response_update)."""
        if update is None:
            return
        producer = self._touch(req.transactional_id)
        producer.identity = producer.identity.seen_response(req, update)

    def identity(self, transactional_id: str) -> tuple[int, int] | None:
        """Newest known (producer id, epoch) of a transactional id, for the trace."""
        producer = self._producers.get(transactional_id)
        return None if producer is None else producer.identity.newest

    def expire(self, older_than_seq: int) -> int:
        """Forget ids not touched since `older_than_seq`; returns how many."""
        stale = [tid for tid, p in self._producers.items() if p.last_seq < older_than_seq]
        for tid in stale:
            del self._producers[tid]
        return len(stale)

    def snapshot(self) -> list[dict[str, Any]]:
        """JSON-ready view of every tracked id, sorted by id (GET /txns)."""
        return [_describe(tid, self._producers[tid]) for tid in sorted(self._producers)]

    def stats(self) -> TrackerStats:
        producers = self._producers.values()
        return TrackerStats(
            producers=len(self._producers),
            open_client=sum(p.client.phase == "open" for p in producers),
            open_broker=sum(p.broker.phase == "open" for p in producers),
            hazards_by_kind=dict(self._hazards_by_kind),
            opened_client=self._opened_client,
            opened_broker=self._opened_broker,
        )

    def _delivery_step(self, producer: _Producer, req: TxnRequest, client_number: int):  # noqa: ANN202
        # A fenced request is refused by the broker, so it changes nothing there.
        if producer.identity.is_fenced(req, producer.broker.phase == "ending"):
            number = producer.broker.number
            detail = producer.identity.describe_fence(req)
            return None, Hazard("fenced", client_number, number, req.committed, detail)
        result = step(producer.broker, req, client_number)
        return result, result.hazard

    def _touch(self, transactional_id: str) -> _Producer:
        self._seq += 1
        producer = self._producers.get(transactional_id)
        if producer is None:
            producer = self._producers[transactional_id] = _Producer()
            while len(self._producers) > self._max_ids:
                self._producers.popitem(last=False)
        else:
            self._producers.move_to_end(transactional_id)
        producer.last_seq = self._seq
        return producer


def _describe(transactional_id: str, producer: _Producer) -> dict[str, Any]:
    newest = producer.identity.newest
    hazard = producer.last_hazard
    return {
        "transactional_id": transactional_id,
        "producer_id": newest[0] if newest else None,
        "producer_epoch": newest[1] if newest else None,
        "client_number": producer.client.number,
        "broker_number": producer.broker.number,
        "client_state": producer.client.phase,
        "broker_state": producer.broker.phase,
        "client_partitions": [list(tp) for tp in sorted(producer.client.partitions)],
        "broker_partitions": [list(tp) for tp in sorted(producer.broker.partitions)],
        "hazards": producer.hazards,
        "last_hazard": None
        if hazard is None
        else {
            "kind": hazard.kind,
            "client_number": hazard.client_number,
            "broker_number": hazard.broker_number,
            "committed": hazard.committed,
            "detail": hazard.detail,
        },
        "last_error_code": producer.identity.last_error,
    }
