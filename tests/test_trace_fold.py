"""Folding an idle consumer's identical empty Fetch exchanges (kproxy/obs/trace_fold.py), on literal rows,
and through the trace writer: what is folded, what never is, and what the fold says."""

from __future__ import annotations

from pathlib import Path

import trio

from kproxy.obs.accounting import account
from kproxy.obs.trace import TraceWriter
from kproxy.obs.trace_files import iter_trace_events
from kproxy.obs.trace_fold import IdleFetchFolder
from kproxy.obs.trace_schema import FIELD_NAMES

A = {"topic": "t", "partition": 0}
B = {"topic": "t", "partition": 1}


def _row(**fields: object) -> list:
    return [fields.get(name) for name in FIELD_NAMES]


def fetch(cid: int, direction: str, conn: int = 5, hwm: int = 10, order: tuple = (A, B), **extra: object) -> list:
    """An exchange's event as the writer composes it at level `records`: no record in the response."""
    if direction == "request":
        parts = [{**p, "fetch_offset": hwm} for p in order]
    else:
        parts = [{**p, "error_code": 0, "high_watermark": hwm, "last_stable_offset": hwm, "log_start_offset": 0,
                  "aborted_transactions": [{"producer_id": 7, "first_offset": 3}], "batches": [], "records": []}
                 for p in order]
    response = direction == "response"
    fields = {"schema_version": 6, "proxy_id": "p", "wall_time": 1e9 + cid / 1e3 + response / 1e4,
              "mono_ns": cid * 1_000_000 + response * 100_000, "conn_id": conn, "client_addr": "c:1", "broker_id": 1,
              "direction": direction, "api": "fetch", "api_key": 1, "api_version": 12, "correlation_id": cid,
              "client_id": "rdkafka", "size": 90 if response else 70, "outcome": "delivered", "copy": 0,
              "partitions": parts, "latency_ms": 0.1 + cid / 1e4 if response else None,
              "upstream_latency_ms": 0.05 + cid / 1e4 if response else None,
              "error_code": 0 if response else None, "error_codes": [] if response else None,
              "isolation_level": None if response else 1, **extra}
    return _row(**fields)


def exchange(cid: int, **kw: object) -> list[list]:
    return [fetch(cid, "request", **kw), fetch(cid, "response", **kw)]


def fold(rows: list[list]) -> list[dict]:
    folder = IdleFetchFolder()
    out = [r for row in rows for r in folder.take(row)]
    out += folder.flush()
    assert not folder.pending
    return [dict(zip(FIELD_NAMES, r)) for r in out]


def test_identical_exchanges_after_the_first_are_one_pair_with_their_count_times_and_latencies() -> None:
    rows = [row for cid in range(1, 7) for row in exchange(cid)]
    out = fold(rows)
    assert [(e["correlation_id"], e["direction"], e["repeats"]) for e in out] == [
        (1, "request", None), (1, "response", None), (6, "request", 5), (6, "response", 5)]
    request, response = out[2], out[3]
    assert request["first_correlation_id"] == response["first_correlation_id"] == 2
    assert request["first_mono_ns"] == 2_000_000 and request["mono_ns"] == 6_000_000
    assert response["first_mono_ns"] == 2_100_000 and response["mono_ns"] == 6_100_000
    assert response["first_wall_time"] == fetch(2, "response")[FIELD_NAMES.index("wall_time")]
    assert response["repeat_latencies_ms"] == [0.1 + c / 1e4 for c in range(2, 7)]
    assert response["latency_ms"] == response["repeat_latencies_ms"][-1]
    assert response["repeat_upstream_latencies_ms"] == [0.05 + c / 1e4 for c in range(2, 7)]
    assert request["repeat_latencies_ms"] is None
    # Forwarded on arrival, every exchange's upstream latency is its latency: not written twice.
    same = fold([row for cid in range(1, 4)
                 for row in (fetch(cid, "request"), fetch(cid, "response", upstream_latency_ms=0.1 + cid / 1e4))])
    assert same[-1]["repeat_latencies_ms"] == [0.1 + c / 1e4 for c in (2, 3)]
    assert same[-1]["repeat_upstream_latencies_ms"] is None
    # Everything else is the last exchange's own.
    def own(event: dict) -> dict:
        return {k: v for k, v in event.items() if not k.startswith(("repeat", "first_"))}

    assert own(response) == own(dict(zip(FIELD_NAMES, rows[-1])))
    assert own(request) == own(dict(zip(FIELD_NAMES, rows[-2])))


def test_one_repeat_is_written_as_itself_and_the_order_of_partitions_is_no_difference() -> None:
    rows = [*exchange(1), *exchange(2, order=(B, A))]
    assert fold(rows) == [dict(zip(FIELD_NAMES, r)) for r in rows]
    out = fold([*exchange(1), *exchange(2, order=(B, A)), *exchange(3)])
    assert [(e["correlation_id"], e["repeats"]) for e in out] == [(1, None), (1, None), (3, 2), (3, 2)]


def test_a_different_exchange_ends_the_fold_and_is_written_after_it() -> None:
    rows = [*exchange(1), *exchange(2), *exchange(3), *exchange(4, hwm=11), *exchange(5, hwm=11), *exchange(6, hwm=11)]
    out = fold(rows)
    assert [(e["correlation_id"], e["direction"][:3], e["repeats"]) for e in out] == [
        (1, "req", None), (1, "res", None), (3, "req", 2), (3, "res", 2),
        (4, "req", None), (4, "res", None), (6, "req", 2), (6, "res", 2)]


def test_what_is_never_folded() -> None:
    records = {"batches": [{"base_offset": 10}], "records": None, "records_file": "x.records"}
    touched = [
        {"rule": "slow", "action": "delay", "outcome": "delayed"},
        {"outcome": "duplicated"},
        {"copy": 1},
        {"hazard": "stale_end_txn"},
        {"upstream_partitions": []},
    ]
    for change in touched:
        rows = [*exchange(1), *exchange(2), fetch(3, "request", **change), fetch(3, "response", **change)]
        assert [e["repeats"] for e in fold(rows)] == [None] * 6, change
    # A response with records; another api version; another error; a correlation id that skips one.
    with_records = fetch(3, "response")
    with_records[FIELD_NAMES.index("partitions")] = [{**p, **records} for p in with_records[FIELD_NAMES.index("partitions")]]
    for third in ([fetch(3, "request"), with_records], exchange(3, api_version=11),
                  exchange(3, error_code=3, error_codes=[3]), exchange(4)):
        out = fold([*exchange(1), *exchange(2), *third])
        assert [e["repeats"] for e in out] == [None] * 6
    # Headers level: no partitions, nothing tells an empty response from a full one.
    bare = [fetch(c, d, partitions=None) for c in (1, 2, 3) for d in ("request", "response")]
    assert [e["repeats"] for e in fold(bare)] == [None] * 6


def test_another_connection_does_not_end_a_fold_but_its_own_events_and_its_close_do() -> None:
    other = exchange(1, conn=9)
    metadata = [_row(conn_id=5, direction=d, api="metadata", correlation_id=5) for d in ("request", "response")]
    close = _row(conn_id=5, direction="close", close_reason="client_closed")
    rows = [*exchange(1), *exchange(2), *other, *exchange(3), *exchange(4), *metadata, *exchange(6), *exchange(7),
            *exchange(8), close]
    out = fold(rows)
    assert [(e["conn_id"], e["api"], e["correlation_id"] if e["api"] else None, e["repeats"]) for e in out] == [
        (5, "fetch", 1, None), (5, "fetch", 1, None), (9, "fetch", 1, None), (9, "fetch", 1, None),
        (5, "fetch", 4, 3), (5, "fetch", 4, 3), (5, "metadata", 5, None), (5, "metadata", 5, None),
        # After the metadata exchange the next Fetch is a base of its own: its correlation id does not follow.
        (5, "fetch", 6, None), (5, "fetch", 6, None), (5, "fetch", 8, 2), (5, "fetch", 8, 2),
        (5, None, None, None)]


def test_a_request_held_for_its_answer_is_written_as_itself_when_the_answer_does_not_come_first() -> None:
    close = _row(conn_id=5, direction="close", close_reason="client_closed",
                 in_flight=[{"conn_id": 5, "correlation_id": 4, "state": "awaiting_broker"}])
    out = fold([*exchange(1), *exchange(2), *exchange(3), fetch(4, "request"), close])
    assert [(e["correlation_id"], e["direction"], e["repeats"]) for e in out] == [
        (1, "request", None), (1, "response", None), (3, "request", 2), (3, "response", 2),
        (4, "request", None), (None, "close", None)]
    # A flush writes it as itself too; its answer is then written as itself, and folding goes on after it.
    folder = IdleFetchFolder()
    for row in [*exchange(1), *exchange(2), fetch(3, "request")]:
        folder.take(row)
    assert [(r[FIELD_NAMES.index("correlation_id")], r[FIELD_NAMES.index("direction")]) for r in folder.flush()] == [
        (2, "request"), (2, "response"), (3, "request")]
    assert folder.take(fetch(3, "response")) == [fetch(3, "response")]
    assert folder.take(fetch(4, "request")) == [] and folder.take(fetch(4, "response")) == []


def test_accounting_counts_every_exchange_a_fold_stands_for() -> None:
    rows = [row for cid in range(1, 7) for row in exchange(cid)]
    full = account(dict(zip(FIELD_NAMES, r)) for r in rows)
    folded = account(fold(rows))
    assert folded.summary() == full.summary() and full.requests == 6 and full.answered == 6


async def _write(directory: Path, rows: list[list], fold_idle_fetches: bool, fmt: str = "segments") -> TraceWriter:
    writer = TraceWriter(directory, level="records", fmt=fmt, proxy_id="fold", fold_idle_fetches=fold_idle_fetches)
    async with trio.open_nursery() as nursery:
        await nursery.start(writer.run)
        for row in rows:
            assert writer.offer(list(row))
        await trio.sleep(0.3)  # written by the idle writer, not only at close
        assert writer.written > 0
        await writer.aclose()
    return writer


async def test_the_writer_folds_at_level_records_and_a_switch_turns_it_off(tmp_path: Path) -> None:
    rows = [row for cid in range(1, 41) for row in exchange(cid)]
    rows += exchange(41, hwm=12)
    for fmt in ("segments", "jsonl"):
        writer = await _write(tmp_path / fmt, rows, True, fmt)
        events = list(iter_trace_events(tmp_path / fmt))
        assert writer.written == len(events) < len(rows) / 4 and writer.written + writer.folded == len(rows)
        assert sum(e["repeats"] or 1 for e in events) == len(rows)
        assert [e["correlation_id"] for e in events if e["direction"] == "response"][-1] == 41
        assert account(events).summary() == account(dict(zip(FIELD_NAMES, r)) for r in rows).summary()
    writer = await _write(tmp_path / "every", rows, False)
    events = list(iter_trace_events(tmp_path / "every"))
    assert len(events) == len(rows) == writer.written and not any(e["repeats"] for e in events)
