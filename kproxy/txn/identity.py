"""Which producer id and epoch currently own a transactional id.

The coordinator fences every (producer id, epoch) older than the newest one
it handed out. The tracker learns the newest from responses (InitProducerId,
and EndTxn v5+ which bumps the epoch per transaction under KIP-890) and,
when it has not seen one yet (the proxy started mid-stream), from the first
request's own identity or a same-id higher epoch. A fencing error in a
response marks that identity (and anything older with the same id) as
fenced even when the newer identity itself was never seen.

KIP-890 retries: after an EndTxn v5+ bumped the epoch, a retry of that same
EndTxn still carries the old identity, and the coordinator accepts it as a
retry as long as no new transaction has begun. `previous` remembers the
identity such a bump replaced so that retry is not mistaken for fencing.
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.txn.events import ResponseUpdate, TxnRequest

Ident = tuple[int, int]  # (producer id, epoch)


@dataclass(frozen=True, slots=True)
class ProducerIdentity:
    newest: Ident | None = None
    previous: Ident | None = None  # replaced by the last EndTxn bump, if any
    fenced_at_or_below: Ident | None = None  # same producer id, epoch <= this: fenced
    last_error: int = 0

    def is_fenced(self, req: TxnRequest, ending: bool = False) -> bool:
        """Would the coordinator refuse `req`? ending: that side has just seen an EndTxn."""
        if req.kind == "init_producer_id" or req.producer_id < 0:
            return False  # InitProducerId asks for an identity; -1 means "not known"
        mine = (req.producer_id, req.producer_epoch)
        if ending and req.kind == "end_txn" and mine == self.previous:
            return False  # a retry of the EndTxn that bumped the epoch
        if self.newest is not None and (mine[0] != self.newest[0] or mine[1] < self.newest[1]):
            return True
        floor = self.fenced_at_or_below
        return floor is not None and mine[0] == floor[0] and mine[1] <= floor[1]

    def seen_request(self, req: TxnRequest) -> ProducerIdentity:
        """Adopt a request's identity when no response has told us better."""
        if req.kind == "init_producer_id" or req.producer_id < 0:
            return self
        mine = (req.producer_id, req.producer_epoch)
        if self.newest is None or (mine[0] == self.newest[0] and mine[1] > self.newest[1]):
            return ProducerIdentity(mine, self.previous, self.fenced_at_or_below, self.last_error)
        return self

    def seen_response(self, req: TxnRequest, update: ResponseUpdate) -> ProducerIdentity:
        newest = self.newest
        previous = self.previous
        floor = self.fenced_at_or_below
        if update.producer_id is not None and update.producer_id >= 0 and update.producer_epoch is not None:
            handed_out = (update.producer_id, update.producer_epoch)
            if handed_out != newest:
                # Only an EndTxn bump leaves a retryable old identity behind.
                previous = (req.producer_id, req.producer_epoch) if req.kind == "end_txn" else None
            newest = handed_out
        if update.fenced and req.producer_id >= 0:
            mine = (req.producer_id, req.producer_epoch)
            if floor is None or floor[0] != mine[0] or floor[1] < mine[1]:
                floor = mine
            if newest == mine:
                newest = None  # it is fenced: whatever replaced it is unknown yet
        return ProducerIdentity(newest, previous, floor, update.error_code)

    def describe_fence(self, req: TxnRequest) -> str:
        mine = f"producer {req.producer_id} epoch {req.producer_epoch}"
        if self.newest is not None:
            return f"{mine} is older than producer {self.newest[0]} epoch {self.newest[1]}"
        return f"{mine} was fenced by the broker"
