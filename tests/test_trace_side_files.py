"""Version-3 traces through the analysis: records decoded by Spark from the side files.

At level `records` the proxy writes batch headers and raw batches (side
files) and decodes nothing; Spark decodes them on the executors. The demo's
torn transaction must be found and attributed from such a trace as from a
version-2 one, and a trace whose proxy was SIGKILLed mid-run must be read
by the analysis up to its last complete segment.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import pytest

from kproxy.demo import run_demo
from kproxy.obs.trace_files import iter_trace_events, trace_files
from kproxy.obs.trace_schema import SCHEMA_VERSION
from kproxy.obs.trace_segments import SegmentFile
from tests.fixtures.scenario_runs import key
from tests.test_trace_signals import FLUSHED_BEFORE_KILL_S, traced_producer

pytestmark = [pytest.mark.spark, pytest.mark.timeout(240)]

RULE_ID = "stale-commit-into-next-txn"


def _python_records(traces: Path) -> list[tuple]:
    return sorted(
        (e["api"], e["direction"], e["conn_id"], e["correlation_id"], p["topic"], p["partition"], i, r["offset"],
         r["key"], r["value"], r["control"])
        for e in iter_trace_events(traces) for p in e["partitions"] or () for i, r in enumerate(p["records"] or ())
    )


def _spark_records(spark, traces: Path) -> list[tuple]:
    from kproxy_spark.traces import load_traces, trace_records

    rows = trace_records(load_traces(spark, traces)).select(
        "api", "direction", "conn_id", "correlation_id", "topic", "partition", "record_index", "offset", "key",
        "value", "control",
    ).collect()
    return sorted(tuple(r) for r in rows)


@pytest.mark.timeout(900)  # the first reader runs every scenario (the session fixture)
def test_demo_finds_and_attributes_the_torn_transaction_from_side_files(scenario_runs, broker, spark, tmp_path) -> None:
    # The demo's own torn-transaction run (the scenario suite's, seed 1). The
    # stale copy races the next transaction, so a run may miss it: then
    # another seed, run here, does not.
    run = scenario_runs[key("torn-transaction")]
    report, out = run.report, run.out
    if not report["counts"]["torn-transaction"]:
        out = tmp_path / "seed-2"
        report = run_demo("torn-transaction", out, bootstrap=broker.bootstrap, duration=6, seed=2, spark=spark,
                          say=lambda line: None, progress=False).report
    assert report["counts"]["torn-transaction"] >= 1
    impact = {(i["rule"], i["anomaly"]): i["cases"] for i in report["stats"]["fault_impact"]}
    assert impact.get((RULE_ID, "torn-transaction"), 0) >= 1

    # The proxy decoded nothing: the events point at raw batches in side files.
    traces = out / "traces"
    assert [p.suffix for p in sorted(traces.iterdir()) if p.suffix == ".records"], "no side file written"
    on_disk = list(iter_trace_events(traces, records=False))
    assert {e["schema_version"] for e in on_disk} == {SCHEMA_VERSION}
    with_batches = [p for e in on_disk if e["api"] in ("produce", "fetch") for p in e["partitions"] or ()
                    if p["records_file"]]
    assert with_batches and all(p["records"] is None and p["batches"] for p in with_batches)
    assert any(b["marker"] for p in with_batches for b in p["batches"]), "no transaction marker scanned"
    # Spark's decode (executors, cramjam) gives what the Python reader gives.
    assert _spark_records(spark, traces) == _python_records(traces)


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
