"""Traces with side files through the analysis: records decoded by Spark from the side files.

At level `records` the proxy writes batch headers and raw batches (side
files) and decodes nothing; Spark decodes them on the executors, as the
Python reader does. A trace whose proxy was SIGKILLed mid-run must be read
by the analysis up to its last complete segment. (The demo's own torn
transaction from such a trace: tests/test_scenarios_e2e.py.)
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from kproxy.obs.trace_files import iter_trace_events, trace_files
from kproxy.obs.trace_segments import SegmentFile
from tests.test_trace_signals import FLUSHED_BEFORE_KILL_S, traced_producer

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

def _python_records(traces: Path) -> list[tuple]:
    return sorted(
        (e["api"], e["direction"], e["conn_id"], e["correlation_id"], p["topic"], p["partition"], i, r["offset"],
         r["key"], r["value"], r["control"])
        for e in iter_trace_events(traces) for p in e["partitions"] or () for i, r in enumerate(p.get("records") or ())
    )


def _spark_records(spark, traces: Path) -> list[tuple]:
    from kproxy_spark.traces import load_traces, trace_records

    rows = trace_records(load_traces(spark, traces)).select(
        "api", "direction", "conn_id", "correlation_id", "topic", "partition", "record_index", "offset", "key",
        "value", "control",
    ).collect()
    return sorted(tuple(r) for r in rows)


def test_analysis_reads_a_sigkilled_proxys_trace_up_to_its_last_segment(proxy_factory, broker, spark, tmp_path: Path,
                                                                      topic_name: str) -> None:
    proxy, producer, traces = traced_producer(proxy_factory, broker, tmp_path, topic_name)
    producer.wait_for_deliveries(100)
    time.sleep(FLUSHED_BEFORE_KILL_S + 0.2)
    killed_at = time.monotonic()
    assert proxy.stop(signal.SIGKILL) == -signal.SIGKILL
    producer.stop()
    (trace_file,) = trace_files(traces)
    assert trace_file.suffix == ".events"
    # Tear the last segment and leave half a batch behind the side file's end, as a kill mid-write does.
    data = trace_file.read_bytes()
    offset, length = SegmentFile(trace_file).segments[-1]
    trace_file.write_bytes(data + data[offset - 12 : offset + length // 2])
    side = trace_file.with_suffix(".records")
    side.write_bytes(side.read_bytes() + b"\x00\x00\x00\x00\x00\x00\x00\x09\x00\x00\x03")

    records = _spark_records(spark, traces)
    assert records == _python_records(traces)
    acknowledged = {r[7]: r[9] for r in records if r[0] == "produce" and r[1] == "response" and r[7] is not None}
    settled = [d for d in producer.delivered if d.seen_at < killed_at - FLUSHED_BEFORE_KILL_S]
    assert len(settled) >= 100
    assert [d for d in settled if acknowledged.get(d.offset) != d.value] == []

    # A damaged complete segment fails the analysis, naming the file and offset: never read as valid.
    damaged = bytearray(trace_file.read_bytes())
    damaged[offset + 5] ^= 0x55
    trace_file.write_bytes(bytes(damaged))
    with pytest.raises(Exception, match=f"{trace_file.name}:{offset - 12}: segment checksum mismatch"):
        _spark_records(spark, traces)
