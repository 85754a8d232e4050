"""The analysis reads its history and traces from any Hadoop file system, not only local paths.

viewfs:// is Hadoop's mount-table file system, in the Hadoop client jars
PySpark ships: a mount table set on the session's Hadoop configuration
maps viewfs://TABLE/runs onto a temporary directory (the `mounted` fixture,
tests/fixtures/viewfs.py), so the same files are read once as local paths
and once through Hadoop (listing, sizes, version checks and the executors'
binaryFile reads). That a whole recorded run gives the same report both
ways is in tests/test_recorded_runs.py, beside the local report it compares with.
"""

from __future__ import annotations

import gzip
import shutil
from pathlib import Path

import orjson
import pytest

pytestmark = pytest.mark.spark

RECORDED = Path(__file__).parent / "data" / "recorded" / "tansu-torn-transaction"


def _side_file_traces(directory: Path) -> int:
    """The recorded run's first Produce requests as version-3 traces whose records are raw batches in side
    files: one segment file and one JSON Lines file, each with its own `.records`. Returns the records."""
    from kproxy.obs.trace_files import iter_jsonl_events
    from kproxy.obs.trace_schema import SCHEMA_VERSION
    from kproxy.obs.trace_segments import COLUMNS, encode_segment, file_header
    from kproxy.protocol.records import Record, encode_batch, make_batch

    produced = [e for e in iter_jsonl_events(RECORDED / "traces" / "trace.jsonl.gz")
                if e.get("api") == "produce" and e["direction"] == "request" and e.get("partitions")][:40]
    directory.mkdir()
    records = 0
    for stem, events in (("trace-side-20260101T000000-000000", produced[:20]),
                         ("trace-side-20260101T000000-000001", produced[20:])):
        side = bytearray()
        for event in events:
            event["schema_version"] = SCHEMA_VERSION
            for part in event["partitions"]:
                inline = part.pop("records") or []
                batch = encode_batch(make_batch(
                    [Record(offset=i, timestamp=0, key=str(r["key"]).encode(), value=str(r["value"]).encode())
                     for i, r in enumerate(inline)]))
                part.update(records=None, records_file=f"{stem}.records", records_offset=len(side),
                            records_length=len(batch))
                side += batch
                records += len(inline)
        (directory / f"{stem}.records").write_bytes(bytes(side))
        if stem.endswith("0"):
            rows = [[event.get(name) for name, _ in COLUMNS] for event in events]
            (directory / f"{stem}.events").write_bytes(file_header() + encode_segment(rows))
        else:
            (directory / f"{stem}.jsonl").write_bytes(b"".join(orjson.dumps(e) + b"\n" for e in events))
    return records


def test_side_files_are_read_beside_their_trace_files_through_viewfs(spark, mounted) -> None:
    from kproxy_spark.traces import load_traces, trace_records

    local, uri = mounted
    records = _side_file_traces(local / "traces")
    assert records > 0

    def read(directory: str) -> list[tuple]:
        rows = trace_records(load_traces(spark, directory, lean=True)).select(
            "conn_id", "correlation_id", "topic", "partition", "record_index", "key", "value").collect()
        return sorted(map(tuple, rows))

    here = read(str(local / "traces"))
    assert len(here) == records and all(row[-2] is not None for row in here)
    assert read(f"{uri}/traces") == here


def test_a_missing_input_on_viewfs_is_named(spark, mounted, tmp_path: Path) -> None:
    from kproxy_spark.jobs import InputError, analyze

    local, uri = mounted
    shutil.copytree(RECORDED, local / "run")
    with pytest.raises(InputError, match=f"trace directory not found: {uri}/run/nothing-here$"):
        analyze(str(local / "run" / "history.jsonl"), f"{uri}/run/nothing-here", str(tmp_path / "out"), spark=spark)
    with pytest.raises(InputError, match=f"history not found: {uri}/run/nothing.jsonl$"):
        analyze(f"{uri}/run/nothing.jsonl", f"{uri}/run/traces", str(tmp_path / "out"), spark=spark)
    # A file where a directory belongs is not a trace directory either.
    with pytest.raises(InputError, match="trace directory not found"):
        analyze(None, f"{uri}/run/history.jsonl", str(tmp_path / "out"), spark=spark)


def test_a_trace_of_a_newer_schema_on_viewfs_is_refused_before_any_spark_job(spark, mounted, tmp_path: Path) -> None:
    from kproxy_spark.jobs import InputError, analyze

    from kproxy.obs.trace_segments import file_header

    local, uri = mounted
    (local / "jsonl").mkdir()
    (local / "jsonl" / "trace-new-20260101T000000-000000.jsonl.gz").write_bytes(
        gzip.compress(orjson.dumps({"schema_version": 99, "direction": "request"}) + b"\n"))
    (local / "segments").mkdir()
    (local / "segments" / "trace-new-20260101T000000-000000.events").write_bytes(file_header(schema_version=99))
    history = str(RECORDED / "history.jsonl")
    for folder, where in (("jsonl", "trace-new-20260101T000000-000000.jsonl.gz:1"),
                          ("segments", "trace-new-20260101T000000-000000.events:")):
        with pytest.raises(InputError, match=f"^{uri}/{folder}/{where}.*schema version 99"):
            analyze(history, f"{uri}/{folder}", str(tmp_path / "out"), spark=spark)
