"""The proxy's trace and the workload's history agree, send for send and poll for poll.

A real workload (confluent-kafka, several logical processes) runs through a
real `kproxy run --traces DIR` in front of the real broker. After the proxy is
stopped with SIGTERM, the two accounts are set side by side:

- every send the history says was acknowledged at an offset is in a traced
  Produce response with the same topic, partition, offset, key and value, and
  no error on that partition;
- every record a poll returned is in a traced Fetch response with the same
  topic, partition, offset, key and value;
- requests and responses pair up by (conn_id, correlation_id).

A key's topic and partition come from the history's `create` ops; keys and
values are integers in the history and their decimal text on the wire.
"""

from __future__ import annotations

import re
import signal
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path

import pytest

from kproxy.obs.accounting import account
from kproxy.obs.trace_files import iter_trace_events
from kproxy.obs.trace_schema import FIELD_NAMES, SCHEMA_VERSION
from kproxy.proxy_process import ProxyProcess
from kproxy.workload.config import WorkloadConfig
from kproxy.workload.history import Op, read_history
from kproxy.workload.runner import run_workload

pytestmark = pytest.mark.timeout(90)

WRITTEN_LOG_LINE = re.compile(r"trace: (\d+) events written")

# (topic, partition, offset, key text, value text): one record as the wire carried it.
WireRecord = tuple[str, int, int, str | None, str | None]


@dataclass(frozen=True)
class TracedRun:
    ops: list[Op]
    events: list[dict]
    proxy_log: str


def traced_workload(proxy_factory: Callable[..., ProxyProcess], tmp_path: Path, level: str,
                    **workload: object) -> TracedRun:
    """Run the workload through a tracing proxy, stop the proxy with SIGTERM, read both accounts."""
    traces = tmp_path / f"traces-{level}"
    proxy = proxy_factory("--traces", str(traces), "--trace-level", level)
    settings: dict[str, object] = dict(concurrency=3, duration=4.0, seed=11, key_count=3,
                                       max_writes_per_key=16, final_reads_timeout=8.0)
    settings.update(workload)
    history = tmp_path / f"history-{level}.jsonl"
    run_workload(WorkloadConfig(bootstrap=proxy.bootstrap, **settings), history, progress=False)
    assert proxy.stop(signal.SIGTERM) == 0, proxy.log_text()[-2000:]
    return TracedRun(list(read_history(history)), list(iter_trace_events(traces)), proxy.log_text())


def key_locations(ops: Iterable[Op]) -> dict[int, tuple[str, int]]:
    return {op.value[0]: (op.value[1], op.value[2]) for op in ops if op.f == "create"}


def acknowledged_sends(ops: Iterable[Op], types: tuple[str, ...] = ("ok",)) -> list[tuple[int, int, int]]:
    """(key, offset, value) of every send micro-op with an offset in completions of the given types."""
    return [(mop[1], mop[2][0], mop[2][1])
            for op in ops if op.type in types and op.f in ("send", "txn")
            for mop in op.value if mop[0] == "send" and isinstance(mop[2], list)]


def polled_records(ops: Iterable[Op]) -> list[tuple[int, int, int]]:
    """(key, offset, value) of every record an `ok` poll returned, final reads included."""
    return [(int(key), offset, value)
            for op in ops if op.type == "ok" and op.f in ("poll", "txn")
            for mop in op.value if mop[0] == "poll" and len(mop) == 2
            for key, records in mop[1].items()
            for offset, value in records]


def wire_records(events: Iterable[dict], api: str, direction: str = "response") -> set[WireRecord]:
    """Data records (not markers) of one API's traced events; Produce only from partitions without error."""
    found: set[WireRecord] = set()
    for event in events:
        if event["api"] != api or event["direction"] != direction:
            continue
        for part in event.get("partitions") or ():
            if api == "produce" and direction == "response" and part["error_code"] != 0:
                continue
            for record in part["records"] or ():
                if record["control"] is None:
                    found.add((part["topic"], part["partition"], record["offset"], record["key"], record["value"]))
    return found


def missing_from_wire(history_records: list[tuple[int, int, int]], where: dict[int, tuple[str, int]],
                      wire: set[WireRecord]) -> list[tuple[int, int, int]]:
    return [(key, offset, value) for key, offset, value in history_records
            if (*where[key], offset, str(key), str(value)) not in wire]


def check_request_response_pairing(events: list[dict]) -> None:
    """Each response answers one traced request; unanswered requests only end a connection.

    A client that hangs up (a consumer closed during a long-poll Fetch, a
    crash op) leaves its last requests unanswered. Since a connection's
    responses go back in request order, the unanswered requests of a
    connection must be the tail of its requests: an unanswered request
    followed by an answered one would be a lost response.
    """
    requests: dict[int, list[int]] = defaultdict(list)
    responses = Counter((e["conn_id"], e["correlation_id"]) for e in events if e["direction"] == "response")
    for event in events:
        if event["direction"] == "request":
            requests[event["conn_id"]].append(event["correlation_id"])
    assert [k for k, n in responses.items() if n > 1] == [], "a request was answered twice"
    request_keys = {(conn, corr) for conn, corrs in requests.items() for corr in corrs}
    assert set(responses) <= request_keys, f"responses without request: {sorted(set(responses) - request_keys)[:5]}"
    for conn, corrs in requests.items():
        answered = [(conn, corr) in responses for corr in corrs]
        if False in answered:
            first_gap = answered.index(False)
            assert not any(answered[first_gap:]), (
                f"connection {conn}: request {corrs[first_gap]} unanswered but later ones answered")


def check_every_request_has_an_outcome(events: list[dict]) -> None:
    """A request without response was left in flight by a connection's close, which names it."""
    accounted = account(events)
    assert accounted.without_outcome == [], accounted.without_outcome[:5]
    assert accounted.answered > 0


def check_writer_count(run: TracedRun) -> None:
    written = [int(n) for n in WRITTEN_LOG_LINE.findall(run.proxy_log)]
    assert written == [len(run.events)], f"log says {written}, read {len(run.events)} events"


def test_non_transactional_history_agrees_with_records_trace(proxy_factory, tmp_path: Path) -> None:
    run = traced_workload(proxy_factory, tmp_path, "records")
    where = key_locations(run.ops)
    acked = acknowledged_sends(run.ops)
    polled = polled_records(run.ops)
    assert len(acked) >= 20 and len(polled) >= 20, "the workload did too little to compare"
    assert missing_from_wire(acked, where, wire_records(run.events, "produce")) == []
    assert missing_from_wire(polled, where, wire_records(run.events, "fetch")) == []
    # The request side carries the same records, with offsets not yet assigned.
    requested = {(t, p, k, v) for t, p, o, k, v in wire_records(run.events, "produce", "request")}
    assert all(o is None for _, _, o, _, _ in wire_records(run.events, "produce", "request"))
    assert [s for s in acked if (*where[s[0]], str(s[0]), str(s[2])) not in requested] == []
    check_request_response_pairing(run.events)
    check_writer_count(run)


def test_transactional_history_with_aborts_agrees_with_records_trace(proxy_factory, tmp_path: Path) -> None:
    prefix = f"agree-{uuid.uuid4().hex[:8]}"
    run = traced_workload(proxy_factory, tmp_path, "records", txn=True, abort_probability=0.3, seed=5,
                          topic_prefix=prefix)
    where = key_locations(run.ops)
    txns = [op for op in run.ops if op.f == "txn" and op.type != "invoke"]
    assert any(op.type == "ok" for op in txns) and any(op.error == "aborted" for op in txns)
    produced = wire_records(run.events, "produce")
    committed = acknowledged_sends(run.ops)
    assert committed and missing_from_wire(committed, where, produced) == []
    # An aborted transaction's sends were acknowledged too: the broker holds them until the marker.
    aborted = acknowledged_sends([op for op in txns if op.error == "aborted"], types=("fail",))
    assert aborted and missing_from_wire(aborted, where, produced) == []
    polled = polled_records(run.ops)
    assert polled and missing_from_wire(polled, where, wire_records(run.events, "fetch")) == []

    end_txns = [e for e in run.events if e["api"] == "end_txn" and e["direction"] == "request"]
    assert {e["end_txn_commit"] for e in end_txns} == {True, False}
    markers = {r["control"] for e in run.events if e["api"] == "fetch" and e["direction"] == "response"
               for p in e["partitions"] or () for r in p["records"] or ()}
    assert {"commit", "abort"} <= markers, "the Fetch responses carried no transaction markers"
    txn_produce = [e for e in run.events if e["api"] == "produce" and e["direction"] == "request"]
    assert txn_produce and all((e["transactional_id"] or "").startswith(f"{prefix}-txn-") for e in txn_produce)
    assert all(e["txn_client"] is not None and e["producer_id"] is not None for e in txn_produce)
    check_request_response_pairing(run.events)
    check_writer_count(run)
    check_every_request_has_an_outcome(run.events)


def test_headers_level_traces_every_exchange_without_records(proxy_factory, tmp_path: Path) -> None:
    run = traced_workload(proxy_factory, tmp_path, "headers", concurrency=2, duration=None, ops=20,
                          crash_probability=0.0, final_reads_timeout=5.0)
    assert run.events
    for event in run.events:
        assert set(event) <= set(FIELD_NAMES)
        assert event["schema_version"] == SCHEMA_VERSION
        assert event.get("partitions") is None, "headers level must not carry records"
        assert event["direction"] in ("request", "response", "close")
        if event["direction"] == "close":
            continue
        assert event["proxy_id"] and event["conn_id"] >= 0 and event["client_addr"]
        assert event["api"] and event["api_version"] >= 0 and event["size"] > 0
        assert event["outcome"] == "delivered" and event["rule"] is None
        if event["direction"] == "response":
            assert event["latency_ms"] >= 0 and event["upstream_latency_ms"] >= 0
            assert event["error_code"] == (event["error_codes"][0] if event["error_codes"] else 0)
    counts = Counter((e["api"], e["direction"]) for e in run.events)
    # acks=all: every Produce is answered, and every acknowledged send op needed one.
    assert counts["produce", "request"] == counts["produce", "response"]
    ok_sends = sum(1 for op in run.ops if op.f == "send" and op.type == "ok")
    produced_ok = sum(1 for e in run.events if e["api"] == "produce" and e["direction"] == "response"
                      and e["error_code"] == 0)
    assert ok_sends >= 5 and produced_ok >= ok_sends
    assert counts["fetch", "response"] > 0 and counts["metadata", "response"] > 0
    check_request_response_pairing(run.events)
    check_writer_count(run)
    check_every_request_has_an_outcome(run.events)
