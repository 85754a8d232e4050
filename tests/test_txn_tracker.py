"""Every transition of the transaction tracker, one scenario per test."""

from __future__ import annotations

import json

import pytest

from kproxy.txn import Delivery, ResponseUpdate, TxnRequest, TxnTracker

TID = "orders-1"
PID = 4000


def produce(epoch: int = 0, partition: int = 0, pid: int = PID, tid: str = TID) -> TxnRequest:
    return TxnRequest("produce", tid, pid, epoch, partitions=(("orders", partition),))


def add_partitions(epoch: int = 0, partition: int = 0, tid: str = TID) -> TxnRequest:
    return TxnRequest("add_partitions", tid, PID, epoch, partitions=(("orders", partition),))


def end_txn(committed: bool, epoch: int = 0, pid: int = PID, tid: str = TID) -> TxnRequest:
    return TxnRequest("end_txn", tid, pid, epoch, committed=committed)


def init(tid: str = TID) -> TxnRequest:
    return TxnRequest("init_producer_id", tid, -1, -1)


def in_order(tracker: TxnTracker, req: TxnRequest) -> tuple[int, Delivery]:
    """Arrival immediately followed by delivery: what a proxy without faults does."""
    number = tracker.on_request(req)
    return number, tracker.on_delivery(req, number)


@pytest.fixture
def tracker() -> TxnTracker:
    t = TxnTracker()
    req = init()
    in_order(t, req)
    t.on_response(req, ResponseUpdate(0, producer_id=PID, producer_epoch=0))
    return t


def test_commit_then_abort_in_order_numbers_both_sides_alike(tracker: TxnTracker) -> None:
    seen = [
        in_order(tracker, r)
        for r in (add_partitions(), produce(), end_txn(True), add_partitions(), produce(), end_txn(False))
    ]
    assert [n for n, _ in seen] == [1, 1, 1, 2, 2, 2]
    assert [d.broker_number for _, d in seen] == [1, 1, 1, 2, 2, 2]
    assert all(d.hazard is None for _, d in seen)
    assert [d.opened for _, d in seen] == [True, False, False, True, False, False]
    stats = tracker.stats()
    assert (stats.opened_client, stats.opened_broker) == (2, 2)
    assert stats.hazards_by_kind == {"stale_end_txn": 0, "late_produce": 0, "fenced": 0}


def test_open_transaction_tracks_partitions_until_end(tracker: TxnTracker) -> None:
    in_order(tracker, add_partitions(partition=0))
    in_order(tracker, produce(partition=3))
    (row,) = tracker.snapshot()
    assert row["client_state"] == row["broker_state"] == "open"
    assert row["client_partitions"] == [["orders", 0], ["orders", 3]]
    assert tracker.stats().open_client == tracker.stats().open_broker == 1
    in_order(tracker, end_txn(True))
    (row,) = tracker.snapshot()
    assert row["client_state"] == "ending" and row["client_partitions"] == []
    assert tracker.stats().open_client == 0


def test_end_txn_retry_keeps_its_number_and_is_not_a_hazard(tracker: TxnTracker) -> None:
    in_order(tracker, produce())
    first = end_txn(True)
    number = tracker.on_request(first)
    retry_number = tracker.on_request(first)
    assert number == retry_number == 1
    assert tracker.on_delivery(first, number) == Delivery(1, None)
    # The retry (or a proxy duplicate) lands right after: no new transaction between.
    assert tracker.on_delivery(first, retry_number) == Delivery(1, None)
    assert in_order(tracker, produce())[0] == 2


def test_duplicate_end_txn_after_next_transaction_began_is_stale(tracker: TxnTracker) -> None:
    in_order(tracker, produce())
    commit1 = end_txn(True)
    n1, _ = in_order(tracker, commit1)
    n2, d2 = in_order(tracker, produce(partition=1))
    assert (n1, n2, d2.broker_number) == (1, 2, 2)

    delivery = tracker.on_delivery(commit1, n1)  # the late duplicate copy

    assert delivery.broker_number == 2
    hazard = delivery.hazard
    assert hazard is not None
    assert (hazard.kind, hazard.client_number, hazard.broker_number, hazard.committed) == ("stale_end_txn", 1, 2, True)
    assert "commits open transaction 2" in hazard.detail
    row = tracker.snapshot()[0]
    assert row["hazards"] == 1 and row["last_hazard"]["kind"] == "stale_end_txn"
    assert row["broker_state"] == "ending" and row["client_state"] == "open"


def test_torn_transaction_then_numbers_resynchronise(tracker: TxnTracker) -> None:
    """The KAFKA-17754 shape: txn 2's head is committed by txn 1's stale EndTxn."""
    in_order(tracker, produce())
    commit1 = end_txn(True)
    in_order(tracker, commit1)
    in_order(tracker, produce(partition=0))
    tracker.on_delivery(commit1, 1)  # stale: ends broker-side 2

    n, tail = in_order(tracker, produce(partition=1))  # rest of transaction 2
    assert n == 2
    assert tail.hazard is not None and tail.hazard.kind == "late_produce"
    assert tail.opened and tail.broker_number == 2

    n, abort2 = in_order(tracker, end_txn(False))
    assert (n, abort2) == (2, Delivery(2, None))
    n, next_txn = in_order(tracker, produce())
    assert (n, next_txn) == (3, Delivery(3, None, opened=True))
    assert tracker.stats().hazards_by_kind == {"stale_end_txn": 1, "late_produce": 1, "fenced": 0}


def test_late_produce_slides_into_the_next_transaction(tracker: TxnTracker) -> None:
    held = produce(partition=2)
    n_held = tracker.on_request(held)  # arrives in transaction 1, the proxy holds it
    in_order(tracker, end_txn(True))
    in_order(tracker, produce())  # transaction 2 starts at the broker

    delivery = tracker.on_delivery(held, n_held)

    assert n_held == 1
    assert delivery.broker_number == 2
    assert delivery.hazard is not None
    assert (delivery.hazard.kind, delivery.hazard.client_number, delivery.hazard.broker_number) == (
        "late_produce",
        1,
        2,
    )


def test_late_produce_after_end_opens_a_fresh_broker_transaction(tracker: TxnTracker) -> None:
    in_order(tracker, produce())
    held = produce(partition=2)
    n_held = tracker.on_request(held)
    in_order(tracker, end_txn(True))

    delivery = tracker.on_delivery(held, n_held)  # nothing open at the broker now

    assert delivery.opened and delivery.broker_number == 1
    assert delivery.hazard is not None and delivery.hazard.kind == "late_produce"
    assert "after an EndTxn for it" in delivery.hazard.detail
    # It sits in an open broker transaction that the client's transaction 2
    # then joins: the straggler will commit or abort with transaction 2.
    assert in_order(tracker, produce()) == (2, Delivery(2, None))
    assert in_order(tracker, end_txn(False)) == (2, Delivery(2, None))
    assert tracker.stats().hazards_by_kind["late_produce"] == 1


def test_check_delivery_predicts_without_changing_state(tracker: TxnTracker) -> None:
    in_order(tracker, produce())
    commit1 = end_txn(True)
    in_order(tracker, commit1)
    in_order(tracker, produce())
    before = tracker.snapshot()

    predicted = tracker.check_delivery(commit1, 1)

    assert predicted is not None and predicted.kind == "stale_end_txn"
    assert tracker.snapshot() == before
    assert tracker.stats().hazards_by_kind["stale_end_txn"] == 0
    assert tracker.check_delivery(produce(), 2) is None
    assert tracker.on_delivery(commit1, 1).hazard == predicted


def test_older_epoch_after_init_is_fenced_and_does_not_move_the_broker(tracker: TxnTracker) -> None:
    in_order(tracker, produce(epoch=0))
    old_end = end_txn(True, epoch=0)
    n_old = tracker.on_request(old_end)
    reinit = init()
    in_order(tracker, reinit)
    tracker.on_response(reinit, ResponseUpdate(0, producer_id=PID, producer_epoch=1))
    assert tracker.identity(TID) == (PID, 1)

    delivery = tracker.on_delivery(old_end, n_old)

    assert delivery.hazard is not None
    assert delivery.hazard.kind == "fenced" and delivery.hazard.committed is True
    assert "epoch 0" in delivery.hazard.detail and "epoch 1" in delivery.hazard.detail
    assert tracker.snapshot()[0]["broker_state"] == "idle"
    # Numbering continues across epochs: the next transaction is 2, not 1.
    assert in_order(tracker, produce(epoch=1)) == (2, Delivery(2, None, opened=True))


def test_zombie_request_does_not_open_a_client_transaction(tracker: TxnTracker) -> None:
    reinit = init()
    in_order(tracker, reinit)
    tracker.on_response(reinit, ResponseUpdate(0, producer_id=PID, producer_epoch=1))
    zombie = produce(epoch=0)
    number = tracker.on_request(zombie)
    assert number == 0 and tracker.snapshot()[0]["client_state"] == "idle"
    assert tracker.on_delivery(zombie, number).hazard.kind == "fenced"


def test_fencing_error_marks_the_identity_fenced(tracker: TxnTracker) -> None:
    req = produce(epoch=0)
    in_order(tracker, req)
    tracker.on_response(req, ResponseUpdate(90, fenced=True))
    row = tracker.snapshot()[0]
    assert row["last_error_code"] == 90 and row["producer_id"] is None
    hazard = tracker.check_delivery(end_txn(False, epoch=0), 1)
    assert hazard is not None and hazard.kind == "fenced"
    assert "fenced by the broker" in hazard.detail


def test_end_txn_v5_epoch_bump_fences_the_stale_copy(tracker: TxnTracker) -> None:
    """KIP-890: EndTxn v5 hands out epoch+1, so a late copy of it is fenced, not stale."""
    in_order(tracker, produce(epoch=0))
    commit1 = end_txn(True, epoch=0)
    in_order(tracker, commit1)
    tracker.on_response(commit1, ResponseUpdate(0, producer_id=PID, producer_epoch=1))
    assert in_order(tracker, produce(epoch=1)) == (2, Delivery(2, None, opened=True))

    hazard = tracker.on_delivery(commit1, 1).hazard

    assert hazard is not None and hazard.kind == "fenced"
    assert tracker.snapshot()[0]["producer_epoch"] == 1


def test_end_txn_v5_retry_with_the_old_epoch_is_not_fenced(tracker: TxnTracker) -> None:
    """The coordinator accepts a retry of the bumping EndTxn until a new transaction begins."""
    in_order(tracker, produce(epoch=0))
    commit1 = end_txn(True, epoch=0)
    in_order(tracker, commit1)
    tracker.on_response(commit1, ResponseUpdate(0, producer_id=PID, producer_epoch=1))
    assert in_order(tracker, commit1) == (1, Delivery(1, None))
    in_order(tracker, produce(epoch=1))
    assert tracker.check_delivery(commit1, 1).kind == "fenced"


def test_end_txn_v5_new_producer_id_on_epoch_overflow(tracker: TxnTracker) -> None:
    in_order(tracker, produce(epoch=0))
    commit1 = end_txn(True, epoch=0)
    in_order(tracker, commit1)
    tracker.on_response(commit1, ResponseUpdate(0, producer_id=PID + 1, producer_epoch=0))
    assert in_order(tracker, produce(pid=PID + 1, epoch=0)) == (2, Delivery(2, None, opened=True))
    assert tracker.check_delivery(produce(pid=PID, epoch=5), 2).kind == "fenced"


def test_batched_add_partitions_requests_track_each_id_apart() -> None:
    tracker = TxnTracker()
    for tid in ("a", "b"):
        assert in_order(tracker, add_partitions(tid=tid))[0] == 1
    in_order(tracker, end_txn(True, tid="a"))
    assert in_order(tracker, add_partitions(tid="a"))[0] == 2
    assert in_order(tracker, produce(tid="b"))[0] == 1
    rows = {r["transactional_id"]: r for r in tracker.snapshot()}
    assert (rows["a"]["client_number"], rows["b"]["client_number"]) == (2, 1)


def test_early_end_txn_is_reported_and_its_straggling_body_too(tracker: TxnTracker) -> None:
    in_order(tracker, produce())
    in_order(tracker, end_txn(True))
    held = produce(partition=5)
    n_held = tracker.on_request(held)  # transaction 2's first request, held
    end2 = end_txn(False)
    n_end = tracker.on_request(end2)

    early = tracker.on_delivery(end2, n_end)
    late = tracker.on_delivery(held, n_held)

    assert early.hazard.kind == "stale_end_txn" and early.hazard.client_number == 2
    assert "with none open" in early.hazard.detail
    assert late.hazard.kind == "late_produce" and late.broker_number == 2
    assert "after an EndTxn for it" in late.hazard.detail


def test_snapshot_is_json_ready_and_sorted(tracker: TxnTracker) -> None:
    in_order(tracker, produce(tid="z-last"))
    in_order(tracker, produce())
    rows = json.loads(json.dumps(tracker.snapshot()))
    assert [r["transactional_id"] for r in rows] == [TID, "z-last"]
    assert set(rows[0]) >= {
        "producer_id",
        "producer_epoch",
        "client_number",
        "broker_number",
        "client_state",
        "broker_state",
        "client_partitions",
        "broker_partitions",
        "hazards",
        "last_hazard",
    }
    assert rows[0]["producer_id"] == PID and rows[1]["producer_id"] == PID  # z-last learnt from its request


def test_lru_cap_forgets_the_least_recently_used_id() -> None:
    tracker = TxnTracker(max_ids=2)
    in_order(tracker, produce(tid="a"))
    in_order(tracker, produce(tid="b"))
    in_order(tracker, produce(tid="a"))  # a is now the most recent
    in_order(tracker, produce(tid="c"))
    assert [r["transactional_id"] for r in tracker.snapshot()] == ["a", "c"]
    assert tracker.stats().producers == 2


def test_expire_drops_ids_untouched_since_a_sequence_mark() -> None:
    tracker = TxnTracker()
    in_order(tracker, produce(tid="old"))
    mark = tracker.seq
    in_order(tracker, produce(tid="new"))
    assert tracker.expire(mark + 1) == 1
    assert [r["transactional_id"] for r in tracker.snapshot()] == ["new"]
    # A forgotten id comes back as new.
    assert in_order(tracker, produce(tid="old"))[0] == 1


def test_unknown_kind_is_rejected() -> None:
    with pytest.raises(ValueError, match="unknown"):
        TxnTracker().on_request(TxnRequest("heartbeat", TID, PID, 0))  # type: ignore[arg-type]
