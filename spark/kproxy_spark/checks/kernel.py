"""Every per-key check over one key's events, in one call.

This is what runs inside the grouped pass: ``check_key`` builds the key's
``KeyView`` once and asks each check for its cases, the key's part of the
dependency graph and its unseen-writes series. Pure Python, no Spark, so the
same function is called by the Spark pass (kproxy_spark.checks.keypass) and can be
exercised directly.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from kproxy_spark.checks.abort_position import abort_positions
from kproxy_spark.checks.causes import with_causes
from kproxy_spark.checks.contiguity import (
    internal_poll_pairs,
    internal_send_pairs,
    nonmonotonic,
    poll_pairs,
    read_segments,
    send_pairs,
    skips,
)
from kproxy_spark.checks.cycles import Edge, key_edges
from kproxy_spark.checks.keyview import Event, KeyView
from kproxy_spark.checks.membership import Membership
from kproxy_spark.checks.orders import duplicates, inconsistent_offsets
from kproxy_spark.checks.visibility import aborted_reads, lost_writes, precommitted_reads, unseen, unseen_deltas

#: The per-key anomalies, in report order, with the field each is ordered by.
KEY_CHECKS = {
    "inconsistent-offsets": "offset",
    "duplicate": "value",
    "G1a": "reader_index",
    "lost-write": "writer_index",
    "unseen": "send_index",
    "poll-skip": "index",
    "nonmonotonic-poll": "index",
    "nonmonotonic-send": "index",
    "int-poll-skip": "index",
    "int-send-skip": "index",
    "int-nonmonotonic-poll": "index",
    "int-nonmonotonic-send": "index",
    "precommitted-read": "index",
    "abort-position": "abort_index",
}

#: Width of the unseen-writes series' buckets.
UNSEEN_BUCKET_NS = 1_000_000_000


@dataclass
class KeyResult:
    """One key's findings: cases by check, dependency edges, unseen deltas per
    bucket, micro-op counts, and the info ops its reads proved (or not)."""

    cases: dict[str, list[dict]] = field(default_factory=dict)
    edges: list[Edge] = field(default_factory=list)
    unseen_deltas: Counter = field(default_factory=Counter)
    #: (mop 'send'|'poll', f, type) -> completed send micro-ops / polled records on the key.
    micro_ops: Counter = field(default_factory=Counter)
    #: Info ops proven committed by this key's reads, and those still unproven here.
    proven: set[int] = field(default_factory=set)
    unproven: set[int] = field(default_factory=set)


def check_key(key: int, events: list[Event], ww_deps: bool = True,
              bucket_ns: int = UNSEEN_BUCKET_NS, ordered: bool = False,
              proven_elsewhere: frozenset[int] = frozenset(), membership: Membership | None = None) -> KeyResult:
    """Every per-key check over one key's events (``ordered``: already by
    index, mop_index, pos, as the pass hands them over; ``proven_elsewhere``:
    info ops other keys' reads proved committed; ``membership``: every
    process's membership changes)."""
    view = KeyView(key, events, ordered, proven_elsewhere, membership)
    reads = read_segments(view)
    polls = poll_pairs(view, reads)
    int_polls = internal_poll_pairs(view)
    int_sends = internal_send_pairs(view)
    aborts = {e.index: e.error for e in view.polled if e.f == "txn" and e.type == "fail"}
    cases = {
        "inconsistent-offsets": inconsistent_offsets(view),
        "duplicate": duplicates(view),
        "G1a": aborted_reads(view),
        "lost-write": lost_writes(view),
        "unseen": unseen(view),
        "poll-skip": with_causes(view, skips(view, polls), skip=True),
        "nonmonotonic-poll": with_causes(view, nonmonotonic(polls), skip=False),
        "nonmonotonic-send": nonmonotonic(send_pairs(view)),
        "int-poll-skip": skips(view, int_polls),
        "int-send-skip": skips(view, int_sends),
        "int-nonmonotonic-poll": nonmonotonic(int_polls),
        "int-nonmonotonic-send": nonmonotonic(int_sends),
        "precommitted-read": precommitted_reads(view),
        "abort-position": abort_positions(view, reads, aborts),
    }
    micro_ops = Counter(("send", e.f, e.type) for e in view.sends)
    micro_ops.update(("poll", e.f, e.type) for e in view.polled)
    return KeyResult(cases, key_edges(view, ww_deps), unseen_deltas(view, bucket_ns), micro_ops,
                     view.proven_here, view.unproven)
