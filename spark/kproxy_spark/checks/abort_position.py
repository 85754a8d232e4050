"""Where a consumer reads next after its transaction aborted (KAFKA-17582).

After an abort, a transactional consume-process-produce loop expects its
consumer to go back to the last committed position (the start of the aborted
transaction's reads) so the records are processed again. Clients differ: some
keep their in-memory position and *advance*, some *rewind* to the committed
position, and some have been seen to *rewind-further*, re-reading records a
committed transaction already consumed.
"""

from __future__ import annotations

from kproxy_spark.checks.contiguity import Segment
from kproxy_spark.checks.keyview import KeyView

POSITIONS = ("advance", "rewind", "rewind-further")


def abort_positions(view: KeyView, segs: list[Segment], errors: dict[int, str | None]) -> list[dict]:
    """One case per aborted transaction and key it read, with the next read of that key by the process.

    Only definite aborts (``fail`` txn completions) are classified, and only
    when the process read the key again with no assignment change or crash
    in between. Positions are compared in the version order: next first
    position > aborted last position -> advance; within the aborted range ->
    rewind; before the aborted first position -> rewind-further.
    ``errors`` maps the read ops' indexes to their error.

    Fields: key, process, abort_index, error, next_index, aborted_first_offset,
    aborted_last_offset, next_first_offset, aborted_first_value,
    aborted_last_value, next_first_value, position.
    """
    cases = []
    for seg in segs:
        if seg.type != "fail" or seg.index not in errors or not seg.comparable_next:
            continue
        nxt = seg.next
        if None in (seg.last_vo_index, seg.first_vo_index, nxt.first_vo_index):
            continue
        if nxt.first_vo_index > seg.last_vo_index:
            position = "advance"
        elif nxt.first_vo_index >= seg.first_vo_index:
            position = "rewind"
        else:
            position = "rewind-further"
        cases.append({
            "key": view.key, "process": seg.process, "abort_index": seg.index, "error": errors[seg.index],
            "next_index": nxt.index,
            "aborted_first_offset": seg.first_offset, "aborted_last_offset": seg.last_offset,
            "next_first_offset": nxt.first_offset,
            "aborted_first_value": seg.first_value, "aborted_last_value": seg.last_value,
            "next_first_value": nxt.first_value, "position": position,
        })
    return cases
