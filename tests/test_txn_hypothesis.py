"""Properties of the tracker over generated producer sessions and delivery orders.

A session is what a well-behaved transactional client sends: InitProducerId,
then transactions of one or more body requests ending in an EndTxn that may
be retried. The tests vary only what the proxy does in between: deliver in
order, deliver a late duplicate, or deliver in a shuffled order.
"""

from __future__ import annotations

import random
import zlib
from dataclasses import dataclass

from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.txn import Delivery, ResponseUpdate, TxnRequest, TxnTracker

BODY_KINDS = ("add_partitions", "add_offsets", "txn_offset_commit", "produce")


@dataclass(frozen=True)
class Sent:
    """One request as the client sent it, with the transaction it belongs to."""

    req: TxnRequest
    txn: int  # 0 for InitProducerId
    first_of_txn: bool = False


@dataclass(frozen=True)
class Txn:
    bodies: tuple[tuple[str, int], ...]  # (kind, partition)
    committed: bool
    end_retries: int


txns = st.builds(
    Txn,
    bodies=st.lists(st.tuples(st.sampled_from(BODY_KINDS), st.integers(0, 3)), min_size=1, max_size=4).map(tuple),
    committed=st.booleans(),
    end_retries=st.integers(0, 2),
)


def producer_id_of(tid: str) -> int:
    return zlib.crc32(tid.encode()) % 100_000


def session(tid: str, plan: list[Txn], kip890: bool) -> list[Sent]:
    """The client's requests for one producer; epochs follow KIP-890 bumps when asked."""
    producer_id = producer_id_of(tid)
    sent = [Sent(TxnRequest("init_producer_id", tid, -1, -1), 0)]
    epoch = 0
    for number, txn in enumerate(plan, start=1):
        for position, (kind, partition) in enumerate(txn.bodies):
            req = TxnRequest(kind, tid, producer_id, epoch, partitions=(("t", partition),))  # type: ignore[arg-type]
            sent.append(Sent(req, number, position == 0))
        end = TxnRequest("end_txn", tid, producer_id, epoch, committed=txn.committed)
        sent.extend(Sent(end, number) for _ in range(1 + txn.end_retries))
        if kip890:
            epoch += 1
    return sent


def response_for(sent: Sent, kip890: bool) -> ResponseUpdate | None:
    """The broker's answer as extract.response_update would report it."""
    req = sent.req
    if req.kind == "init_producer_id":
        return ResponseUpdate(0, producer_id=producer_id_of(req.transactional_id), producer_epoch=0)
    if req.kind == "end_txn" and kip890:
        return ResponseUpdate(0, producer_id=req.producer_id, producer_epoch=req.producer_epoch + 1)
    return None


@st.composite
def interleaved_sessions(draw: st.DrawFn) -> tuple[list[Sent], bool]:
    kip890 = draw(st.booleans())
    producers = draw(st.integers(1, 3))
    queues = []
    for index in range(producers):
        tid = f"tx-{index}"
        queues.append(session(tid, draw(st.lists(txns, min_size=1, max_size=5)), kip890))
    order = draw(st.permutations([i for i, q in enumerate(queues) for _ in q]))
    cursors = [0] * producers
    merged = []
    for i in order:  # each producer's own order is kept; producers interleave freely
        merged.append(queues[i][cursors[i]])
        cursors[i] += 1
    return merged, kip890


@settings(max_examples=200, deadline=None)
@given(interleaved_sessions())
def test_in_order_delivery_never_reports_a_hazard(generated: tuple[list[Sent], bool]) -> None:
    sent, kip890 = generated
    tracker = TxnTracker()
    for item in sent:
        client_number = tracker.on_request(item.req)
        assert client_number == item.txn
        assert tracker.check_delivery(item.req, client_number) is None
        delivery = tracker.on_delivery(item.req, client_number)
        assert delivery.hazard is None
        assert delivery.broker_number == client_number
        tracker.on_response(item.req, response_for(item, kip890))
    stats = tracker.stats()
    assert stats.hazards_by_kind == {"stale_end_txn": 0, "late_produce": 0, "fenced": 0}
    assert stats.opened_client == stats.opened_broker == sum(s.first_of_txn for s in sent)
    assert all(row["client_number"] == row["broker_number"] for row in tracker.snapshot())


@settings(max_examples=200, deadline=None)
@given(plan=st.lists(txns, min_size=2, max_size=5), kip890=st.booleans(), data=st.data())
def test_end_txn_delivered_after_a_later_transaction_began_is_stale(
    plan: list[Txn], kip890: bool, data: st.DataObject
) -> None:
    sent = session("tx", plan, kip890)
    stale_txn = data.draw(st.integers(1, len(plan) - 1), label="stale transaction")
    later_txn = data.draw(st.integers(stale_txn + 1, len(plan)), label="transaction it lands in")
    stale_end = next(s for s in sent if s.req.kind == "end_txn" and s.txn == stale_txn)
    later_items = [i for i, s in enumerate(sent) if s.txn == later_txn and s.req.kind != "end_txn"]
    # The late copy goes out anywhere after the later transaction's first request and before its EndTxn.
    copy_after = data.draw(st.sampled_from(later_items), label="delivered after")

    tracker = TxnTracker()
    landing = None
    for index, item in enumerate(sent):
        number = tracker.on_request(item.req)
        tracker.on_delivery(item.req, number)
        tracker.on_response(item.req, response_for(item, kip890))
        if index == copy_after:
            landing = tracker.on_delivery(stale_end.req, stale_txn)
            break

    assert landing is not None and landing.hazard is not None
    if kip890:
        # The per-transaction epoch bump is KIP-890's fix: the broker fences the copy.
        assert landing.hazard.kind == "fenced"
    else:
        assert landing.hazard.kind == "stale_end_txn"
        assert landing.hazard.committed == plan[stale_txn - 1].committed
        assert (landing.hazard.client_number, landing.hazard.broker_number) == (stale_txn, later_txn)
    assert landing.broker_number == later_txn


def run_with_faults(sent: list[Sent], seed: int) -> tuple[list[tuple[int, Delivery]], list[dict]]:
    """Deliver with seeded random holds and duplicates; returns (client number, delivery) per delivery."""
    rng = random.Random(seed)
    tracker = TxnTracker()
    pending: list[tuple[int, TxnRequest, int]] = []  # (release step, request, client number)
    deliveries = []
    for step_number, item in enumerate(sent):
        number = tracker.on_request(item.req)
        copies = 2 if rng.random() < 0.2 else 1
        for _ in range(copies):
            pending.append((step_number + rng.choice((0, 0, 0, 1, 3, 6)), item.req, number))
        due = sorted((p for p in pending if p[0] <= step_number), key=lambda p: p[0])
        pending = [p for p in pending if p[0] > step_number]
        for _, req, client_number in due:
            deliveries.append((client_number, tracker.on_delivery(req, client_number)))
    for _, req, client_number in sorted(pending, key=lambda p: p[0]):
        deliveries.append((client_number, tracker.on_delivery(req, client_number)))
    return deliveries, tracker.snapshot()


@settings(max_examples=150, deadline=None)
@given(plan=st.lists(txns, min_size=1, max_size=5), seed=st.integers(0, 2**32 - 1))
def test_seeded_faults_are_deterministic_and_every_mismatch_is_reported(plan: list[Txn], seed: int) -> None:
    sent = session("tx", plan, kip890=False)
    first = run_with_faults(sent, seed)
    assert first == run_with_faults(sent, seed)

    deliveries, snapshot = first
    numbers = [d.broker_number for _, d in deliveries]
    assert numbers == sorted(numbers), "broker-side numbers never go backwards"
    for client_number, delivery in deliveries:
        if delivery.broker_number != client_number and delivery.hazard is None:
            # Only InitProducerId carries no transaction of its own.
            assert client_number == 0
    assert sum(row["hazards"] for row in snapshot) == sum(d.hazard is not None for _, d in deliveries)
