"""The synthetic history generator writes valid, clean histories whose traces
agree with them, so the scale measurements run the analysis on input it must
call valid."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import orjson
import pytest

from kproxy.obs.trace_files import iter_trace_events
from kproxy.obs.trace_schema import EVENT, FIELD_NAMES, PARTITION, RECORD
from kproxy.workload.history import validate_history

SCRIPT = Path(__file__).resolve().parents[1] / "scripts" / "synthetic-history.py"
OPS = 2000


def generate(out: Path, ops: int, traces: Path | None = None, seed: int = 0, trace_format: str | None = None) -> None:
    args = [sys.executable, str(SCRIPT), "--ops", str(ops), "--out", str(out), "--seed", str(seed)]
    if traces is not None:
        args += ["--traces", str(traces)]
    if trace_format is not None:
        args += ["--trace-format", trace_format]
    subprocess.run(args, check=True, capture_output=True, timeout=60)


@pytest.fixture(scope="module")
def synthetic(tmp_path_factory):
    base = tmp_path_factory.mktemp("synthetic")
    history, traces = base / "history.jsonl", base / "traces"
    generate(history, OPS, traces, seed=7)
    return history, traces


def read_lines(path: Path) -> list[dict]:
    return [orjson.loads(line) for line in path.read_bytes().splitlines()]


def trace_events(traces: Path) -> list[dict]:
    """The trace's events, each partition's records decoded from the side files, as any reader sees them."""
    return list(iter_trace_events(traces))


def test_history_validates_with_the_requested_number_of_completed_worker_ops(synthetic):
    history, _ = synthetic
    stats = validate_history(history)
    ops = read_lines(history)
    final_reader = max(op["process"] for op in ops)
    worker_completions = [
        op for op in ops if op["type"] != "invoke" and op["f"] != "create" and op["process"] != final_reader
    ]
    assert len(worker_completions) == OPS
    assert stats.ops == len(ops)
    kinds = {(op["f"], op["type"]) for op in ops}
    # The shape the brief asks for: sends, polls, committed and aborted
    # transactions, info operations, key creation and final reads.
    for expected in [("send", "ok"), ("poll", "ok"), ("txn", "ok"), ("txn", "fail"), ("send", "info"),
                     ("create", "ok"), ("assign", "ok")]:
        assert expected in kinds


def test_every_trace_event_carries_every_schema_field(synthetic):
    _, traces = synthetic
    events = trace_events(traces)
    assert events
    names = {f.name for f in EVENT}
    for event in events:
        assert set(event) == names
        for part in event["partitions"] or ():
            assert set(part) == {f.name for f in PARTITION}
            for rec in part["records"]:
                assert set(rec) == {f.name for f in RECORD}
    assert tuple(events[0]) == FIELD_NAMES


def test_acknowledged_sends_sit_at_their_offsets_in_produce_responses(synthetic):
    history, traces = synthetic
    topic_of = {}
    acked = set()
    for op in read_lines(history):
        if op["f"] == "create":
            key, topic, partition = op["value"]
            topic_of[key] = (topic, partition)
        elif op["f"] in ("send", "txn") and op["type"] == "ok":
            for mop in op["value"]:
                if mop[0] == "send":
                    offset, value = mop[2]
                    acked.add((*topic_of[mop[1]], offset, str(mop[1]), str(value)))
    on_wire = set()
    for event in trace_events(traces):
        if event["api"] == "produce" and event["direction"] == "response":
            for part in event["partitions"]:
                if part["error_code"] == 0:
                    for rec in part["records"]:
                        on_wire.add((part["topic"], part["partition"], rec["offset"], rec["key"], rec["value"]))
    assert acked
    assert acked <= on_wire


def test_polls_return_only_committed_records_and_final_reads_see_every_acknowledged_write(synthetic):
    history, _ = synthetic
    ops = read_lines(history)
    aborted, acked, read_ok = set(), set(), set()
    for op in ops:
        if op["f"] not in ("send", "txn", "poll") or op["type"] == "invoke":
            continue
        for mop in op["value"]:
            if mop[0] == "send" and isinstance(mop[2], list):
                (acked if op["type"] == "ok" else aborted).add((mop[1], mop[2][1]))
            elif mop[0] == "poll" and op["type"] == "ok":
                read_ok.update((int(k), v) for k, recs in mop[1].items() for _, v in recs)
    assert aborted and not (aborted & read_ok)
    assert acked <= read_ok


def test_the_same_seed_writes_the_same_history(tmp_path):
    generate(tmp_path / "a.jsonl", 300, seed=3)
    generate(tmp_path / "b.jsonl", 300, seed=3)
    generate(tmp_path / "c.jsonl", 300, seed=4)
    a = (tmp_path / "a.jsonl").read_bytes()
    assert a == (tmp_path / "b.jsonl").read_bytes()
    assert a != (tmp_path / "c.jsonl").read_bytes()


def test_the_generator_reports_progress_and_writes_what_the_script_writes(tmp_path):
    from kproxy.workload.synthetic import PROGRESS_EVERY
    from kproxy.workload.synthetic import generate as synthesize

    ops = 2 * PROGRESS_EVERY + 123
    steps: list[int] = []
    counts = synthesize(ops, tmp_path / "api.jsonl", seed=3, progress=steps.append)
    assert sum(steps) == counts["completed"] == ops
    assert steps[:2] == [PROGRESS_EVERY, PROGRESS_EVERY]
    generate(tmp_path / "script.jsonl", ops, seed=3)
    script_lines = (tmp_path / "script.jsonl").read_bytes()
    assert (tmp_path / "api.jsonl").read_bytes() == script_lines
    assert counts["history_lines"] == len(script_lines.splitlines())


def test_analysis_of_a_clean_synthetic_history_and_its_traces_is_valid(synthetic, spark, tmp_path):
    from kproxy_spark.jobs import analyze

    history, traces = synthetic
    report = analyze(history, traces, tmp_path / "report", spark=spark)
    found = {name: n for name, n in report["counts"].items() if n and name != "abort-position"}
    assert report["valid"] is True, found
    assert found == {}
    stats = report["stats"]
    assert stats["final_reads"] is True
    assert stats["trace_events"] == len(trace_events(traces))
    # The wire side really joined: EndTxns were read and the clock offset was
    # estimated from sends matched to Produce responses.
    assert stats["end_txn_outcomes"]
    assert stats["trace_clock_offset_ns"] is not None
    # Every aborted transaction's consumer seeks back: never advance or rewind further.
    positions = {case["position"] for case in report["anomalies"].get("abort-position", [])}
    assert positions <= {"rewind"}


def test_the_trace_is_the_proxys_format_and_holds_what_the_json_lines_trace_holds(synthetic, tmp_path):
    """By default the trace is segment files with the records' batches in side files, as a proxy writes it;
    read back, every event is the one `--trace-format jsonl` writes, but for where the batches are kept
    (and a marker's key and value, which the proxy writes as the text of their bytes)."""
    history, traces = synthetic
    assert sorted(p.suffix for p in traces.iterdir()) == [".events", ".records"]
    generate(tmp_path / "history.jsonl", OPS, tmp_path / "jsonl", seed=7, trace_format="jsonl")
    assert (tmp_path / "history.jsonl").read_bytes() == history.read_bytes()
    side = {"records_file", "records_offset", "records_length", "batches", "compression"}

    def comparable(event: dict) -> dict:
        parts = []
        for part in event["partitions"] or ():
            records = [{k: v for k, v in r.items() if not (r["control"] and k in ("key", "value"))}
                       for r in part["records"] or ()]
            parts.append({**{k: v for k, v in part.items() if k not in side}, "records": records})
        return {**event, "partitions": parts}

    segments, lines = trace_events(traces), trace_events(tmp_path / "jsonl")
    assert len(segments) == len(lines)
    assert [comparable(e) for e in segments] == [comparable(e) for e in lines]
    # Data records are whole batches of the side file, markers in control batches of their own.
    batched = [p for e in segments for p in e["partitions"] or () if p["records_file"]]
    assert batched and all(p["batches"] and p["records_length"] > 0 for p in batched)
    assert any(b["control"] for p in batched for b in p["batches"])
    # A Produce response points at its request's batches, as the proxy's does.
    region = ("records_file", "records_offset", "records_length")
    sent = {(e["conn_id"], e["correlation_id"], p["topic"], p["partition"]): tuple(p[k] for k in region)
            for e in segments if e["api"] == "produce" and e["direction"] == "request" for p in e["partitions"]}
    answered = [(sent[(e["conn_id"], e["correlation_id"], p["topic"], p["partition"])], tuple(p[k] for k in region))
                for e in segments if e["api"] == "produce" and e["direction"] == "response" for p in e["partitions"]]
    assert answered and all(request == response for request, response in answered)
