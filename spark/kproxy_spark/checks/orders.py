"""Anomalies visible in a key's version order alone: inconsistent-offsets and duplicate.

The version order itself is built by kproxy_spark.checks.keyview.KeyView.
"""

from __future__ import annotations

from kproxy_spark.checks.keyview import KeyView


def inconsistent_offsets(view: KeyView) -> list[dict]:
    """One offset of a key holding several values.

    Fields: key, offset, vo_index, values, op_indexes (the ops that sent or
    polled the offset).
    """
    cases = []
    positions = {o: i for o, _, i in view.vo}
    for offset, values in sorted(view.values_at_offset.items()):
        if len(values) < 2:
            continue
        witnesses = {e.index for e in (*view.sends, *view.poll_rows) if e.offset == offset}
        cases.append({
            "key": view.key, "offset": offset, "vo_index": positions[offset],
            "values": sorted(values), "op_indexes": sorted(witnesses),
        })
    return cases


def duplicates(view: KeyView) -> list[dict]:
    """One value of a key stored at several offsets: key, value, count, offsets."""
    return [
        {"key": view.key, "value": value, "count": len(offsets), "offsets": sorted(offsets)}
        for value, offsets in sorted(view.offsets_of_value.items())
        if len(offsets) > 1
    ]
