"""What the tracker is told and what it answers: plain frozen values.

The proxy shell turns decoded Kafka requests into `TxnRequest`s (see
`kproxy.txn.extract`), feeds them to `TxnTracker`, and copies the numbers and
hazards it gets back into the trace and the metrics.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

TxnKind = Literal[
    "init_producer_id",
    "add_partitions",
    "add_offsets",
    "txn_offset_commit",
    "produce",
    "end_txn",
]

HazardKind = Literal["stale_end_txn", "late_produce", "fenced"]

# Kinds that belong to the body of a transaction: the first one after an
# EndTxn (or after InitProducerId) opens the next transaction number.
OPENING_KINDS: frozenset[str] = frozenset({"add_partitions", "add_offsets", "txn_offset_commit", "produce"})

TopicPartition = tuple[str, int]


@dataclass(frozen=True, slots=True)
class TxnRequest:
    """One transactional producer's part of one Kafka request.

    producer_id / producer_epoch are -1 when the request does not say (an
    InitProducerId that asks for a fresh id, a Produce whose records could
    not be read).
    """

    kind: TxnKind
    transactional_id: str
    producer_id: int
    producer_epoch: int
    committed: bool | None = None  # EndTxn only: True commit, False abort
    partitions: tuple[TopicPartition, ...] = ()


@dataclass(frozen=True, slots=True)
class Hazard:
    """A request delivered into a transaction other than the one it belongs to.

    client_number is the transaction the client meant (numbered at arrival);
    broker_number is the one it lands in at the broker. committed carries an
    EndTxn's commit/abort flag (None for other kinds).
    """

    kind: HazardKind
    client_number: int
    broker_number: int
    committed: bool | None
    detail: str


@dataclass(frozen=True, slots=True)
class Delivery:
    """Outcome of delivering one request to the broker."""

    broker_number: int
    hazard: Hazard | None
    # True when this delivery opened a new broker-side transaction number
    # (lets the shell count transactions per side without diffing numbers).
    opened: bool = False


@dataclass(frozen=True, slots=True)
class ResponseUpdate:
    """What a broker response teaches about a transactional producer.

    producer_id / producer_epoch are set when the response hands out an
    identity: a successful InitProducerId, or an EndTxn v5+ (KIP-890 bumps
    the epoch after every transaction, and may hand out a new producer id).
    fenced is True when error_code says the request's identity is no longer
    the current one for its transactional id.
    """

    error_code: int
    fenced: bool = False
    producer_id: int | None = None
    producer_epoch: int | None = None
