"""The generated trace in the proxy's own format: segment files, record batches in side files.

kproxy.workload.synthetic builds each event as a dict with its records inline
(what a JSON Lines trace held before side files). A proxy's default trace
(`kproxy run --trace-format segments`) instead keeps each partition's raw
record batches in a side file next to the segment file and points at them
(`records_file`, `records_offset`, `records_length`), and the analysis decodes
them on its executors. This writes the generated events that way, so what
`kproxy bench analysis` times is what a user's trace costs.

Each partition's records become record batches as a producer and a broker
would lay them out: a new batch wherever the producer, its epoch, the
transactional flag or data/control changes, or offsets or sequences stop
running on. Reading them back (kproxy.protocol.record_views.side_records)
gives the same records the dict held. A Produce response points at its
request's batches, as the proxy's does. Unlike the proxy, repeated Fetch
regions are not stored once (the generated ones are far below the proxy's
64 KiB threshold for that).
"""

from __future__ import annotations

from pathlib import Path

from kproxy.obs.trace_records import SIDE_FIELDS
from kproxy.obs.trace_schema import EVENT
from kproxy.obs.trace_segments import SUFFIX as SEGMENT_SUFFIX
from kproxy.obs.trace_segments import encode_segment, file_header
from kproxy.protocol.batch_scan import scan_batches
from kproxy.protocol.record_views import payload_bytes
from kproxy.protocol.records import NO_SEQUENCE, Record, encode_batch, make_batch

FIELDS = tuple(f.name for f in EVENT)
#: Events per segment: what the proxy's writer flushes at most in one batch.
EVENTS_PER_SEGMENT = 512


def _continues(prev: dict, rec: dict) -> bool:
    """Whether `rec` may follow `prev` in one batch: same producer and kind, offsets and sequences running on."""
    if (prev["producer_id"], prev["producer_epoch"], prev["transactional"], prev["control"] is None) != \
            (rec["producer_id"], rec["producer_epoch"], rec["transactional"], rec["control"] is None):
        return False
    if prev["offset"] is not None and rec["offset"] != prev["offset"] + 1:
        return False
    if (prev["sequence"] if prev["sequence"] is not None else NO_SEQUENCE) < 0:
        return rec["sequence"] is None or rec["sequence"] < 0
    return rec["sequence"] == prev["sequence"] + 1


def encode_records(records: list[dict]) -> bytes:
    """The record batches that hold `records` (dicts of trace_schema.RECORD), in order."""
    out = []
    start = 0
    for end in range(1, len(records) + 1):
        if end < len(records) and _continues(records[end - 1], records[end]):
            continue
        run = records[start:end]
        first = run[0]
        base = first["offset"] if first["offset"] is not None else 0
        batch = make_batch(
            [Record(base + i, 0, payload_bytes(r["key"]), payload_bytes(r["value"])) for i, r in enumerate(run)],
            producer_id=first["producer_id"] if first["producer_id"] is not None else -1,
            producer_epoch=first["producer_epoch"] if first["producer_epoch"] is not None else -1,
            base_sequence=first["sequence"] if first["sequence"] is not None and first["sequence"] >= 0
            else NO_SEQUENCE,
            transactional=bool(first["transactional"]),
            control=first["control"] is not None,
        )
        out.append(encode_batch(batch))
        start = end
    return b"".join(out)


class SegmentOutput:
    """Rotated segment trace files with their side files; `write` takes an event dict as Output's does."""

    def __init__(self, directory: Path, proxy_id: str, rotate_bytes: int) -> None:
        self._directory = directory
        self._proxy_id = proxy_id
        self._rotate_bytes = rotate_bytes
        self._seq = 0
        self._rows: list[list] = []
        self.lines = 0
        self._produce_sides: dict[tuple, tuple[str, dict]] = {}  # a Produce request's side fields until its response
        self._open()

    def _open(self) -> None:
        stem = f"trace-{self._proxy_id}-19700101T000000-{self._seq:06d}"
        self._file = open(self._directory / f"{stem}{SEGMENT_SUFFIX}", "wb")  # noqa: SIM115 - closed in close()
        self._side_name = f"{stem}.records"
        self._side = open(self._directory / self._side_name, "wb")  # noqa: SIM115
        self._file.write(file_header())
        self._written = 0
        self._side_written = 0

    def write(self, event: dict) -> None:
        if event["partitions"] and event["api"] == "produce":
            event = self._produce_event(event)
        elif event["partitions"]:
            event = {**event, "partitions": [self._with_side_records(part) for part in event["partitions"]]}
        self._rows.append([event[name] for name in FIELDS])
        self.lines += 1
        if len(self._rows) >= EVENTS_PER_SEGMENT:
            self.flush()

    def _produce_event(self, event: dict) -> dict:
        """A Produce request's records go to the side file; its response points at the request's
        batches, as the proxy's does (kproxy.obs.trace_records.ProduceResponseRecords): the offsets
        it assigned apply to the records the request sent."""
        exchange = (event["conn_id"], event["correlation_id"], event["copy"])
        if event["direction"] == "request":
            parts = [self._with_side_records(part) for part in event["partitions"]]
            self._produce_sides[exchange] = (self._side_name, {
                (p["topic"], p["partition"]): {k: p[k] for k in SIDE_FIELDS} for p in parts if p.get("records_file")})
            return {**event, "partitions": parts}
        side_name, sent = self._produce_sides.pop(exchange, (None, {}))
        if side_name != self._side_name:
            sent = {}  # the request's side file was rotated away: a remote reader reads a file with its own
        return {**event, "partitions": [
            {**part, **sent[(part["topic"], part["partition"])]} if (part["topic"], part["partition"]) in sent
            else self._with_side_records(part)
            for part in event["partitions"]]}

    def _with_side_records(self, part: dict) -> dict:
        """`part` (not changed) with its records moved to the side file as batches, as the proxy keeps them."""
        records = part.get("records")
        if not records:
            return part
        raw = encode_records(records)
        batches = scan_batches(raw, 0, len(raw), None)
        offset = self._side_written
        self._side.write(raw)
        self._side_written += len(raw)
        return {**part, "batches": batches, "compression": batches[0]["compression"], "records": None,
                "records_file": self._side_name, "records_offset": offset, "records_length": len(raw)}

    def flush(self) -> None:
        if self._rows:
            segment = encode_segment(self._rows)
            self._rows = []
            self._file.write(segment)
            self._written += len(segment)
        if self._written + self._side_written >= self._rotate_bytes:
            self._close_files()
            self._seq += 1
            self._open()

    def _close_files(self) -> None:
        self._file.close()
        self._side.close()

    def close(self) -> None:
        self.flush()
        self._close_files()
