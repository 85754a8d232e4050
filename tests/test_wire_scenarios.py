"""Literal histories and trace events for the wire checks, and the trace loading tests.

Each scenario writes a history (JSON Lines) and a trace directory (JSON
Lines matching kproxy.obs.trace_schema) into a temporary directory. The
builders are imported by the other wire, report and CLI tests.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kproxy.obs.trace_schema import FIELD_NAMES, SCHEMA_VERSION

pytestmark = pytest.mark.spark

TID = "tx-0"
PID = 1000


@dataclass
class Scenario:
    """A history and its traces under construction."""

    ops: list[dict] = field(default_factory=list)
    events: list[dict] = field(default_factory=list)
    _mono: int = 1_000_000

    def op(self, process: int, type_: str, f: str, value, error: str | None = None, time: int | None = None) -> None:
        op = {"index": len(self.ops), "time": time if time is not None else len(self.ops) * 1_000_000,
              "process": process, "type": type_, "f": f, "value": value}
        if error is not None:
            op["error"] = error
        self.ops.append(op)

    def event(self, **fields) -> dict:
        unknown = set(fields) - set(FIELD_NAMES)
        assert not unknown, f"not in the trace schema: {unknown}"
        self._mono += 1_000_000
        base = {"schema_version": SCHEMA_VERSION, "wall_time": 1.7e9 + self._mono / 1e9, "mono_ns": self._mono,
                "proxy_id": "proxy-a", "client_addr": "127.0.0.1:5000", "broker_id": 1, "copy": 0,
                "outcome": "delivered", "size": 100}
        base.update(fields)
        self.events.append(base)
        return base

    def exchange(self, api: str, conn: int, corr: int, request: dict, response: dict, latency_ms: float = 2.0) -> None:
        self.event(direction="request", api=api, conn_id=conn, correlation_id=corr, **request)
        copy = request.get("copy", 0)
        self.event(direction="response", api=api, conn_id=conn, correlation_id=corr, copy=copy,
                   latency_ms=latency_ms, upstream_latency_ms=latency_ms / 2, **response)

    def produce(self, conn: int, corr: int, values: list[int], key: int = 7, base_offset: int | None = 0,
                error: int = 0, txn: tuple[int, int] | None = None, topic: str = "t", **request) -> None:
        txn_fields = {}
        if txn is not None:
            txn_fields = {"transactional_id": TID, "producer_id": PID, "producer_epoch": 0,
                          "txn_client": txn[0], "txn_broker": txn[1]}
        records = [{"offset": None, "key": str(key), "value": str(v), "producer_id": PID if txn else 2000,
                    "producer_epoch": 0, "sequence": i, "transactional": txn is not None}
                   for i, v in enumerate(values)]
        self.exchange(
            "produce", conn, corr,
            {**txn_fields, **request, "partitions": [{"topic": topic, "partition": 0, "records": records}]},
            {"error_code": error, "error_codes": [error] if error else [],
             "partitions": [{"topic": topic, "partition": 0, "error_code": error,
                             "base_offset": base_offset if not error else -1, "records": []}]},
        )

    def end_txn(self, conn: int, corr: int, commit: bool, txn: tuple[int, int], error: int = 0, **request) -> None:
        self.exchange(
            "end_txn", conn, corr,
            {"transactional_id": TID, "producer_id": PID, "producer_epoch": 0, "txn_client": txn[0],
             "txn_broker": txn[1], "end_txn_commit": commit, **request},
            {"error_code": error, "error_codes": [error] if error else []},
        )

    def fetch(self, conn: int, corr: int, records: list[tuple], aborted: list[tuple] | None = None,
              key: int = 7, topic: str = "t", transactional: bool = True) -> None:
        """records: (offset, value) for data, (offset, 'commit'|'abort') for markers; producer PID
        (transactional) or 2000 (an idempotent producer)."""
        producer = PID if transactional else 2000
        rows = []
        for offset, value in records:
            if value in ("commit", "abort"):
                rows.append({"offset": offset, "key": None, "value": None, "control": value,
                             "producer_id": PID, "transactional": True})
            else:
                rows.append({"offset": offset, "key": str(key), "value": str(value), "control": None,
                             "producer_id": producer, "transactional": transactional})
        part = {"topic": topic, "partition": 0, "error_code": 0, "high_watermark": 100, "last_stable_offset": 100,
                "aborted_transactions": None if aborted is None else
                [{"producer_id": p, "first_offset": o} for p, o in aborted],
                "records": rows}
        self.exchange("fetch", conn, corr, {}, {"error_code": 0, "partitions": [part]})

    def write(self, directory: Path) -> tuple[Path, Path]:
        history = directory / "history.jsonl"
        history.write_text("".join(json.dumps(op) + "\n" for op in self.ops))
        traces = directory / "traces"
        traces.mkdir(exist_ok=True)
        (traces / "trace-0.jsonl").write_text("".join(json.dumps(e) + "\n" for e in self.events))
        return history, traces


def torn_scenario(stale: bool = True, aborted_read: bool = True, listed: bool = False) -> Scenario:
    """One client transaction (values 1, 2, 3 on key 7) that the client saw
    fail. Value 1 sits in broker-side txn 1, which the client's EndTxn
    aborted; a delayed Produce put 2 and 3 into broker-side txn 2, and a
    duplicated EndTxn(commit, client 1, broker 2) of rule `torn` committed
    them. Then a clean transaction writes value 4. A read_committed Fetch
    returns everything, the aborted value 1 included, with an empty
    aborted-transactions list (as Tansu does).

    stale=False: broker-side txn 2 is aborted by a timely EndTxn instead.
    aborted_read=False: the Fetch skips the aborted records.
    listed=True: the list names the aborted transactions, as Kafka's does."""
    s = Scenario()
    s.op(0, "ok", "create", [7, "t", 0])
    s.op(0, "invoke", "txn", [["send", 7, 1], ["send", 7, 2], ["send", 7, 3]])
    s.produce(1, 1, [1], base_offset=0, txn=(1, 1))
    s.end_txn(1, 3, commit=False, txn=(1, 1))
    s.produce(1, 2, [2, 3], base_offset=2, txn=(1, 2), hazard="late_produce", rule="torn", action="delay",
              outcome="delayed")
    if stale:
        s.end_txn(1, 3, commit=True, txn=(1, 2), hazard="stale_end_txn", rule="torn", action="duplicate",
                  outcome="duplicated", copy=1)
    else:
        s.end_txn(1, 4, commit=False, txn=(1, 2))
    s.op(0, "fail", "txn", [["send", 7, [0, 1]], ["send", 7, [2, 2]], ["send", 7, [3, 3]]], error="aborted")
    s.op(0, "invoke", "txn", [["send", 7, 4]])
    s.produce(1, 5, [4], base_offset=5, txn=(2, 3))
    s.end_txn(1, 6, commit=True, txn=(2, 3))
    s.op(0, "ok", "txn", [["send", 7, [5, 4]]])
    s.op(1, "invoke", "poll", [["poll"]])
    fetched = [(0, 1), (1, "abort"), (2, 2), (3, 3), (4, "commit" if stale else "abort"), (5, 4), (6, "commit")]
    if not aborted_read:
        aborted_offsets = {0} if stale else {0, 2, 3}
        fetched = [r for r in fetched if r[0] not in aborted_offsets]
    s.fetch(2, 1, fetched, aborted=([(PID, 0)] + ([] if stale else [(PID, 2)])) if listed else [])
    polled = [[o, v] for o, v in fetched if isinstance(v, int)]
    s.op(1, "ok", "poll", [["poll", {"7": polled}]])
    return s


def error_scenario(retried: bool = False, client_type: str = "ok") -> Scenario:
    """Non-transactional sends answered with errors.

    Key 8, value 1: the client reports offset 0, but the only Produce was
    answered by rule `err` with REQUEST_TIMED_OUT (spurious offset), unless
    `retried` adds a successful retry. Key 9, value 5: the broker wrote it
    but the response was rewritten to an error by rule `err`; a Fetch later
    reads it (ambiguous error); the client saw `client_type`."""
    s = Scenario()
    s.op(0, "ok", "create", [8, "t", 0])
    s.op(0, "ok", "create", [9, "u", 0])
    s.op(0, "invoke", "send", [["send", 8, 1]])
    s.produce(1, 1, [1], key=8, error=7, rule="err", action="error", outcome="answered")
    if retried:
        s.produce(1, 2, [1], key=8, base_offset=0)
    s.op(0, "ok", "send", [["send", 8, [0, 1]]])
    s.op(0, "invoke", "send", [["send", 9, 5]])
    s.produce(1, 3, [5], key=9, topic="u", error=7, rule="err", action="error", outcome="rewritten")
    s.op(0, client_type, "send", [["send", 9, 5]], error="REQUEST_TIMED_OUT" if client_type != "ok" else None)
    s.fetch(2, 1, [(0, 5)], key=9, topic="u", transactional=False)
    return s


def test_load_traces_reads_jsonl_with_the_explicit_schema(spark, tmp_path):
    from kproxy_spark.traces import load_traces, trace_records

    _, traces_dir = torn_scenario().write(tmp_path)
    # A rotated second file and a torn last line from a killed writer.
    (traces_dir / "trace-1.jsonl").write_text(json.dumps(torn_scenario().events[0]) + "\n{\"direction\": \"req")
    traces = load_traces(spark, traces_dir)
    assert set(traces.columns) == set(FIELD_NAMES)
    assert traces.count() == len(torn_scenario().events) + 1

    records = trace_records(traces)
    produced = records.where("api = 'produce' AND direction = 'request'").select("key", "value", "record_index").collect()
    assert sorted((r.key, r.value) for r in produced) == [("7", "1"), ("7", "1"), ("7", "2"), ("7", "3"), ("7", "4")]
    markers = records.where("control IS NOT NULL").select("offset", "control").collect()
    assert sorted((r.offset, r.control) for r in markers) == [(1, "abort"), (4, "commit"), (6, "commit")]


def test_load_traces_reads_parquet_too(spark, tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    from kproxy.obs.trace_schema import arrow_schema
    from kproxy_spark.traces import load_traces

    scenario = torn_scenario()
    _, traces_dir = scenario.write(tmp_path)
    (traces_dir / "trace-0.jsonl").unlink()
    rows = [{name: e.get(name) for name in FIELD_NAMES} for e in scenario.events]
    pq.write_table(pa.Table.from_pylist(rows, schema=arrow_schema()), traces_dir / "trace-0.parquet")
    traces = load_traces(spark, traces_dir)
    assert traces.where("api = 'end_txn' AND direction = 'request'").count() == 3


def test_landings_get_their_fate_from_the_applied_end_txn_agreeing_with_markers(spark, tmp_path):
    from kproxy_spark.traces import load_traces
    from kproxy_spark.wire.landings import landings

    _, traces_dir = torn_scenario().write(tmp_path)
    traces = load_traces(spark, traces_dir)
    landed = landings(traces)
    log = landed.collect()
    # Traced records are decided by the EndTxn delivered after them ...
    fates = {(r.offset, r.value): (r.fate, r.fate_source) for r in log}
    assert fates == {
        (0, "1"): ("aborted", "end_txn"),
        (2, "2"): ("committed", "end_txn"),
        (3, "3"): ("committed", "end_txn"),
        (5, "4"): ("committed", "end_txn"),
    }
    # ... and on this log the markers say the same.
    markers = {r.offset: r.marker_fate for r in log}
    assert markers == {0: "aborted", 2: "committed", 3: "committed", 5: "committed"}
    # The record's broker-side transaction points at the EndTxn that ended it.
    by_offset = {r.offset: r for r in log}
    assert (by_offset[2].end_txn_client, by_offset[2].end_txn_broker, by_offset[2].end_rule) == (1, 2, "torn")


def test_without_end_txns_the_markers_decide_the_fate(spark, tmp_path):
    from kproxy_spark.traces import load_traces
    from kproxy_spark.wire.landings import landings

    scenario = torn_scenario()
    scenario.events = [e for e in scenario.events if e["api"] != "end_txn"]
    _, traces_dir = scenario.write(tmp_path)
    log = landings(load_traces(spark, traces_dir)).collect()
    assert {r.value: (r.fate, r.fate_source) for r in log} == {
        "1": ("aborted", "marker"), "2": ("committed", "marker"), "3": ("committed", "marker"),
        "4": ("committed", "marker")}
    assert {r.end_delivery_ns for r in log} == {None}


def test_without_fetches_the_end_txn_decides_the_fate(spark, tmp_path):
    from kproxy_spark.traces import load_traces
    from kproxy_spark.wire.landings import landings

    scenario = torn_scenario()
    scenario.events = [e for e in scenario.events if e["api"] != "fetch"]
    _, traces_dir = scenario.write(tmp_path)
    fates = {r.value: (r.fate, r.fate_source) for r in landings(load_traces(spark, traces_dir)).collect()}
    assert fates == {"1": ("aborted", "end_txn"), "2": ("committed", "end_txn"),
                     "3": ("committed", "end_txn"), "4": ("committed", "end_txn")}
