"""The trace writer: round trips, rotation, backpressure and drops, shutdown and kill guarantees."""

from __future__ import annotations

import gc
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import orjson
import pytest
import trio

from kproxy.obs import metrics
from kproxy.obs.trace import TraceWriter, trace_file_name
from kproxy.obs.trace_events import PendingRow
from kproxy.obs.trace_files import TraceFileError, iter_trace_events, trace_files
from kproxy.obs.trace_schema import FIELD_NAMES, SCHEMA_VERSION
from kproxy.obs.trace_segments import SegmentFile
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis


def trace_events_total(outcome: str) -> float:
    return metrics.REGISTRY.get_sample_value("kproxy_trace_events_total", {"outcome": outcome}) or 0.0


def backpressure_seconds() -> float:
    return metrics.REGISTRY.get_sample_value("kproxy_trace_backpressure_seconds_total") or 0.0


def header_event(i: int, **extra: object) -> dict:
    return {
        "wall_time": 1_700_000_000.0 + i / 1000,
        "mono_ns": 10_000 + i,
        "conn_id": 7,
        "client_addr": "127.0.0.1:50000",
        "broker_id": 1,
        "direction": "request" if i % 2 == 0 else "response",
        "api": "produce",
        "api_key": 0,
        "api_version": 9,
        "correlation_id": i,
        "client_id": "rdkafka",
        "size": 120 + i,
        "error_codes": [] if i % 3 else [47, 48],
        "transactional_id": "tx-1",
        "producer_id": 4000,
        "producer_epoch": 2,
        "txn_client": i // 10,
        "txn_broker": i // 10,
        "hazard": None,
        "rule": None,
        "action": None,
        "outcome": "delivered",
        "copy": 0,
        **extra,
    }


def records_event(i: int) -> dict:
    return header_event(
        i,
        partitions=[
            {
                "topic": "orders",
                "partition": 2,
                "error_code": 0,
                "base_offset": 100 + i,
                "high_watermark": 200,
                "last_stable_offset": 190,
                "log_start_offset": 0,
                "aborted_transactions": [{"producer_id": 4000, "first_offset": 17}],
                "compression": "zstd",
                "records": [
                    {
                        "offset": 100 + i,
                        "key": f"k{i}",
                        "value": "b64:AAEC",
                        "control": None,
                        "producer_id": 4000,
                        "producer_epoch": 2,
                        "sequence": i,
                        "transactional": True,
                    },
                    {
                        "offset": 101 + i,
                        "key": None,
                        "value": None,
                        "control": "commit",
                        "producer_id": 4000,
                        "producer_epoch": 2,
                        "sequence": -1,
                        "transactional": True,
                    },
                ],
            }
        ],
    )


async def hand_over(writer: TraceWriter, event: dict) -> None:
    """The proxy's calling pattern: the cheap offer, and the awaitable slow path only when told."""
    if not writer.offer(event):
        await writer.put(event)


async def write_all(writer: TraceWriter, events: list[dict]) -> None:
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for event in events:
            await hand_over(writer, event)
        await writer.aclose()


def without_nulls(event: dict) -> dict:
    """Parquet returns every schema field (null when absent); compare on what was given."""
    return {k: v for k, v in event.items() if v is not None}


# ---- round trips -----------------------------------------------------------


async def test_jsonl_round_trip_at_records_level(tmp_path: Path) -> None:
    events = [records_event(i) for i in range(50)]
    expected = orjson.loads(orjson.dumps(events))
    writer = TraceWriter(tmp_path, level="records", fmt="jsonl", proxy_id="rt")
    await write_all(writer, events)

    got = list(iter_trace_events(tmp_path))
    assert [{k: v for k, v in e.items() if k not in ("schema_version", "proxy_id")} for e in got] == expected
    assert {e["schema_version"] for e in got} == {SCHEMA_VERSION}
    assert {e["proxy_id"] for e in got} == {"rt"}
    assert writer.written == 50


async def test_parquet_round_trip_uses_the_schema(tmp_path: Path) -> None:
    events = [records_event(i) for i in range(40)]
    expected = orjson.loads(orjson.dumps(events))
    writer = TraceWriter(tmp_path, level="records", fmt="parquet", proxy_id="pq")
    await write_all(writer, events)

    files = trace_files(tmp_path)
    assert files and all(p.suffix == ".parquet" for p in files)
    got = list(iter_trace_events(tmp_path, strict=True))
    assert len(got) == 40
    assert all(set(e) == set(FIELD_NAMES) for e in got)
    for want, have in zip(expected, got, strict=True):
        assert have["schema_version"] == SCHEMA_VERSION and have["proxy_id"] == "pq"
        have_top = without_nulls(have)
        for key, value in want.items():
            if key == "partitions":
                continue
            assert have_top.get(key) == value or (value is None and key not in have_top), key
        [want_p], [have_p] = want["partitions"], have["partitions"]
        assert have_p["records"] == want_p["records"]
        assert have_p["aborted_transactions"] == want_p["aborted_transactions"]
        assert without_nulls(have_p) | {"records": None} == without_nulls(want_p) | {"records": None}


async def test_headers_level_drops_partition_records(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, level="headers", proxy_id="hd")
    assert not writer.records
    await write_all(writer, [records_event(0)])
    [event] = iter_trace_events(tmp_path)
    assert event["partitions"] is None
    assert event["correlation_id"] == 0


async def test_raw_bytes_are_encoded_like_the_schema_says(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, proxy_id="by")
    await write_all(writer, [header_event(0, client_id=b"text"), header_event(1, client_id=b"\xff\x00")])
    first, second = iter_trace_events(tmp_path)
    assert first["client_id"] == "text"
    assert second["client_id"] == "b64:/wA="


async def test_unserialisable_event_is_counted_not_fatal(tmp_path: Path) -> None:
    dropped_before = trace_events_total("dropped")
    writer = TraceWriter(tmp_path, proxy_id="bad")
    await write_all(writer, [header_event(0), header_event(1, client_id=object()), header_event(2)])
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == [0, 2]
    assert writer.unwritable == 1
    assert trace_events_total("dropped") - dropped_before == 1


async def test_deferred_events_are_built_after_offer_returns_in_order(tmp_path: Path) -> None:
    """The data path pays a deque append: a deferred event is built later, by the writer, in order."""
    built: list[int] = []
    offered: list[int] = []

    class Conn:
        client_addr, node_id = "127.0.0.1:1", 1

        def __init__(self, i: int) -> None:
            self.i = i

        @property
        def conn_id(self) -> int:  # read when the row is built
            built.append(self.i)
            return self.i

    def pending(i: int, broken: bool = False) -> PendingRow:
        ex = None if broken else Exchange(apis.METADATA, 12, i, "c", 0.0)
        return PendingRow(Conn(i), ex, "request", 10, None, None, 0.0, 1.7e9, i, "lazy")

    dropped_before = trace_events_total("dropped")
    writer = TraceWriter(tmp_path, proxy_id="lazy")
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for event in [pending(0), header_event(1), pending(2, broken=True), pending(3)]:
            assert writer.offer(event)
            offered.append(len(built))
        await writer.aclose()
    assert offered == [0, 0, 0, 0]  # nothing was built while the data path was offering
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == [0, 1, 3]
    assert built == [0, 3]
    assert writer.unwritable == 1
    assert trace_events_total("dropped") - dropped_before == 1


async def test_the_writer_works_when_the_loop_is_idle_and_lets_it_run_between_steps(tmp_path: Path) -> None:
    """While another task keeps the loop busy the writer waits (until its flush deadline);
    once it works, it never keeps the loop for more than a step at a time."""
    writer = TraceWriter(tmp_path, proxy_id="idle", flush_interval=0.2)
    gaps: list[float] = []
    composed_while_busy: list[int] = []

    async def busy(seconds: float) -> None:
        # Yields after every 20 µs of work: never idle for the writer's cushion.
        # Gaps are in this thread's CPU time, which the OS preempting us does not inflate.
        end = time.perf_counter() + seconds
        last = time.thread_time()
        while time.perf_counter() < end:
            spin = time.perf_counter() + 0.00002
            while time.perf_counter() < spin:
                pass
            await trio.lowlevel.checkpoint()
            now = time.thread_time()
            gaps.append(now - last)
            last = now

    # A collection of the test process's heap (pytest's, hypothesis') is no step of the writer's.
    gc.disable()
    try:
        async with trio.open_nursery() as nursery:
            await nursery.start(writer.run)
            for i in range(2000):
                writer.offer(header_event(i, partitions=[{"topic": "t", "partition": i % 7}]))
            await busy(0.05)  # well inside flush_interval: nothing urgent, the writer waits
            composed_while_busy.append(2000 - len(writer._queue))
            gaps.clear()
            # Past the deadline the writer works in steps between ours, until its queue is empty
            # (a loaded machine gives it less of each second: wait up to 10 s for that).
            deadline = time.perf_counter() + 10
            while writer._queue and time.perf_counter() < deadline:
                await busy(0.1)
            assert not writer._queue
            await writer.aclose()
    finally:
        gc.enable()
    assert composed_while_busy == [0]
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(2000))
    # All 2000 events took the writer tens of ms; none of its steps (composing,
    # or encoding a segment) took more than a fraction of one.
    assert max(gaps) < 0.002


async def test_steady_traffic_is_written_in_batches_of_a_flush_interval_not_of_a_few_events(tmp_path: Path) -> None:
    """Events offered while a batch is written start the next batch, due a flush interval later.

    The writer used to keep the written batch's due time while traffic went
    on and wrote a segment each time its queue ran dry, each paying a whole
    segment's per-column cost: here 16 segments where 8 are due; under a
    proxy's load, segments of 20 events instead of 100."""
    writer = TraceWriter(tmp_path, proxy_id="steady", flush_interval=0.1)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        started = trio.current_time()
        i = 0
        while trio.current_time() - started < 0.6:
            writer.offer(header_event(i))
            i += 1
            await trio.sleep(0.001)
        await writer.aclose()
    (path,) = trace_files(tmp_path)
    segments = len(SegmentFile(path).segments)
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(i))
    # 0.6 s of events, a batch due 75 ms after its first event: about 8 segments (a loaded
    # machine stretches the run, not the count).
    assert segments <= 12, (segments, i)


# ---- rotation ----------------------------------------------------------------


async def test_rotation_by_size_keeps_every_event_in_order(tmp_path: Path) -> None:
    """A file rotates after the batch that filled it: it passes rotate_bytes by less than one batch."""
    events = [header_event(i) for i in range(300)]
    line_size = max(len(orjson.dumps(e | {"schema_version": 1, "proxy_id": "sz"})) + 1 for e in events)
    writer = TraceWriter(tmp_path, fmt="jsonl", proxy_id="sz", rotate_bytes=10 * line_size, flush_interval=0.005)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for start in range(0, len(events), 3):  # batches of at most three events
            for event in events[start : start + 3]:
                await hand_over(writer, event)
            while writer._queue or writer._batch:
                await trio.sleep(0.001)
        await writer.aclose()

    files = trace_files(tmp_path)
    assert len(files) >= 25
    assert files == writer.files
    for path in files:
        assert path.stat().st_size < 13 * line_size
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(300))


async def test_rotation_by_time_closes_the_file_even_when_idle(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, fmt="parquet", proxy_id="tm", rotate_seconds=0.2, flush_interval=0.05)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.offer(header_event(0))
        # Idle past the rotation age: the Parquet file gets its footer without more traffic.
        with trio.fail_after(5):
            while not list(iter_trace_events(tmp_path)):
                await trio.sleep(0.05)
        writer.offer(header_event(1))
        await trio.sleep(0.5)
        writer.offer(header_event(2))
        await writer.aclose()
    files = trace_files(tmp_path)
    assert len(files) == 3
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path, strict=True)] == [0, 1, 2]


async def test_restart_with_the_same_proxy_id_continues_the_sequence(tmp_path: Path) -> None:
    await write_all(TraceWriter(tmp_path, proxy_id="same"), [header_event(0)])
    await write_all(TraceWriter(tmp_path, proxy_id="same"), [header_event(1)])
    files = trace_files(tmp_path)
    assert [p.name.rsplit("-", 1)[1] for p in files] == ["000000.events", "000001.events"]
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == [0, 1]


def test_file_names_carry_proxy_utc_time_and_sequence() -> None:
    assert trace_file_name("edge-1", 0.0, 3, "jsonl") == "trace-edge-1-19700101T000000-000003.jsonl"
    assert trace_file_name("edge-1", 0.0, 3, "segments") == "trace-edge-1-19700101T000000-000003.events"
    with pytest.raises(ValueError):
        TraceWriter(Path("/nonexistent"), proxy_id="../escape")


# ---- backpressure and drops -------------------------------------------------------


async def test_drop_mode_counts_drops_while_the_writer_is_stalled(tmp_path: Path) -> None:
    dropped_before = trace_events_total("dropped")
    writer = TraceWriter(tmp_path, proxy_id="dr", queue_size=4, on_full="drop", flush_interval=0.02)
    # A disk that stalls: the file thread's writes wait until the test lets them through.
    disk_free = threading.Event()
    write_started = threading.Event()
    real_write = writer._sink._io_write

    def stalled_write(data: bytes) -> None:
        write_started.set()
        disk_free.wait(10)
        real_write(data)

    writer._sink._io_write = stalled_write
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        writer.offer(header_event(0))
        with trio.fail_after(5):  # until the writer took event 0 and the disk is stuck writing it
            while not write_started.is_set():
                await trio.sleep(0.01)
        # Batches pile up at the stalled disk until the writer stops taking events.
        offered = 1
        with trio.fail_after(10):
            while writer.dropped == 0:
                writer.offer(header_event(offered))
                offered += 1
                await trio.sleep(0.001)
        results = [writer.offer(header_event(i)) for i in range(offered, offered + 20)]
        assert all(results)  # in drop mode the caller never has to await put()
        assert writer.dropped >= 20 and writer.accepted + writer.dropped == offered + 20
        accepted = writer.accepted
        assert metrics.REGISTRY.get_sample_value("kproxy_trace_queue_depth") == 4
        disk_free.set()
        await writer.aclose()
    assert trace_events_total("dropped") - dropped_before == writer.dropped
    written = [e["correlation_id"] for e in iter_trace_events(tmp_path)]
    assert len(written) == accepted and written == sorted(written) and written[0] == 0


async def test_a_failing_disk_stops_the_writer_and_the_data_path_hears_of_it(tmp_path: Path) -> None:
    import errno

    from kproxy.obs.trace import TraceWriterError

    writer = TraceWriter(tmp_path, proxy_id="full", flush_interval=0.02)

    def disk_full(data: bytes) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    writer._sink._io_write = disk_full
    failures: list[TraceWriterError] = []

    async def run_writer() -> None:
        try:
            await writer.run()
        except TraceWriterError as exc:
            failures.append(exc)

    async with trio.open_nursery() as nursery:
        nursery.start_soon(run_writer)
        writer.offer(header_event(0))
        with trio.fail_after(5):
            while not failures:
                await trio.sleep(0.01)
    assert "No space left on device" in str(failures[0])
    with pytest.raises(TraceWriterError, match="No space left"):
        await writer.put(header_event(1))


async def test_block_mode_loses_nothing_under_a_burst_larger_than_the_queue(tmp_path: Path) -> None:
    written_before = trace_events_total("written")
    wait_before = backpressure_seconds()
    writer = TraceWriter(tmp_path, proxy_id="bl", queue_size=8)
    slow_paths = 0
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(3000):
            event = header_event(i)
            if not writer.offer(event):
                slow_paths += 1
                await writer.put(event)
        await writer.aclose()
    assert slow_paths > 0
    assert writer.dropped == 0
    assert backpressure_seconds() > wait_before
    assert trace_events_total("written") - written_before == 3000
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(3000))


# ---- shutdown -----------------------------------------------------------------------


async def test_aclose_writes_everything_accepted(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, proxy_id="ac", queue_size=100_000, flush_interval=0.2)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(50_000):  # far faster than one flush interval: most are still queued
            assert writer.offer({"correlation_id": i})
        await writer.aclose()
        assert writer.offer({"correlation_id": -1}) is True  # after close: counted as dropped
        assert writer.dropped == 1
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(50_000))


async def test_aclose_without_run_writes_what_was_offered(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, proxy_id="nr")
    for i in range(10):
        writer.offer({"correlation_id": i})
    await writer.aclose()
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(10))


async def test_cancelling_the_nursery_still_writes_everything_accepted(tmp_path: Path) -> None:
    writer = TraceWriter(tmp_path, proxy_id="cn", flush_interval=0.2)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(1000):
            writer.offer({"correlation_id": i})
        nursery.cancel_scope.cancel()
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(1000))


# ---- reading back ---------------------------------------------------------------------


def test_reader_skips_a_torn_last_line_but_not_corruption(tmp_path: Path) -> None:
    good = tmp_path / trace_file_name("rd", 0, 0, "jsonl")
    good.write_bytes(b'{"correlation_id":0}\n{"correlation_id":1}\n{"correlation_id":2,"api":"pro')
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == [0, 1]

    bad = tmp_path / trace_file_name("rd", 0, 1, "jsonl")
    bad.write_bytes(b'{"correlation_id":3}\n{"correlation_id":4,"api\n{"correlation_id":5}\n')
    with pytest.raises(TraceFileError, match=":2:"):
        list(iter_trace_events(tmp_path))


def test_reader_skips_a_parquet_file_without_footer(tmp_path: Path) -> None:
    (tmp_path / trace_file_name("rd", 0, 0, "parquet")).write_bytes(b"PAR1\x00\x01\x02")
    (tmp_path / trace_file_name("rd", 0, 1, "jsonl")).write_bytes(b'{"correlation_id":9}\n')
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == [9]
    with pytest.raises(TraceFileError):
        list(iter_trace_events(tmp_path, strict=True))


def unreadable_message(where: str, version: int) -> str:
    """The pattern of a reader's refusal of a trace of schema `version` at `where` (file, or file:line)."""
    from kproxy.obs.trace_schema import READABLE_VERSIONS

    readable = ", ".join(map(str, READABLE_VERSIONS))
    return rf"{where}: trace schema version {version} is not one this kproxy reads \(it reads versions {readable}\)"


def test_reader_refuses_jsonl_and_parquet_events_of_a_newer_schema(tmp_path: Path) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kproxy.obs.trace_schema import READABLE_VERSIONS, arrow_schema

    newer = max(READABLE_VERSIONS) + 1
    jsonl = tmp_path / "jsonl" / trace_file_name("rd", 0, 0, "jsonl")
    jsonl.parent.mkdir()
    jsonl.write_bytes(orjson.dumps(header_event(0, schema_version=SCHEMA_VERSION)) + b"\n"
                      + orjson.dumps(header_event(1, schema_version=newer)) + b"\n")
    with pytest.raises(TraceFileError, match=unreadable_message(f"{jsonl.name}:2", newer)):
        list(iter_trace_events(jsonl.parent))

    parquet = tmp_path / "parquet" / trace_file_name("rd", 0, 0, "parquet")
    parquet.parent.mkdir()
    rows = [{name: header_event(i, schema_version=newer).get(name) for name in FIELD_NAMES} for i in range(2)]
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), parquet)
    with pytest.raises(TraceFileError, match=unreadable_message(parquet.name, newer)):
        list(iter_trace_events(parquet.parent))


def test_a_files_version_is_checked_without_reading_its_events(tmp_path: Path) -> None:
    """check_file_version: for a reader that parses the events itself (the analysis's Spark readers)."""
    import gzip

    import pyarrow as pa
    import pyarrow.parquet as pq

    from kproxy.obs.trace_files import check_file_version
    from kproxy.obs.trace_schema import READABLE_VERSIONS, arrow_schema

    newer = max(READABLE_VERSIONS) + 1
    lines = {version: b"".join(orjson.dumps(header_event(i, schema_version=version)) + b"\n" for i in range(3))
             for version in (SCHEMA_VERSION, newer)}
    for version, name in ((SCHEMA_VERSION, "now.jsonl"), (newer, "newer.jsonl")):
        (tmp_path / name).write_bytes(lines[version])
        (tmp_path / (name + ".gz")).write_bytes(gzip.compress(lines[version]))
    for version, name in ((SCHEMA_VERSION, "now.parquet"), (newer, "newer.parquet")):
        rows = [{n: header_event(i, schema_version=version).get(n) for n in FIELD_NAMES} for i in range(3)]
        pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), tmp_path / name)
    (tmp_path / "torn.jsonl").write_bytes(b'{"schema_version":' + str(newer).encode())  # no complete event yet

    for name in ("now.jsonl", "now.jsonl.gz", "now.parquet", "torn.jsonl"):
        check_file_version(tmp_path / name)
    for name, where in (("newer.jsonl", "newer.jsonl:1"), ("newer.jsonl.gz", "newer.jsonl.gz:1"),
                        ("newer.parquet", "newer.parquet")):
        with pytest.raises(TraceFileError, match=unreadable_message(where, newer)):
            check_file_version(tmp_path / name)


def test_files_sort_by_proxy_then_sequence(tmp_path: Path) -> None:
    names = [
        trace_file_name("b", 100, 0, "jsonl"),
        trace_file_name("a", 200, 10, "jsonl"),
        trace_file_name("a", 300, 9, "jsonl"),  # a later clock but an earlier file: sequence wins
        trace_file_name("a", 100, 2, "parquet"),
    ]
    for name in names:
        (tmp_path / name).write_bytes(b"")
    (tmp_path / "notes.txt").write_text("not a trace")
    assert [p.name for p in trace_files(tmp_path)] == [names[3], names[2], names[1], names[0]]


# ---- a real process, killed or terminated ---------------------------------------------

CHILD = """
import signal, sys, trio
from pathlib import Path
from kproxy.obs.trace import TraceWriter

async def main(directory, fmt):
    writer = TraceWriter(Path(directory), proxy_id="child", rotate_bytes=64 * 1024, queue_size=512, fmt=fmt)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
            async def produce():
                seq = 0
                while True:
                    event = {"api": "produce", "correlation_id": seq, "client_id": "c" * 64}
                    if not writer.offer(event):
                        await writer.put(event)
                    seq += 1
                    if seq % 200 == 0:
                        print(writer.written, flush=True)
                        await trio.sleep(0)
            async with trio.open_nursery() as producers:
                producers.start_soon(produce)
                async for _ in signals:
                    producers.cancel_scope.cancel()
                    break
        await writer.aclose()
    print("accepted", writer.accepted, flush=True)

trio.run(main, sys.argv[1], sys.argv[2])
"""


def start_child(directory: Path, fmt: str) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-c", CHILD, str(directory), fmt],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_until_written(child: subprocess.Popen, at_least: int) -> int:
    """Read the child's progress lines until its writer reports `at_least` events written."""
    deadline = time.monotonic() + 30
    assert child.stdout is not None
    for line in child.stdout:
        written = int(line)
        if written >= at_least:
            return written
        assert time.monotonic() < deadline, "child writer too slow"
    raise AssertionError(f"child exited early: {child.stderr.read() if child.stderr else ''}")


@pytest.mark.parametrize("fmt", ["segments", "jsonl"])
def test_a_killed_process_leaves_traces_readable_up_to_the_last_flushed_event(tmp_path: Path, fmt: str) -> None:
    child = start_child(tmp_path, fmt)
    try:
        flushed = wait_until_written(child, 20_000)
        child.send_signal(signal.SIGKILL)
        child.wait(10)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == -signal.SIGKILL
    assert len(trace_files(tmp_path)) > 1  # killed across rotations
    seqs = [e["correlation_id"] for e in iter_trace_events(tmp_path)]
    assert len(seqs) >= flushed
    assert seqs == list(range(len(seqs)))  # a gapless prefix: nothing before the kill is missing


@pytest.mark.parametrize("fmt", ["segments", "jsonl"])
def test_sigterm_loses_nothing_accepted(tmp_path: Path, fmt: str) -> None:
    child = start_child(tmp_path, fmt)
    try:
        wait_until_written(child, 20_000)
        child.send_signal(signal.SIGTERM)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err
    accepted = int(out.strip().splitlines()[-1].split()[1])
    seqs = [e["correlation_id"] for e in iter_trace_events(tmp_path)]
    assert seqs == list(range(accepted))
    for path in trace_files(tmp_path):
        if fmt == "jsonl":
            assert path.read_bytes().endswith(b"\n")  # a clean shutdown leaves no torn line
        else:
            assert SegmentFile(path).torn == 0


def _fetch_event(i: int, version: int = 12, size: int = 20_000, fill: int | None = None) -> bytes:
    """A records-level Fetch response event whose frame (one 20 KiB batch) waits in the queue until scanned."""
    from kproxy.protocol.codec import encode_response
    from kproxy.protocol.records import Record, encode_batch, make_batch
    from tests.test_response_faults import fetch_response

    batch = encode_batch(make_batch([Record(offset=i, timestamp=1, key=None, value=bytes([(i if fill is None else fill) % 256]) * size)]))
    frame = encode_response(fetch_response(version, {"orders": [{"partition_index": 0, "high_watermark": i + 1,
                                                              "records": batch}]}), i)
    return frame


async def test_queued_frames_are_bounded_in_bytes_block_and_drop(tmp_path: Path) -> None:
    from kproxy.obs.trace_records import FetchResponseRecords

    bound = 100_000
    for mode in ("drop", "block"):
        writer = TraceWriter(tmp_path / mode, proxy_id=mode, level="records", queue_bytes=bound, on_full=mode)
        frames = [_fetch_event(i) for i in range(12)]  # ~240 KB of frames against a 100 KB bound

        def event(i: int) -> dict:
            return header_event(i) | {"api": "fetch", "direction": "response",
                                      "partitions": FetchResponseRecords(12, frames[i], None, writer.raw_ledger)}

        if mode == "drop":  # the writer is not running: nothing leaves the queue
            assert all(writer.offer(event(i)) for i in range(12))  # the caller never waits
            assert 0 < writer.dropped < 12 and writer.raw_ledger.held <= bound + len(frames[0])
            await writer.aclose()
        else:
            refused = None
            for i in range(12):
                refused = event(i)
                if not writer.offer(refused):
                    break
            assert 0 < i < 11 and writer.raw_ledger.held <= bound + 2 * len(frames[0])
            async with trio.open_nursery() as nursery:
                await nursery.start(writer.run)
                await writer.put(refused)  # what a caller does: await room
                for j in range(i + 1, 12):
                    e = event(j)
                    if not writer.offer(e):
                        await writer.put(e)
                    assert writer.raw_ledger.held <= bound + 2 * len(frames[0])
                await writer.aclose()
            assert writer.dropped == 0 and writer.accepted == 12
        assert writer.raw_ledger.held == 0
        events = list(iter_trace_events(tmp_path / mode))
        assert len(events) == writer.accepted
        for e in events:  # every accepted frame's batch is in the side file and reads back
            (part,) = e["partitions"]
            (record,) = part["records"]
            assert record["offset"] == e["correlation_id"] and part["records_file"].endswith(".records")


async def test_a_fetch_served_again_is_stored_once_per_side_file(tmp_path: Path) -> None:
    from kproxy.obs.trace_records import DEDUPE_MIN_BYTES, FetchResponseRecords

    size = DEDUPE_MIN_BYTES + 1000
    again = _fetch_event(7, size=size, fill=1)
    rewritten = _fetch_event(7, size=size, fill=2)  # same offsets, other bytes (a truncated and rewritten log)
    writer = TraceWriter(tmp_path, proxy_id="dd", level="records")
    for corr, frame in enumerate([again, again, rewritten]):
        writer.offer(header_event(corr) | {"api": "fetch", "direction": "response",
                                           "partitions": FetchResponseRecords(12, frame, None, writer.raw_ledger)})
    await writer.aclose()
    events = list(iter_trace_events(tmp_path))
    spans = [(e["partitions"][0]["records_offset"], e["partitions"][0]["records_length"]) for e in events]
    assert spans[0] == spans[1] and spans[2][0] == spans[0][0] + spans[0][1]
    (side,) = writer._sink.side_files
    assert side.stat().st_size == spans[0][1] * 2
    values = [e["partitions"][0]["records"][0]["value"] for e in events]
    assert values == ["\x01" * size, "\x01" * size, "\x02" * size]


async def test_a_fetch_cut_at_the_fetch_size_is_told_apart_by_its_tail(tmp_path: Path) -> None:
    """Batches are fingerprinted by their headers' CRCs; the bytes of a cut batch, which no CRC covers, by a hash."""
    from kproxy.obs.trace_records import DEDUPE_MIN_BYTES, FetchResponseRecords
    from kproxy.protocol.codec import encode_response
    from kproxy.protocol.records import Record, encode_batch, make_batch
    from tests.test_response_faults import fetch_response

    whole = encode_batch(make_batch([Record(offset=5, timestamp=1, key=None, value=b"\x01" * DEDUPE_MIN_BYTES)]))

    def cut(fill: int) -> bytes:
        nxt = encode_batch(make_batch([Record(offset=6, timestamp=1, key=None, value=bytes([fill]) * 500)]))
        records = whole + nxt[:300]  # the next batch, cut at the fetch size
        return encode_response(fetch_response(12, {"orders": [{"partition_index": 0, "high_watermark": 7,
                                                                "records": records}]}), 1)

    writer = TraceWriter(tmp_path, proxy_id="cut", level="records")
    for corr, frame in enumerate([cut(1), cut(1), cut(2)]):
        writer.offer(header_event(corr) | {"api": "fetch", "direction": "response",
                                           "partitions": FetchResponseRecords(12, frame, None, writer.raw_ledger)})
    await writer.aclose()
    spans = [(e["partitions"][0]["records_offset"], e["partitions"][0]["records_length"])
             for e in iter_trace_events(tmp_path, records=False)]
    assert spans[0] == spans[1] and spans[2][0] == spans[0][0] + spans[0][1]


async def test_side_bytes_go_out_in_vectors_and_leave_the_page_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Queued side bytes are written with writev in runs of at most IOV_MAX buffers, and every
    SIDE_RECYCLE_BYTES of them is written back and dropped from the page cache: all read back, in order."""
    from kproxy.obs import trace_side_file, trace_sinks
    from kproxy.obs.trace_records import FetchResponseRecords

    monkeypatch.setattr(trace_side_file, "IOV_MAX", 3)
    monkeypatch.setattr(trace_sinks, "SIDE_RECYCLE_BYTES", 50_000)
    writer = TraceWriter(tmp_path, proxy_id="vec", level="records")
    frames = [_fetch_event(i, size=7_000 + i) for i in range(40)]
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i, frame in enumerate(frames):
            event = header_event(i) | {"api": "fetch", "direction": "response",
                                       "partitions": FetchResponseRecords(12, frame, None, writer.raw_ledger)}
            if not writer.offer(event):
                await writer.put(event)
            if i % 10 == 9:
                await trio.sleep(writer.flush_interval * 2)  # several flushes, each past the recycle window
        await writer.aclose()
    (side,) = writer._sink.side_files
    events = list(iter_trace_events(tmp_path))
    assert [e["correlation_id"] for e in events] == list(range(40))
    ends = []
    for i, e in enumerate(events):
        (part,) = e["partitions"]
        (record,) = part["records"]
        assert record["offset"] == i and len(record["value"]) == 7_000 + i
        ends.append(part["records_offset"] + part["records_length"])
    assert side.stat().st_size == max(ends) == sum(e["partitions"][0]["records_length"] for e in events)
