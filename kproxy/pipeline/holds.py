"""Stage: what releases a parked request (or copies kept back).

A parked request waits for an event the data path sees: its producer's next
transaction sent records (and the broker wrote them), the client retried the
same request, or the client hung up. This book only decides which parked
entries an event releases; waiting, timeouts and delivery are the shell's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kproxy.pipeline.exchange import Exchange
from kproxy.pipeline.plans import ReleaseOn
from kproxy.protocol import apis


@dataclass(eq=False, slots=True)
class Parked:
    ex: Exchange
    release_on: ReleaseOn | None
    conn: Any  # the client connection it came on (identity only)
    token: Any = field(default=None)  # the shell's (what it waits on)


class HoldBook:
    def __init__(self) -> None:
        self.entries: list[Parked] = []

    def park(self, entry: Parked) -> None:
        self.entries.append(entry)

    def forget(self, entry: Parked) -> None:
        if entry in self.entries:
            self.entries.remove(entry)

    def _take(self, matching: list[Parked]) -> list[Parked]:
        for entry in matching:
            self.entries.remove(entry)
        return matching

    def released_by_answer(self, delivered: Exchange) -> list[Parked]:
        """Entries waiting for their producer's next transaction's records, which the broker just wrote.

        Released on the answer, not on sending: the copy goes over another
        connection and would race the records.
        """
        if not self.entries or delivered.api_key != apis.PRODUCE or not delivered.txn:
            return []
        txn_id = delivered.txn[0].transactional_id
        return self._take([
            entry for entry in self.entries
            if entry.release_on == "next_txn_records"
            and entry.ex.txn
            and entry.ex.txn[0].transactional_id == txn_id
            and (delivered.txn_client or 0) > (entry.ex.txn_client or 0)
        ])

    def released_by_arrival(self, arrived: Exchange) -> list[Parked]:
        """Entries waiting for the client to retry the request that just arrived."""
        if not self.entries:
            return []
        txn_id = arrived.txn[0].transactional_id if arrived.txn else None
        return self._take([
            entry for entry in self.entries
            if entry.release_on == "client_retry"
            and entry.ex is not arrived
            and entry.ex.api_key == arrived.api_key
            and entry.ex.client_id == arrived.client_id
            and (not entry.ex.txn or entry.ex.txn[0].transactional_id == txn_id)
        ])

    def released_by_close(self, conn: Any) -> list[Parked]:
        """Entries of a connection that closed, waiting for the client to hang up."""
        return self._take([
            entry for entry in self.entries if entry.conn is conn and entry.release_on == "client_disconnect"
        ])
