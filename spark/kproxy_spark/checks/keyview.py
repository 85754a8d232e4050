"""One key's history, in the shapes every per-key check reads.

The grouped pass (kproxy_spark.checks.keypass) hands each check the rows of one key
at a time: the completed send micro-ops and polled records on that key, and
the membership changes that kept it. ``KeyView`` builds, once per key, what
Jepsen's queue checker derives from them: the version order (which value
sits at which dense position of the key's log), who wrote each value, which
writes must have committed. Pure Python: no Spark here, so a check can be
read and tested on its own.

Jepsen trusts every offset/value pair a poll returned, but a send's offset
only when the send must have committed: it was acknowledged (``ok``), or it
is ``info`` and some acknowledged poll read one of its values, on any key:
a view sees the reads of its own key, and is told of the info operations
other keys proved (``proven_elsewhere``; see kproxy_spark.checks.keypass).
"""

from __future__ import annotations

from collections import defaultdict
from functools import cached_property
from typing import NamedTuple

from kproxy_spark.checks.membership import Membership


class Event(NamedTuple):
    """One event of a key's group (kproxy_spark.checks.op_events makes them).

    kind: 'send' (a completed send micro-op), 'poll' (a record a completed
    poll returned; value may be null) or 'kept' (an ok/info assign or
    subscribe by ``process`` whose keys list this key).
    """

    kind: str
    index: int
    time: int
    process: int
    type: str
    f: str
    mop_index: int
    pos: int
    offset: int | None
    value: int | None
    error: str | None
    # Committed send micro-ops of the whole op (ok/info send/txn), any key.
    op_writes: int
    # The op (ok/info) polled at least one record, on any key.
    op_reads: bool


class KeyView:
    """Everything the checks derive from one key's events, built once."""

    def __init__(self, key: int, events: list[Event], ordered: bool = False,
                 proven_elsewhere: frozenset[int] = frozenset(), membership: Membership | None = None) -> None:
        """``ordered``: the events already come ordered by (index, mop_index,
        pos). ``proven_elsewhere``: info operations an acknowledged read of
        another key proved committed. ``membership``: every process's
        membership changes (kproxy_spark.checks.membership)."""
        self.key = key
        self.membership = membership or Membership()
        ordered = events if ordered else sorted(events, key=lambda e: (e.index, e.mop_index, e.pos))
        self.sends = [e for e in ordered if e.kind == "send"]
        self.poll_rows = [e for e in ordered if e.kind == "poll"]
        self.polled = [e for e in self.poll_rows if e.value is not None]
        self.kept = [e for e in ordered if e.kind == "kept"]
        self.ok_reads = {e.value for e in self.polled if e.type == "ok"}
        info = [e for e in self.sends if e.type == "info"]
        #: Info operations an acknowledged read of this key proved committed.
        self.proven_here = {e.index for e in info if e.value in self.ok_reads}
        #: Info operations with a send on this key that nothing proved yet.
        self.unproven = {e.index for e in info} - self.proven_here - proven_elsewhere
        proven = self.proven_here | proven_elsewhere

        trusted = [e for e in self.sends if e.type == "ok" or (e.type == "info" and e.index in proven)]
        self.committed_ops = {e.index for e in trusted}
        entries = {
            (e.offset, e.value) for e in (*trusted, *self.polled) if e.offset is not None and e.value is not None
        }
        # Offsets have gaps (transaction markers take offsets): positions are dense ranks.
        dense = {offset: i for i, offset in enumerate(sorted({o for o, _ in entries}))}
        #: (offset, value, vo_index) for every distinct observation.
        self.vo = sorted((o, v, dense[o]) for o, v in entries)
        self.values_at_offset: dict[int, set[int]] = defaultdict(set)
        self.offsets_of_value: dict[int, set[int]] = defaultdict(set)
        for o, v, _ in self.vo:
            self.values_at_offset[o].add(v)
            self.offsets_of_value[v].add(o)
        #: vo_index -> (value, offset): one value per position, the smallest when inconsistent.
        self.by_index: dict[int, tuple[int, int]] = {}
        #: value -> (first, last) position it appears at (Jepsen's by-value uses the last).
        self.value_span: dict[int, tuple[int, int]] = {}
        for o, v, i in self.vo:
            if i not in self.by_index or v < self.by_index[i][0]:
                self.by_index[i] = (v, o)
            first, last = self.value_span.get(v, (i, i))
            self.value_span[v] = (min(first, i), max(last, i))
        # Jepsen's by-value is built from by-index: a value that only shares an
        # inconsistent offset with the value standing for it has no position
        # (unknown, so adjacent to anything).
        self.position: dict[int, int] = {}
        for i, (v, _) in self.by_index.items():
            self.position[v] = max(i, self.position.get(v, i))
        # The completion that sent each value; should a history repeat one,
        # the later writer wins, as in Jepsen.
        self.writer: dict[int, Event] = {}
        for e in self.sends:
            if e.value is not None:
                self.writer[e.value] = e

    @cached_property
    def failed_before(self) -> list[int]:
        """failed_before[i]: how many of the positions 0 .. i-1 hold a value whose send definitely failed."""
        counts = [0]
        for i in range(len(self.by_index) and max(self.by_index) + 1):
            at = self.by_index.get(i)
            writer = self.writer.get(at[0]) if at else None
            counts.append(counts[-1] + (writer is not None and writer.type == "fail"))
        return counts

    def failed_between(self, low: int, high: int) -> int:
        """How many positions strictly between low and high hold a definitely failed write."""
        return self.failed_before[high] - self.failed_before[low + 1]

    def position_of(self, value: int | None) -> int | None:
        return self.position.get(value) if value is not None else None

    def values_between(self, low: int, high: int, limit: int) -> list[int]:
        """The values at positions low+1 .. high-1, at most ``limit`` of them."""
        return [self.by_index[i][0] for i in range(low + 1, min(high, low + 1 + limit)) if i in self.by_index]
