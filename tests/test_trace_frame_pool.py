"""Streamed Produce frames in pooled buffers: given back only once the side file holds their batches."""

from __future__ import annotations

from pathlib import Path

import trio

from kproxy.obs.trace import TraceWriter
from kproxy.obs.trace_files import iter_trace_events
from kproxy.obs.trace_frame_pool import MAX_POOLED_BYTES, FramePool, PooledBuffer
from kproxy.obs.trace_records import ProduceRequestRecords
from kproxy.protocol.codec import encode_request, parse_request_header
from kproxy.protocol.produce_peek import body_start
from kproxy.protocol.records import encode_batch, make_batch
from tests.test_record_views import produce_request, records_at
from tests.test_trace_writer import header_event


def _frame(i: int, size: int) -> bytes:
    value = bytes([65 + i % 26]) * size
    req = produce_request(9, {"orders": [(0, encode_batch(make_batch(records_at(i, [value]))))]})
    return encode_request(req, i, "c")


def test_a_pooled_buffer_is_exact_size_and_comes_back_once_given() -> None:
    pool = FramePool()
    view = pool.take(100_000)
    assert len(view) == 100_000 and type(view.obj) is PooledBuffer
    buffer = view.obj
    view.release()
    pool.give(buffer)
    again = pool.take(70_000)
    assert again.obj is buffer and len(again) == 70_000
    assert type(pool.take(MAX_POOLED_BYTES + 1).obj) is bytearray  # too large to keep


def test_a_buffer_with_two_holders_comes_back_only_after_both_gave_it_back() -> None:
    """A streamed Produce's buffer: the writer may be done with it before the stream has sent its last bytes."""
    pool = FramePool()
    buffer = pool.take(100_000, holders=2).obj
    pool.give(buffer)  # the writer: the stream still sends from it
    assert pool.take(100_000).obj is not buffer
    pool.give(buffer)  # the stream: free again
    assert pool.take(100_000).obj is buffer


async def test_frames_in_pooled_buffers_read_back_whole(tmp_path: Path) -> None:
    """Frames taken from one pool and reused as soon as they are given back, with small and large
    flushes and rotations between them: every event's records read back as produced."""
    pool = FramePool()
    writer = TraceWriter(tmp_path, proxy_id="pool", level="records", rotate_bytes=400_000)
    sizes = [(i * 7919) % 90_000 + 10 for i in range(60)]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i, size in enumerate(sizes):
            encoded = _frame(i, size)
            frame = pool.take(len(encoded))
            frame[:] = encoded
            header = parse_request_header(encoded, 4)
            raw = ProduceRequestRecords(9, frame, body_start(frame, 4, header), None, writer.raw_ledger)
            event = header_event(i) | {"api": "produce", "direction": "request", "partitions": raw}
            if not writer.offer(event):
                await writer.put(event)
            if i % 7 == 6:
                await trio.sleep(writer.flush_interval)  # let some flushes, and some give-backs, happen
        await writer.aclose()
    events = sorted(iter_trace_events(tmp_path), key=lambda e: e["correlation_id"])
    assert [e["correlation_id"] for e in events] == list(range(len(sizes)))
    for i, (event, size) in enumerate(zip(events, sizes)):
        (part,) = event["partitions"]
        (record,) = part["records"]
        assert record["value"] == chr(65 + i % 26) * size
    assert pool.kept_bytes > 0  # buffers came back and were used again


async def test_every_event_points_only_into_its_own_trace_files_side_file(tmp_path: Path) -> None:
    """Rotation happens between batches, never inside one, and a Produce response written after a
    rotation does not point into the side file of its request's trace file: each trace file can be
    read (or moved, or deleted) with its own side file alone, as a remote analysis reads it."""
    from kproxy.obs.trace_files import iter_file_events, trace_files
    from kproxy.obs.trace_records import ProduceResponseRecords
    from kproxy.protocol.codec import encode_response
    from tests.test_response_faults import produce_response

    writer = TraceWriter(tmp_path, proxy_id="own", level="records", rotate_bytes=150_000)
    sizes = [(i * 7919) % 40_000 + 10 for i in range(60)]
    pending: list = []
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i, size in enumerate(sizes):
            encoded = _frame(i, size)
            header = parse_request_header(encoded, 4)
            raw = ProduceRequestRecords(9, encoded, body_start(encoded, 4, header), None, writer.raw_ledger)
            events = [header_event(2 * i) | {"api": "produce", "direction": "request", "partitions": raw}]
            pending.append((i, raw))
            if i % 3 == 2:  # answers come a few requests later: some after their request's file rotated
                for j, answered in pending:
                    response = encode_response(produce_response(9, {"orders": [(0, 0, 100 + j)]}), j)
                    events.append(header_event(2 * j + 1) | {"api": "produce", "direction": "response",
                                                             "partitions": ProduceResponseRecords(answered, 9, response)})
                pending = []
            for event in events:
                if not writer.offer(event):
                    await writer.put(event)
            if i % 5 == 4:
                await trio.sleep(writer.flush_interval)
        await writer.aclose()
    files = trace_files(tmp_path)
    assert len(files) >= 4
    pointers = 0
    for path in files:
        for event in iter_file_events(path):
            for part in event["partitions"] or ():
                if part.get("records_file"):
                    pointers += 1
                    assert part["records_file"] == path.with_suffix(".records").name, (path.name, event["direction"])
    assert pointers >= len(sizes)
    # Every response still reads back with its request's records where they share a file.
    events = list(iter_trace_events(tmp_path))
    assert sorted(e["correlation_id"] for e in events) == list(range(2 * len(sizes)))
