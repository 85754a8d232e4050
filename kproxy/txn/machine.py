"""The transaction-numbering state machine: every transition lives here.

One transactional id has two copies of this machine. The client side is fed
requests in arrival order and is the authority on which transaction a
request belongs to (its *client number*). The broker side is fed the same
requests in delivery order, after the fault layer delayed, duplicated or
held some of them, together with their client number; it works out which
transaction each one actually lands in (its *broker number*) and whether
that is a hazard.

Numbering (both sides): transactions are numbered 1, 2, 3... per
transactional id. A body request (AddPartitionsToTxn, AddOffsetsToTxn,
TxnOffsetCommit, Produce) arriving while no transaction is open opens the
next number. EndTxn ends the open transaction; further EndTxns before the
next body request are retries and keep the number. InitProducerId closes
whatever was open (the coordinator aborts it) without resetting the count,
so numbers stay monotonic across epochs and producer ids of one
transactional id.

Broker side labelling: a new broker transaction normally takes the client
number of the request that opens it, which re-synchronises the two sides
after a hazard instead of leaving every later transaction off by one. A
request whose own transaction was already ended at the broker opens a
segment labelled with the broker's current number (when it is that same
transaction, split in two by an early EndTxn) or the next one (when it is
older), and is reported; the client's next transaction then joins that
segment and renames it to its own number.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Literal

from kproxy.txn.events import OPENING_KINDS, Hazard, TopicPartition, TxnRequest

Phase = Literal["idle", "open", "ending"]


@dataclass(frozen=True, slots=True)
class SideState:
    """One side's view of one transactional id.

    phase: idle (nothing opened since InitProducerId or ever), open (a
    transaction's body is in progress), ending (EndTxn seen, the next
    transaction has not started).
    last_end_client: highest client number of an EndTxn this side applied;
    a body request at or below it belongs to a transaction already ended here.
    """

    number: int = 0
    phase: Phase = "idle"
    partitions: frozenset[TopicPartition] = frozenset()
    last_end_client: int = 0


@dataclass(frozen=True, slots=True)
class Step:
    """Result of applying one request to one side."""

    state: SideState
    number: int  # the transaction the request lands in on this side
    opened: bool  # the request opened a new number on this side
    hazard: Hazard | None = None


def step(state: SideState, req: TxnRequest, client_number: int | None = None) -> Step:
    """Apply `req` to one side. client_number is None on the client side.

    Pure: the caller decides whether to keep the returned state (guard mode
    asks what a delivery would do without doing it).
    """
    if req.kind == "init_producer_id":
        return Step(replace(state, phase="idle", partitions=frozenset()), state.number, False)
    if req.kind == "end_txn":
        return _end_txn(state, req, client_number)
    if req.kind in OPENING_KINDS:
        return _body(state, req, client_number)
    raise ValueError(f"unknown transactional request kind {req.kind!r}")


def _end_txn(state: SideState, req: TxnRequest, client_number: int | None) -> Step:
    number = state.number
    hazard = None
    if client_number is not None and client_number != number:
        hazard = Hazard("stale_end_txn", client_number, number, req.committed, _end_detail(state, req, client_number))
    seen = max(state.last_end_client, number if client_number is None else client_number)
    if state.phase != "open":
        # A retry, or an EndTxn with nothing open: it ends nothing new.
        return Step(replace(state, last_end_client=seen), number, False, hazard)
    ended = replace(state, phase="ending", partitions=frozenset(), last_end_client=seen)
    return Step(ended, number, False, hazard)


def _body(state: SideState, req: TxnRequest, client_number: int | None) -> Step:
    if state.phase == "open":
        number = state.number
        if client_number is not None and client_number > number and number <= state.last_end_client:
            # The open broker transaction holds only stragglers of transactions
            # already ended; the client's next transaction joins it, and takes
            # its name so the two sides agree again.
            number = client_number
        opened = False
        partitions = state.partitions | frozenset(req.partitions)
    else:
        number = _opening_number(state.number, client_number)
        opened = True
        partitions = frozenset(req.partitions)
    new_state = replace(state, number=number, phase="open", partitions=partitions)
    hazard = None
    if client_number is not None:
        hazard = _body_hazard(state, number, opened, req, client_number)
    return Step(new_state, number, opened, hazard)


def _opening_number(current: int, client_number: int | None) -> int:
    if client_number is None or client_number > current:
        return current + 1 if client_number is None else client_number
    if client_number == current:
        return current  # the same transaction, split by an early EndTxn
    return current + 1  # an older transaction's straggler opens a fresh one


def _body_hazard(before: SideState, number: int, opened: bool, req: TxnRequest, client_number: int) -> Hazard | None:
    what = _describe(req)
    if client_number <= before.last_end_client:
        detail = (
            f"{what} of transaction {client_number} delivered after an EndTxn for it reached the broker; "
            f"lands in broker-side transaction {number}"
        )
    elif opened and client_number <= before.number:
        detail = (
            f"{what} of transaction {client_number} delivered after broker-side transaction "
            f"{before.number} ended; it opens a new broker-side transaction, numbered {number}"
        )
    elif client_number < number:
        detail = f"{what} of transaction {client_number} slides into later transaction {number}"
    elif client_number > number:
        detail = (
            f"{what} of transaction {client_number} lands in earlier transaction {number}, "
            f"whose EndTxn has not reached the broker"
        )
    else:
        return None
    return Hazard("late_produce", client_number, number, None, detail)


def _end_detail(state: SideState, req: TxnRequest, client_number: int) -> str:
    verb = "commit" if req.committed else "abort"
    if state.phase == "open" and client_number < state.number:
        return f"EndTxn({verb}) of transaction {client_number} {verb}s open transaction {state.number}"
    if state.phase == "open":
        return (
            f"EndTxn({verb}) of transaction {client_number} arrives before that transaction's first request "
            f"and {verb}s open transaction {state.number}"
        )
    return f"EndTxn({verb}) of transaction {client_number} lands after transaction {state.number}, with none open"


def _describe(req: TxnRequest) -> str:
    names = {
        "produce": "Produce",
        "add_partitions": "AddPartitionsToTxn",
        "add_offsets": "AddOffsetsToTxn",
        "txn_offset_commit": "TxnOffsetCommit",
    }
    return names[req.kind]
