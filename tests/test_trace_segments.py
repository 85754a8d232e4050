"""The fixed-layout segment trace format: round trips, a torn tail after a kill, corruption with its offset."""

from __future__ import annotations

import zlib
from pathlib import Path

import orjson
import pytest

from kproxy.obs.trace import TraceWriter
from kproxy.obs.trace_files import TraceFileError, iter_trace_events, trace_files
from kproxy.obs.trace_schema import FIELD_NAMES, SCHEMA_VERSION
from kproxy.obs.trace_segments import SegmentFile, encode_segment, segment_to_arrow
from tests.test_trace_writer import header_event, records_event, write_all


def filled(event: dict) -> dict:
    """An event as a reader of a fixed-layout file returns it: every schema field, null when absent."""
    return {name: event.get(name) for name in FIELD_NAMES}


async def test_segments_hold_what_jsonl_holds_at_records_level(tmp_path: Path) -> None:
    events = [records_event(i) for i in range(40)] + [header_event(40 + i, hazard="stale_end_txn", rule="r1",
                                                                   end_txn_commit=i % 2 == 0, latency_ms=0.25 * i)
                                                      for i in range(10)]
    events.append({"direction": "close", "conn_id": 9, "close_reason": "client_closed", "in_flight": [
        {"conn_id": 9, "correlation_id": 3, "copy": 0, "api": "fetch", "api_key": 1, "api_version": 12,
         "state": "awaiting_broker"}]})
    # Text outside the BMP and a lone surrogate-free odd character survive the dictionary.
    events.append(header_event(99, client_id="cli\u00e9nt-\U0001f600", transactional_id="tx-\u2603"))
    as_json = orjson.loads(orjson.dumps(events))

    jsonl, segments = tmp_path / "jsonl", tmp_path / "segments"
    await write_all(TraceWriter(jsonl, level="records", fmt="jsonl", proxy_id="rt"), orjson.loads(orjson.dumps(events)))
    writer = TraceWriter(segments, level="records", fmt="segments", proxy_id="rt")
    await write_all(writer, orjson.loads(orjson.dumps(events)))

    assert [p.suffix for p in trace_files(segments)] == [".events"]
    got = list(iter_trace_events(segments))
    assert got == [filled(e) for e in iter_trace_events(jsonl)]
    assert [{k: v for k, v in e.items() if k not in ("schema_version", "proxy_id")} for e in got] == [
        {k: v for k, v in filled(e).items() if k not in ("schema_version", "proxy_id")} for e in as_json]
    assert {e["schema_version"] for e in got} == {SCHEMA_VERSION} and {e["proxy_id"] for e in got} == {"rt"}
    assert writer.written == len(events)
    assert isinstance(got[40]["end_txn_commit"], bool)


async def test_an_event_that_does_not_fit_its_column_is_dropped_alone(tmp_path: Path) -> None:
    events = [header_event(0), header_event(1, correlation_id="not a number"), header_event(2)]
    writer = TraceWriter(tmp_path, fmt="segments", proxy_id="bad")
    await write_all(writer, events)
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == [0, 2]
    assert writer.written == 2 and writer.unwritable == 1


def _three_segments(path: Path) -> bytes:
    from kproxy.obs.trace_segments import COLUMNS, file_header

    rows = [[filled(header_event(i))[name] for name, _ in COLUMNS] for i in range(9)]
    data = file_header() + encode_segment(rows[:3]) + encode_segment(rows[3:6]) + encode_segment(rows[6:])
    path.write_bytes(data)
    return data


def test_a_torn_tail_reads_back_up_to_the_last_complete_segment(tmp_path: Path) -> None:
    path = tmp_path / "trace-k-20260101T000000-000000.events"
    data = _three_segments(path)
    ends = [offset + length for offset, length in SegmentFile(path).segments]
    assert ends[-1] == len(data)
    # A kill may cut the file anywhere: every cut reads back the complete segments before it.
    for cut in range(0, len(data) + 1, 7):
        path.write_bytes(data[:cut])
        complete = sum(1 for end in ends if end <= cut)
        assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(3 * complete)), cut


def test_a_damaged_complete_segment_is_an_error_with_file_and_offset(tmp_path: Path) -> None:
    path = tmp_path / "trace-k-20260101T000000-000000.events"
    data = bytearray(_three_segments(path))
    second = SegmentFile(path).segments[1][0]
    data[second + 10] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(TraceFileError, match=rf"{path.name}:{second - 12}: segment checksum mismatch"):
        list(iter_trace_events(tmp_path))
    path.write_bytes(b"PAR1 not a trace at all")
    with pytest.raises(TraceFileError, match=rf"{path.name}:0: not a kproxy trace segment file"):
        list(iter_trace_events(tmp_path))


def test_a_checksummed_segment_with_a_bad_layout_is_reported_not_misread(tmp_path: Path) -> None:
    from kproxy.obs.trace_segments import _SEGMENT_HEAD, SEGMENT_MAGIC, file_header

    payload = (5).to_bytes(4, "little") + b"\x07"  # 5 rows, then a block tag that does not exist
    path = tmp_path / "trace-k-20260101T000000-000000.events"
    path.write_bytes(file_header() + _SEGMENT_HEAD.pack(SEGMENT_MAGIC, len(payload), zlib.crc32(payload)) + payload)
    with pytest.raises(TraceFileError, match="unknown block tag 7"):
        list(iter_trace_events(tmp_path))


def test_a_segment_file_of_a_newer_schema_is_refused_by_every_reader(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from kproxy.cli import main
    from kproxy.obs.trace_files import check_file_version
    from kproxy.obs.trace_schema import READABLE_VERSIONS
    from kproxy.obs.trace_segments import (
        _SEGMENT_HEAD, COLUMNS, SegmentError, file_header, read_segment_cells, segment_index)
    from tests.test_trace_writer import unreadable_message

    newer = max(READABLE_VERSIONS) + 1
    path = tmp_path / "trace-k-20260101T000000-000000.events"
    header = file_header(schema_version=newer)
    segment = encode_segment([[filled(header_event(i))[name] for name, _ in COLUMNS] for i in range(3)])
    path.write_bytes(header + segment)
    refused = unreadable_message(path.name, newer)

    with pytest.raises(TraceFileError, match=refused):
        list(iter_trace_events(tmp_path))
    # The analysis: its driver lists the segments, its executors read them.
    with pytest.raises(SegmentError, match=refused):
        segment_index(path)
    with pytest.raises(SegmentError, match=refused):
        read_segment_cells(path, len(header) + _SEGMENT_HEAD.size, len(segment) - _SEGMENT_HEAD.size)
    with pytest.raises(TraceFileError, match=refused):
        check_file_version(path)
    result = CliRunner().invoke(main, ["trace", "export", str(path)])
    assert result.exit_code == 1 and f"trace schema version {newer} is not one this kproxy reads" in result.output


def test_a_segment_converts_to_arrow_with_nested_fields_as_json_text(tmp_path: Path) -> None:
    path = tmp_path / "trace-k-20260101T000000-000000.events"
    _three_segments(path)
    seg = SegmentFile(path)
    batch = segment_to_arrow(seg, 1)
    assert batch.num_rows == 3 and batch.schema.names == list(FIELD_NAMES)
    assert batch.column("correlation_id").to_pylist() == [3, 4, 5]
    assert [orjson.loads(c) for c in batch.column("error_codes").to_pylist()] == [[47, 48], [], []]


def idle_fetch_response(i: int, high_watermark: int) -> dict:
    """A Fetch response with nothing to return, as noida-db sends an idle consumer thousands of times a
    second: per partition the offsets and every aborted transaction since the log began, no records."""
    return header_event(i, api="fetch", api_key=1, api_version=12, direction="response", transactional_id=None,
                        producer_id=None, producer_epoch=None, txn_client=None, txn_broker=None, partitions=[
        {"topic": f"kproxy-demo-47bfbcb204-{p}", "partition": 0, "error_code": 0, "base_offset": None,
         "high_watermark": high_watermark + p, "last_stable_offset": high_watermark + p, "log_start_offset": 0,
         "aborted_transactions": [{"producer_id": 1000 + k % 3, "first_offset": 3 * k} for k in range(8)],
         "compression": None, "records": [], "batches": [], "records_file": None, "records_offset": None,
         "records_length": None}
        for p in range(4)])


async def test_repeated_fetch_partitions_are_stored_once_per_segment(tmp_path: Path) -> None:
    from kproxy.obs.trace_segments import COLUMNS

    # Three high watermarks in 300 responses: three distinct partitions texts.
    events = [idle_fetch_response(i, 40 + i // 100) for i in range(300)]
    as_json = orjson.loads(orjson.dumps(events))
    text = len(orjson.dumps(events[0]["partitions"]))
    assert text > 1000
    rows = [[filled(e)[name] for name, _ in COLUMNS] for e in events]
    # Each text once, then a 4-byte code per row (a plain json block: the text per row).
    assert len(encode_segment(rows)) < 3 * text + 300 * 120

    jsonl, segments = tmp_path / "jsonl", tmp_path / "segments"
    await write_all(TraceWriter(jsonl, level="records", fmt="jsonl", proxy_id="idle"), orjson.loads(orjson.dumps(events)))
    await write_all(TraceWriter(segments, level="records", fmt="segments", proxy_id="idle"),
                    orjson.loads(orjson.dumps(events)))
    (path,) = trace_files(segments)
    assert path.stat().st_size < len(SegmentFile(path).segments) * 3 * text + 300 * 120 + 4096
    got = list(iter_trace_events(segments))
    assert got == [filled(e) for e in iter_trace_events(jsonl)]
    # Readers may change what they get: no two events share a parsed partitions list.
    got[0]["partitions"][0]["records"].append("x")
    assert got[1]["partitions"][0]["records"] == []
    batch = segment_to_arrow(SegmentFile(path), 0)
    assert [orjson.loads(c) for c in batch.column("partitions").to_pylist()] == [
        e["partitions"] for e in as_json[: batch.num_rows]]


# ---- a real proxy, killed mid-run, read back with `kproxy trace export` -----------------


@pytest.mark.timeout(60)
def test_export_reads_a_sigkilled_proxys_segments_up_to_the_last_complete_segment(
        proxy_factory, broker, tmp_path: Path, topic_name: str) -> None:
    import signal
    import time

    from click.testing import CliRunner

    from kproxy.cli import main
    from tests.test_trace_signals import FLUSHED_BEFORE_KILL_S, check_well_formed, traced_produce_responses, \
        traced_producer

    proxy, producer, traces = traced_producer(proxy_factory, broker, tmp_path, topic_name, fmt="segments")
    producer.wait_for_deliveries(100)
    time.sleep(FLUSHED_BEFORE_KILL_S + 0.2)
    killed_at = time.monotonic()
    assert proxy.stop(signal.SIGKILL) == -signal.SIGKILL
    producer.stop()

    (trace_file,) = trace_files(traces)
    assert trace_file.suffix == ".events" and trace_file.with_suffix(".records").exists()
    # A kill mid-write leaves part of a segment behind the last complete one.
    data = trace_file.read_bytes()
    segments = SegmentFile(trace_file).segments
    assert len(segments) >= 5, "the writer should have flushed a segment per 100 ms"
    last_offset, last_length = segments[-1]
    trace_file.write_bytes(data + data[last_offset - 12 : last_offset + last_length // 2])

    result = CliRunner().invoke(main, ["trace", "export", str(traces)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    events = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
    check_well_formed(events)
    assert {e["schema_version"] for e in events} == {SCHEMA_VERSION}
    assert events == list(iter_trace_events(traces))
    traced = traced_produce_responses(events, topic_name)
    assert sorted(traced) == list(range(max(traced) + 1)), "a hole before the last complete segment"
    settled = [d for d in producer.delivered if d.seen_at < killed_at - FLUSHED_BEFORE_KILL_S]
    assert len(settled) >= 100
    assert [d for d in settled if traced.get(d.offset) != d.value] == []

    # One file, compact, without records; damage inside the file is an error naming it and the offset.
    result = CliRunner().invoke(main, ["trace", "export", "--compact", "--no-records", str(trace_file)])
    assert result.exit_code == 0
    compact = [orjson.loads(line) for line in result.stdout_bytes.splitlines()]
    assert len(compact) == len(events) and all(None not in e.values() for e in compact)
    produced = [p for e in compact if e.get("api") == "produce" and e["direction"] == "request" for p in e["partitions"]]
    assert produced and all(p["records"] is None and p["records_file"] for p in produced)
    damaged = bytearray(data)
    damaged[segments[1][0] + 5] ^= 0x55
    trace_file.write_bytes(bytes(damaged))
    result = CliRunner().invoke(main, ["trace", "export", str(traces)])
    assert result.exit_code == 1 and f"{trace_file.name}:{segments[1][0] - 12}: segment checksum mismatch" in result.output


def _decoded_rows(segment: bytes) -> list[list]:
    from kproxy.obs.trace_segments import COLUMNS, decode_payload

    n, cols = decode_payload(memoryview(segment)[12:], COLUMNS)
    kinds = [kind for _, kind in COLUMNS]
    cols = [[None if c is None else orjson.loads(c) for c in col] if kind == "json" else col
            for col, kind in zip(cols, kinds)]
    return [list(row) for row in zip(*cols)]


@pytest.mark.parametrize("shape", ["constant", "one differs", "nulls and empties", "one error list", "all null"])
def test_columns_of_one_value_nulls_and_empty_lists_read_back_as_written(shape: str) -> None:
    """The encoder's shortcuts (a value in every row, every cell null, only empty lists) change bytes, not cells."""
    from kproxy.obs.trace_segments import COLUMNS

    def row(i: int) -> list:
        event = filled(header_event(0, correlation_id=7, size=120, error_codes=[]))
        if shape == "one differs" and i == 3:
            event |= {"correlation_id": 8, "client_id": "other", "size": 121, "wall_time": 2.5}
        if shape == "nulls and empties":
            event["error_codes"] = None if i % 2 else []
            event["producer_id"] = None if i % 3 else 4000
        if shape == "one error list" and i == 5:
            event["error_codes"] = [47]
        if shape == "all null":
            event = {name: None for name in FIELD_NAMES} | {"schema_version": SCHEMA_VERSION}
        return [event[name] for name, _ in COLUMNS]

    rows = [row(i) for i in range(9)]
    assert _decoded_rows(encode_segment(rows)) == [
        [bool(c) if kind == "boolean" and c is not None else c for c, (_, kind) in zip(r, COLUMNS)] for r in rows
    ]


def test_a_cell_of_the_wrong_kind_is_still_refused_in_a_column_of_one_value() -> None:
    from kproxy.obs.trace_segments import COLUMNS

    names = [name for name, _ in COLUMNS]
    rows = [[None] * len(COLUMNS) for _ in range(4)]
    for r in rows:
        r[names.index("correlation_id")] = "not a number"
    with pytest.raises(TypeError):
        encode_segment(rows)
    rows[0][names.index("correlation_id")] = 1.5  # a float in an int column, with nulls beside it
    for r in rows[1:]:
        r[names.index("correlation_id")] = None
    with pytest.raises(TypeError):
        encode_segment(rows)
