"""Order of reads and sends against the version order: skips and inversions.

Within one operation (``int-*``), consecutive reads (or sends) of a key must
be adjacent in the key's version order. Across operations of one process,
the first read of a key must directly follow the last read of it by that
process's previous acknowledged operation, and sends must not go backwards.
A change of assignment/subscription that drops the key, or a crash, resets
the expectation for that key, as Jepsen does.
"""

from __future__ import annotations

from bisect import bisect_right
from collections import defaultdict
from dataclasses import dataclass

from kproxy_spark.checks.keyview import Event, KeyView

#: How many skipped values a case lists to explain itself; the delta says how many there were.
MAX_SKIPPED_LISTED = 16


def _delta(prev_position: int | None, position: int | None) -> int:
    # Unknown positions cannot prove anything: Jepsen treats them as adjacent.
    if prev_position is None or position is None:
        return 1
    return position - prev_position


def _internal_pairs(view: KeyView, rows: list[Event]) -> list[dict]:
    """Consecutive reads (sends) of the key within one op that are not adjacent.

    Only pairs whose delta is not 1 are built: every check reads either the
    skips (delta > 1) or the inversions (delta < 1), and adjacent pairs are
    nearly all of them.
    """
    pairs = []
    position = view.position
    previous: Event | None = None
    for e in rows:  # ordered by (index, mop_index, pos)
        if previous is not None and previous.index == e.index and previous.value is not None:
            prev_position, current = position.get(previous.value), position.get(e.value)
            delta = _delta(prev_position, current)
            if delta != 1:
                pairs.append({
                    "key": view.key, "values": [previous.value, e.value], "delta": delta,
                    "index": e.index, "process": e.process, "type": e.type, "f": e.f, "mop_index": e.mop_index,
                    "prev_vo_index": prev_position, "vo_index": current,
                })
        previous = e
    return pairs


def internal_poll_pairs(view: KeyView) -> list[dict]:
    return _internal_pairs(view, [e for e in view.polled if e.f in ("poll", "txn")])


def internal_send_pairs(view: KeyView) -> list[dict]:
    return _internal_pairs(view, [e for e in view.sends if e.f in ("send", "txn")])


def with_skipped(view: KeyView, cases: list[dict]) -> list[dict]:
    """Add ``skipped``: the first values strictly between prev_vo_index and vo_index."""
    for case in cases:
        case["skipped"] = view.values_between(case["prev_vo_index"], case["vo_index"], MAX_SKIPPED_LISTED)
    return cases


def skips(view: KeyView, pairs: list[dict]) -> list[dict]:
    return with_skipped(view, [p for p in pairs if p["delta"] > 1])


def nonmonotonic(pairs: list[dict]) -> list[dict]:
    return [p for p in pairs if p["delta"] < 1]


# --- across operations of one process -------------------------------------

@dataclass(slots=True)
class Segment:
    """What one operation read (or sent) of the key: its first and last value, with positions."""

    process: int
    index: int
    type: str
    first_value: int | None
    last_value: int | None
    first_offset: int | None
    last_offset: int | None
    first_vo_index: int | None
    last_vo_index: int | None
    # Changes of the process before the op, and changes that kept this key up to it.
    changes: int
    kept: int
    subscribed: bool
    prev: Segment | None = None
    next: Segment | None = None

    @property
    def comparable_prev(self) -> bool:
        return self.prev is not None and _survives(self.prev, self)

    @property
    def comparable_next(self) -> bool:
        return self.next is not None and _survives(self, self.next)


def _survives(earlier: Segment, later: Segment) -> bool:
    """The expectation carries over only if every change in between still listed the key."""
    return later.changes - earlier.changes == later.kept - earlier.kept


def segments(view: KeyView, rows: list[Event], previous_types: tuple[str, ...]) -> list[Segment]:
    """One segment per operation that read (sent) the key, linked per process:
    ``prev`` is the process's latest earlier segment whose type is in
    previous_types, ``next`` the following one of any type."""
    by_op: dict[int, list[Event]] = defaultdict(list)
    for e in rows:
        by_op[e.index].append(e)
    kept_at: dict[int, list[int]] = defaultdict(list)
    for e in view.kept:  # ordered by index
        kept_at[e.process].append(e.index)
    out: list[Segment] = []
    last_of_process: dict[int, Segment] = {}
    previous_usable: dict[int, Segment] = {}
    position, membership = view.position, view.membership
    for index in sorted(by_op):
        mops = by_op[index]  # ordered by (mop_index, pos)
        first, last = mops[0], mops[-1]
        process = first.process
        kept = bisect_right(kept_at.get(process, ()), index)
        changes, latest = membership.at(process, index)
        seg = Segment(
            process, index, first.type, first.value, last.value, first.offset, last.offset,
            position.get(first.value), position.get(last.value), changes, kept, latest == "subscribe",
        )
        seg.prev = previous_usable.get(seg.process)
        before = last_of_process.get(seg.process)
        if before is not None:
            before.next = seg
        last_of_process[seg.process] = seg
        if seg.type in previous_types:
            previous_usable[seg.process] = seg
        out.append(seg)
    return out


def read_segments(view: KeyView) -> list[Segment]:
    """Segments of every completed poll/txn's reads, each compared with the
    process's previous *acknowledged* read (a failed or crashed op leaves the
    position unproven), as in Jepsen. poll-skip, nonmonotonic-poll and
    abort-position all start from these."""
    return segments(view, [e for e in view.polled if e.f in ("poll", "txn")], ("ok",))


def _cross_pairs(view: KeyView, segs: list[Segment]) -> list[dict]:
    pairs = []
    for seg in segs:
        if not seg.comparable_prev:
            continue
        prev = seg.prev
        if _delta(prev.last_vo_index, seg.first_vo_index) == 1:
            continue  # adjacent: neither a skip nor an inversion
        pairs.append({
            "key": view.key, "values": [prev.last_value, seg.first_value],
            "delta": _delta(prev.last_vo_index, seg.first_vo_index),
            "op_indexes": [prev.index, seg.index], "prev_index": prev.index, "index": seg.index,
            "process": seg.process, "subscribed": seg.subscribed,
            "prev_vo_index": prev.last_vo_index, "vo_index": seg.first_vo_index,
        })
    return pairs


def poll_pairs(view: KeyView, segs: list[Segment]) -> list[dict]:
    """Consecutive reads of the key by one process: last of its previous ok read vs first of this one."""
    return _cross_pairs(view, segs)


def send_pairs(view: KeyView) -> list[dict]:
    """Consecutive sends to the key by one process (ok and info completions only)."""
    rows = [e for e in view.sends if e.f in ("send", "txn") and e.type in ("ok", "info")]
    return _cross_pairs(view, segments(view, rows, ("ok", "info")))
