"""The exchanges behind the first few drawn cases, read from the views the
wire checks kept, in two small Spark jobs.

The checks keep their views (Produce attempts, EndTxns, the log with its
fates, fetched records) in memory until the analysis ends; the few rows a
picture needs are filtered out of them, never read from the raw traces
again, and without a join (a join is a shuffle, and every broadcast of a
computed frame a job of its own):

1. the Produce attempts of the anchored records, and the EndTxns a case
   names: which producers, transactions and requests the pictures are of;
2. every record those Produce requests carried, every EndTxn and logged
   record of those producers, their markers, and the Fetch responses a
   broker diagnosis names.

Filters are coarse (each column's values apart) and the driver keeps the
exact rows. Each drawn case then carries ``wire_story``: its Produce and
EndTxn exchanges with times, synthetic numbers and what a rule did to them,
each record's fate, the EndTxn that decided it and its producer's next
marker after it in the log, and the Fetch response a broker diagnosis names.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy_spark.drawings.anchors import Anchor, drawn_anchors
from kproxy_spark.wire.frame import json_rows

if TYPE_CHECKING:
    from kproxy_spark.wire.views import WireViews

PRODUCE_FIELDS = ("conn_id", "correlation_id", "copy", "mono_ns", "delivery_ns", "response_ns", "transactional_id",
                  "producer_id", "txn_client", "txn_broker", "hazard", "rule", "action", "outcome")
ATTEMPT_FIELDS = (*PRODUCE_FIELDS, "txn_pid", "topic", "partition", "landed_offset", "key", "value", "key_long",
                  "value_long", "status", "response_error")
END_FIELDS = ("conn_id", "correlation_id", "copy", "mono_ns", "delivery_ns", "response_ns", "transactional_id",
              "txn_pid", "txn_client", "txn_broker", "end_txn_commit", "hazard", "rule", "action", "outcome",
              "delivered", "response_error_code")
LOG_FIELDS = ("topic", "partition", "offset", "fate", "fate_source", "marker_fate", "next_marker_fate",
              "end_conn_id", "end_correlation_id", "end_copy")
MARKER_FIELDS = ("topic", "partition", "producer_id", "offset", "control")
FETCH_FIELDS = ("conn_id", "correlation_id", "mono_ns", "latency_ms", "client_id", "rule", "action", "topic",
                "partition", "offset", "key", "value", "key_long", "value_long", "control", "producer_id",
                "last_stable_offset", "aborted_transactions", "listed_aborted")


def _rows(kind: str, frame: DataFrame, fields: Iterable[str]) -> DataFrame:
    return json_rows(frame, "kind", kind, "row", tuple(fields))


def _among(column: str, values: Iterable[Any]) -> F.Column:
    wanted = sorted({v for v in values if v is not None})
    if not wanted:
        return F.lit(False)
    if all(type(v) is int for v in wanted):
        # One expression, not one call into the JVM per value (`isin` sends each literal on its own).
        return F.expr(f"`{column}` IN ({', '.join(map(str, wanted))})")
    return F.col(column).isin(wanted)


def _collect(frame: DataFrame) -> dict[str, list[dict]]:
    import orjson

    found: dict[str, list[dict]] = defaultdict(list)
    for row in frame.collect():
        found[row["kind"]].append(orjson.loads(row["row"]))
    return found


def _first_job(views: WireViews, anchors: list[Anchor]) -> dict[str, list[dict]]:
    """The anchored records' Produce attempts and the EndTxns the cases name (coarse)."""
    records = [r for a in anchors for r in a.records]
    named = [e for a in anchors for e in a.exchanges]
    attempts = views.attempts.where(_among("key_long", (k for k, _ in records))
                                    & _among("value_long", (v for _, v in records)))
    ends = views.ends.where(_among("conn_id", (e.conn_id for e in named))
                            & _among("correlation_id", (e.correlation_id for e in named)))
    return _collect(_rows("attempt", attempts, ATTEMPT_FIELDS).unionByName(_rows("end_txn", ends, END_FIELDS)))


def _second_job(views: WireViews, requests: set[tuple], producers: set[int], numbers: set[int],
                fetches: set[tuple]) -> dict[str, list[dict]]:
    """Everything else the pictures show, for those requests, producers and transactions (coarse)."""
    attempts = views.attempts.where(_among("conn_id", (r[0] for r in requests))
                                    & _among("correlation_id", (r[1] for r in requests)))
    ends = views.ends.where(_among("txn_pid", producers))
    log = views.log.where(_among("txn_pid", producers)
                          & (_among("txn_broker", numbers) | _among("txn_client", numbers)))
    # Every Fetch that returned a marker repeats it: one row per marker.
    markers = views.fetched.where(F.col("control").isNotNull() & _among("producer_id", producers)).select(
        *MARKER_FIELDS).distinct()
    fetched = views.fetched.where(_among("conn_id", (f[0] for f in fetches))
                                  & _among("correlation_id", (f[1] for f in fetches)))
    return _collect(
        _rows("attempt", attempts, ATTEMPT_FIELDS)
        .unionByName(_rows("end_txn", ends, END_FIELDS))
        .unionByName(_rows("log", log, LOG_FIELDS))
        .unionByName(_rows("marker", markers, MARKER_FIELDS))
        .unionByName(_rows("fetch", fetched, FETCH_FIELDS)))


class _Plan:
    """Per anchor: what the first job found of it, and so what the second must fetch."""

    def __init__(self, anchor: Anchor, first: dict[str, list[dict]]) -> None:
        self.anchor = anchor
        wanted = set(anchor.records)
        self.attempts = [a for a in first["attempt"] if (a["key_long"], a["value_long"]) in wanted]
        self.named_ends = [e for e in first["end_txn"] for x in anchor.exchanges
                           if (e["conn_id"], e["correlation_id"]) == (x.conn_id, x.correlation_id)
                           and (x.copy is None or x.copy == e["copy"])]
        self.requests = {(a["conn_id"], a["correlation_id"], a["copy"]) for a in self.attempts}
        # (producer, number): the transactions the records were sent and delivered in. The named EndTxns
        # come as themselves: their own transactions' other requests would crowd the picture.
        self.txns = {(r["txn_pid"], n) for r in self.attempts for n in (r["txn_client"], r["txn_broker"])
                     if n is not None}
        self.producers = {r["txn_pid"] for r in (*self.attempts, *self.named_ends)}
        self.fetches = {(x.conn_id, x.correlation_id, *anchor.fetch_partition) for x in anchor.exchanges
                        if anchor.fetch_partition is not None}


def _story(plan: _Plan, second: dict[str, list[dict]]) -> dict:
    produces: dict[tuple, dict] = {}
    fates = {(r["topic"], r["partition"], r["offset"]): r for r in second["log"]}
    markers: dict[tuple, list[dict]] = defaultdict(list)
    for m in second["marker"]:
        markers[(m["topic"], m["partition"], m["producer_id"])].append(m)
    for r in second["attempt"]:
        request = (r["conn_id"], r["correlation_id"], r["copy"])
        if request not in plan.requests:
            continue
        exchange = produces.setdefault(request, {f: r[f] for f in PRODUCE_FIELDS} | {"records": []})
        fate = fates.get((r["topic"], r["partition"], r["landed_offset"])) or {}
        offset = r["landed_offset"]
        after = [m for m in markers[(r["topic"], r["partition"], r["producer_id"])]
                 if offset is not None and m["offset"] > offset]
        marker = min(after, key=lambda m: m["offset"]) if after else None
        exchange["records"].append({
            "key": _value(r, "key"), "value": _value(r, "value"), "topic": r["topic"], "partition": r["partition"],
            "offset": offset, "status": r["status"], "error": r["response_error"], "fate": fate.get("fate"),
            "fate_source": fate.get("fate_source"), "log_fate": fate.get("next_marker_fate") or fate.get("marker_fate"),
            "decided_by": [fate["end_conn_id"], fate["end_correlation_id"], fate["end_copy"]]
            if fate.get("end_conn_id") is not None else None,
            "marker": {"offset": marker["offset"], "control": marker["control"]} if marker else None,
        })
    for exchange in produces.values():
        exchange["records"].sort(key=lambda r: (r["topic"], r["partition"], -1 if r["offset"] is None else r["offset"]))
    named = {(e["conn_id"], e["correlation_id"], e["copy"]) for e in plan.named_ends}
    chosen = [e for e in second["end_txn"]
              if (e["txn_pid"], e["txn_client"]) in plan.txns or (e["txn_pid"], e["txn_broker"]) in plan.txns
              or (e["conn_id"], e["correlation_id"], e["copy"]) in named]
    # A copy's original (and the original's copies): where the hold began, what else it decided.
    same_request = {(e["conn_id"], e["correlation_id"]) for e in chosen}
    ends = {(e["conn_id"], e["correlation_id"], e["copy"]): {f: e[f] for f in END_FIELDS if f != "txn_pid"}
            for e in second["end_txn"] if (e["conn_id"], e["correlation_id"]) in same_request}
    fetches: dict[tuple, dict] = {}
    for r in second["fetch"]:
        if (r["conn_id"], r["correlation_id"], r["topic"], r["partition"]) not in plan.fetches:
            continue
        response = fetches.setdefault((r["conn_id"], r["correlation_id"]), {
            f: r[f] for f in ("conn_id", "correlation_id", "mono_ns", "latency_ms", "client_id", "rule", "action",
                              "topic", "partition", "last_stable_offset", "aborted_transactions")} | {"records": []})
        response["records"].append({"offset": r["offset"], "key": _value(r, "key"), "value": _value(r, "value"),
                                    "control": r["control"], "producer_id": r["producer_id"],
                                    "listed_aborted": r["listed_aborted"]})
    for response in fetches.values():
        response["records"].sort(key=lambda r: r["offset"])

    def by_time(e: dict) -> tuple:
        return e["mono_ns"], e["conn_id"], e["correlation_id"], e.get("copy") or 0

    return {"produces": sorted(produces.values(), key=by_time), "end_txns": sorted(ends.values(), key=by_time),
            "fetches": sorted(fetches.values(), key=by_time)}


def _value(row: dict, name: str) -> Any:
    number = row.get(f"{name}_long")
    return number if number is not None else row.get(name)


def attach_wire_stories(anomalies: dict[str, list[dict]], views: WireViews) -> int:
    """Read the first drawn cases' stories (two jobs) and store each in its case (``wire_story``).

    Returns how many cases got one."""
    anchors = drawn_anchors(anomalies)
    if not anchors:
        return 0
    first = _first_job(views, anchors)
    plans = [_Plan(anchor, first) for anchor in anchors]
    second = _second_job(
        views,
        requests={r for p in plans for r in p.requests},
        producers={pid for p in plans for pid in p.producers},
        numbers={n for p in plans for _, n in p.txns},
        fetches={f for p in plans for f in p.fetches},
    )
    attached = 0
    for plan in plans:
        story = _story(plan, second)
        if story["produces"] or story["end_txns"] or story["fetches"]:
            name, _, index = plan.anchor.case_id.rpartition("#")
            anomalies[name][int(index)]["wire_story"] = story
            attached += 1
    return attached
