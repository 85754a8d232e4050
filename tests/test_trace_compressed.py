"""Rotated JSONL traces compressed afterwards (`.jsonl.gz`) read like the files the proxy wrote.

The analysis reads them (spark/kproxy_spark/traces.py); `iter_trace_events`
and `kproxy trace export` must read the same directory the same way, and say
which file is damaged when one is.
"""

from __future__ import annotations

import gzip
from pathlib import Path

import orjson
import pytest
import trio
from click.testing import CliRunner

from kproxy.cli import main
from kproxy.obs.trace import TraceWriter
from kproxy.obs.trace_files import TraceFileError, iter_trace_events, trace_files


def event(i: int) -> dict:
    return {
        "wall_time": 1_700_000_000.0 + i / 1000, "mono_ns": 10_000 + i, "conn_id": 3, "broker_id": 1,
        "direction": "request", "api": "produce", "api_key": 0, "api_version": 9, "correlation_id": i,
        "client_id": "rdkafka", "size": 100 + i, "outcome": "delivered", "copy": 0,
    }


async def write_rotated(directory: Path, proxy_id: str, first: int, count: int) -> None:
    writer = TraceWriter(directory, proxy_id=proxy_id, fmt="jsonl", rotate_bytes=2_000, flush_interval=0.005)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for i in range(first, first + count):
            if not writer.offer(event(i)):
                await writer.put(event(i))
            if i % 5 == 4:  # files rotate between batches: a few events each
                while writer._queue or writer._batch:
                    await trio.sleep(0.001)
        await writer.aclose()


def compress(path: Path) -> Path:
    packed = path.with_name(path.name + ".gz")
    packed.write_bytes(gzip.compress(path.read_bytes()))
    path.unlink()
    return packed


async def test_compressed_rotated_files_read_in_order_and_a_restart_continues_after_them(tmp_path: Path) -> None:
    await write_rotated(tmp_path, "edge-1", 0, 60)
    written = trace_files(tmp_path)
    assert len(written) >= 3, "the size limit should have rotated the trace"
    for path in written:  # the proxy stopped: a log rotator compresses every file
        compress(path)
    # A restarted proxy must number its files after the compressed ones, or they would sort among them.
    await write_rotated(tmp_path, "edge-1", 60, 10)

    names = [p.name for p in trace_files(tmp_path)]
    assert [name.endswith(".jsonl.gz") for name in names] == [True] * len(written) + [False] * (len(names) - len(written))
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == list(range(70))

    result = CliRunner().invoke(main, ["trace", "export", "--compact", str(tmp_path)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    assert [orjson.loads(line)["correlation_id"] for line in result.stdout.splitlines()] == list(range(70))

    one = trace_files(tmp_path)[0]
    result = CliRunner().invoke(main, ["trace", "export", str(one)], catch_exceptions=False)
    assert result.exit_code == 0, result.output
    first = [orjson.loads(line)["correlation_id"] for line in result.stdout.splitlines()]
    assert first and first == list(range(len(first)))


async def test_a_killed_writers_torn_line_is_skipped_inside_a_compressed_file_too(tmp_path: Path) -> None:
    await write_rotated(tmp_path, "edge-1", 0, 5)
    (path,) = trace_files(tmp_path)
    path.write_bytes(path.read_bytes() + b'{"correlation_id":5,"api":"pro')
    compress(path)
    assert [e["correlation_id"] for e in iter_trace_events(tmp_path)] == [0, 1, 2, 3, 4]


@pytest.mark.parametrize("damage", ["cut short", "not gzip", "bad checksum", "bad line"])
async def test_a_damaged_compressed_file_is_an_error_naming_it(tmp_path: Path, damage: str) -> None:
    await write_rotated(tmp_path, "edge-1", 0, 5)
    (path,) = trace_files(tmp_path)
    if damage == "bad line":
        path.write_bytes(path.read_bytes().replace(b'"correlation_id":2', b'"correlation_id":', 1))
    packed = compress(path)
    data = packed.read_bytes()
    if damage == "cut short":
        packed.write_bytes(data[: len(data) // 2])
    elif damage == "not gzip":
        packed.write_bytes(b"this is not gzip\n")
    elif damage == "bad checksum":
        packed.write_bytes(data[:-8] + bytes([data[-8] ^ 0xFF]) + data[-7:])

    with pytest.raises(TraceFileError, match=packed.name) as raised:
        list(iter_trace_events(tmp_path))
    if damage == "bad line":
        assert f"{packed}:3:" in str(raised.value)
    result = CliRunner().invoke(main, ["trace", "export", str(tmp_path)])
    assert result.exit_code == 1
    assert packed.name in result.output
