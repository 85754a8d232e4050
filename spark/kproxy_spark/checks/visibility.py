"""Which writes were seen, and by whom: G1a, precommitted-read, lost-write, unseen."""

from __future__ import annotations

from collections import Counter

from kproxy_spark.checks.keyview import KeyView


def aborted_reads(view: KeyView) -> list[dict]:
    """G1a: an acknowledged poll returned a value whose send definitely failed.

    Fields: key, value, offset, reader_index, reader_process, writer_index,
    writer_process (one case per reader op and value).
    """
    failed: dict[int, object] = {}
    for e in view.sends:
        if e.type == "fail" and e.value is not None:
            failed.setdefault(e.value, e)
    cases, seen = [], set()
    for r in view.polled:
        writer = failed.get(r.value)
        if r.type != "ok" or writer is None or (r.index, r.value) in seen:
            continue
        seen.add((r.index, r.value))
        cases.append({
            "key": view.key, "value": r.value, "offset": r.offset,
            "reader_index": r.index, "reader_process": r.process,
            "writer_index": writer.index, "writer_process": writer.process,
            "explanation": f"process {r.process} read key {view.key} value {r.value} at offset {r.offset}"
                           f" (op {r.index}), though its send failed (op {writer.index}, process {writer.process})",
        })
    return cases


def precommitted_reads(view: KeyView) -> list[dict]:
    """An operation polled a value that it sent itself, so before its own commit.

    Kafka consumers are never to see a record before the transaction that
    wrote it commits; a transaction's poll necessarily runs before its own
    commit. Fields: index, process, type, key, value, offset.
    """
    written = {(e.index, e.value) for e in view.sends}
    cases, seen = [], set()
    for r in view.polled:
        if (r.index, r.value) in written and (r.index, r.value) not in seen:
            seen.add((r.index, r.value))
            cases.append({"index": r.index, "process": r.process, "type": r.type,
                          "key": view.key, "value": r.value, "offset": r.offset})
    return cases


def lost_writes(view: KeyView) -> list[dict]:
    """A committed write that no acknowledged poll returned, though a later value of its key was polled.

    The bound is the highest position (earliest appearance) of any value an
    acknowledged poll returned; every value whose last appearance lies at or
    below it should have been read by someone. Fields: key, value, offset,
    vo_index, max_read_index, max_read_value, max_read_reader_index,
    writer_index, writer_process, writer_type.
    """
    read_positions = [view.value_span[v][0] for v in view.ok_reads if v in view.value_span]
    if not read_positions:
        return []
    bound = max(read_positions)
    bound_value = view.by_index[bound][0]
    readers = [r.index for r in view.polled if r.type == "ok" and r.value == bound_value]
    cases = []
    for value, (first, last) in sorted(view.value_span.items(), key=lambda kv: kv[1]):
        writer = view.writer.get(value)
        if last > bound or value in view.ok_reads or writer is None or writer.index not in view.committed_ops:
            continue
        cases.append({
            "key": view.key, "value": value, "offset": min(view.offsets_of_value[value]), "vo_index": first,
            "max_read_index": bound, "max_read_value": bound_value,
            "max_read_reader_index": min(readers) if readers else None,
            "writer_index": writer.index, "writer_process": writer.process, "writer_type": writer.type,
            "explanation": f"key {view.key} value {value} (offset {min(view.offsets_of_value[value])}, written by op"
                           f" {writer.index}, {writer.type}) was never read, though value {bound_value} after it was",
        })
    return cases


def _first_ok_polls(view: KeyView) -> dict[int, tuple[int, int]]:
    """value -> (index, time) of the earliest acknowledged poll that returned it."""
    first: dict[int, tuple[int, int]] = {}
    for r in view.polled:  # ordered by index: a value's first row has its earliest index
        if r.type == "ok":
            seen = first.get(r.value)
            if seen is None:
                first[r.value] = (r.index, r.time)
            elif r.time < seen[1]:  # a clock that went backwards (a history Spark read unchecked)
                first[r.value] = (seen[0], r.time)
    return first


def unseen(view: KeyView) -> list[dict]:
    """Acknowledged writes that no acknowledged poll ever returned (as of the end of the history).

    Fields: key, value, offset, send_index, send_time, process.
    """
    return [
        {"key": view.key, "value": e.value, "offset": e.offset, "send_index": e.index, "send_time": e.time,
         "process": e.process}
        for e in view.sends
        if e.type == "ok" and e.value not in view.ok_reads
    ]


def unseen_deltas(view: KeyView, bucket_ns: int) -> Counter:
    """Per time bucket: +1 for each write acknowledged, -1 when it is first polled after that.

    A value polled before its send was acknowledged was never unseen; net
    zero in one bucket means the write was seen within the bucket.
    """
    first = _first_ok_polls(view)
    deltas: Counter = Counter()
    for e in view.sends:
        if e.type != "ok":
            continue
        deltas[e.time // bucket_ns] += 1
        seen = first.get(e.value)
        if seen is not None and seen[0] > e.index:
            deltas[seen[1] // bucket_ns] -= 1
    return deltas


def running_unseen(deltas: dict[int, int], bucket_ns: int) -> list[dict]:
    """Cumulative unseen count at the end of each bucket: [{time, unseen}]."""
    total, series = 0, []
    for bucket in sorted(deltas):
        total += deltas[bucket]
        series.append({"time": (bucket + 1) * bucket_ns, "unseen": total})
    return series
