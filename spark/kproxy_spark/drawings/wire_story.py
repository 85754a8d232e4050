"""The exchanges behind the first few drawn cases, fetched in one Spark job.

The checks keep their views (Produce attempts, EndTxns, the log with its
fates, fetched records) in memory until the analysis ends; the few rows a
picture needs are read from them, joined against the drawn cases' anchors
(kproxy_spark.drawings.anchors), never from the raw traces again. Each
drawn case then carries ``wire_story``: its Produce and EndTxn exchanges
with times, synthetic numbers and what a rule did to them, each record's
fate, the EndTxn that decided it and its producer's next marker after it
in the log, and the Fetch response a broker diagnosis names.
"""

from __future__ import annotations

from collections import defaultdict
from typing import TYPE_CHECKING, Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy_spark.drawings.anchors import Anchor, drawn_anchors
from kproxy_spark.traces import EXCHANGE
from kproxy_spark.wire.landings import TXN_KEY

if TYPE_CHECKING:
    from kproxy_spark.wire.views import WireViews

PRODUCE_FIELDS = ("conn_id", "correlation_id", "copy", "mono_ns", "delivery_ns", "response_ns", "transactional_id",
                  "producer_id", "txn_client", "txn_broker", "hazard", "rule", "action", "outcome")
RECORD_FIELDS = ("topic", "partition", "landed_offset", "key", "value", "key_long", "value_long", "status",
                 "response_error")
END_FIELDS = ("conn_id", "correlation_id", "copy", "mono_ns", "delivery_ns", "response_ns", "transactional_id",
              "txn_client", "txn_broker", "end_txn_commit", "hazard", "rule", "action", "outcome", "delivered",
              "response_error_code")
LOG_FIELDS = ("topic", "partition", "offset", "fate", "fate_source", "marker_fate", "next_marker_fate",
              "end_conn_id", "end_correlation_id", "end_copy")
FETCH_FIELDS = ("conn_id", "correlation_id", "copy", "mono_ns", "latency_ms", "client_id", "rule", "action",
                "topic", "partition", "offset", "key", "value", "key_long", "value_long", "control", "producer_id",
                "last_stable_offset", "aborted_transactions", "listed_aborted", "upstream_listed_aborted")


def _as_rows(kind: str, frame: DataFrame) -> DataFrame:
    payload = [c for c in frame.columns if c != "case_id"]
    return frame.select(F.lit(kind).alias("kind"), "case_id",
                        F.to_json(F.struct(*payload), {"ignoreNullFields": "false"}).alias("row"))


def story_frame(views: WireViews, anchors: list[Anchor]) -> DataFrame:
    """Every drawn case's rows (kind, case_id, row as JSON), from the kept views only."""
    spark = views.attempts.sparkSession
    records = F.broadcast(spark.createDataFrame(
        [(a.case_id, k, v) for a in anchors for k, v in a.records] or [("", -1, -1)],
        "case_id string, key_long long, value_long long"))
    named = F.broadcast(spark.createDataFrame(
        [(a.case_id, e.conn_id, e.correlation_id, e.copy, *(a.fetch_partition or (None, None)))
         for a in anchors for e in a.exchanges] or [("", -1, -1, None, None, None)],
        "case_id string, conn_id long, correlation_id int, named_copy int, named_topic string,"
        " named_partition int"))
    attempts, ends = views.attempts, views.ends
    # The Produce requests that carried an anchored record, with every record they carried.
    carried = attempts.join(records, ["key_long", "value_long"]).select("case_id", *EXCHANGE).distinct()
    produced = attempts.join(F.broadcast(carried), list(EXCHANGE))
    # The transactions those records were sent and delivered in, and those of the EndTxns the case names.
    named_ends = ends.join(named, ["conn_id", "correlation_id"]).where(
        F.col("named_copy").isNull() | (F.col("named_copy") == F.col("copy")))
    numbers = (
        produced.select("case_id", *TXN_KEY, F.explode(F.array("txn_client", "txn_broker")).alias("number"))
        .unionByName(named_ends.select("case_id", *TXN_KEY, F.explode(F.array("txn_client", "txn_broker"))
                                       .alias("number")))
        .where(F.col("number").isNotNull()).distinct()
    )
    by_client = ends.join(F.broadcast(numbers.withColumnRenamed("number", "txn_client")), [*TXN_KEY, "txn_client"])
    by_broker = ends.join(F.broadcast(numbers.withColumnRenamed("number", "txn_broker")), [*TXN_KEY, "txn_broker"])
    end_rows = (by_client.select("case_id", *END_FIELDS).unionByName(by_broker.select("case_id", *END_FIELDS))
                .unionByName(named_ends.select("case_id", *END_FIELDS)))
    # A copy's original (and the original's copies): where the hold began, what else it decided.
    same_request = end_rows.select("case_id", "conn_id", "correlation_id").distinct()
    end_rows = end_rows.unionByName(
        ends.join(F.broadcast(same_request), ["conn_id", "correlation_id"]).select("case_id", *END_FIELDS)).distinct()
    landed = produced.where(F.col("landed_offset").isNotNull()).select(
        "case_id", "topic", "partition", F.col("landed_offset").alias("offset"), "producer_id").distinct()
    fates = views.log.join(F.broadcast(landed.drop("producer_id")), ["topic", "partition", "offset"])
    # Each record's producer's next marker after it: what the log says decided it.
    after = landed.withColumnRenamed("offset", "record_offset")
    markers = (
        views.fetched.where(F.col("control").isNotNull())
        .select("topic", "partition", "producer_id", "offset", "control")
        .join(F.broadcast(after), ["topic", "partition", "producer_id"])
        .where(F.col("offset") > F.col("record_offset"))
        .groupBy("case_id", "topic", "partition", "record_offset")
        .agg(F.min(F.struct("offset", "control")).alias("m"))
        .select("case_id", "topic", "partition", "record_offset", "m.offset", "m.control")
    )
    fetched = views.fetched.join(
        named.where(F.col("named_topic").isNotNull()),
        (views.fetched["conn_id"] == named["conn_id"]) & (views.fetched["correlation_id"] == named["correlation_id"])
        & (views.fetched["topic"] == named["named_topic"]) & (views.fetched["partition"] == named["named_partition"]),
    ).select("case_id", *[views.fetched[c] for c in FETCH_FIELDS])
    return (
        _as_rows("produce", produced.select("case_id", *PRODUCE_FIELDS, *RECORD_FIELDS))
        .unionByName(_as_rows("end_txn", end_rows))
        .unionByName(_as_rows("log", fates.select("case_id", *LOG_FIELDS)))
        .unionByName(_as_rows("marker", markers))
        .unionByName(_as_rows("fetch", fetched))
    )


def _record_value(row: dict, name: str) -> Any:
    number = row.get(f"{name}_long")
    return number if number is not None else row.get(name)


def assemble(rows: list[dict]) -> dict[str, dict]:
    """Collected rows -> case_id -> wire story (exchanges in time order, each record with its fate)."""
    import orjson

    by_case: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for row in rows:
        by_case[row["case_id"]][row["kind"]].append(orjson.loads(row["row"]))
    stories = {}
    for case_id, parts in by_case.items():
        fates = {(r["topic"], r["partition"], r["offset"]): r for r in parts["log"]}
        markers = {(m["topic"], m["partition"], m["record_offset"]): m for m in parts["marker"]}
        produces: dict[tuple, dict] = {}
        for r in parts["produce"]:
            exchange = produces.setdefault((r["conn_id"], r["correlation_id"], r["copy"]),
                                           {f: r[f] for f in PRODUCE_FIELDS} | {"records": []})
            fate = fates.get((r["topic"], r["partition"], r["landed_offset"])) or {}
            marker = markers.get((r["topic"], r["partition"], r["landed_offset"]))
            exchange["records"].append({
                "key": _record_value(r, "key"), "value": _record_value(r, "value"), "topic": r["topic"],
                "partition": r["partition"], "offset": r["landed_offset"], "status": r["status"],
                "error": r["response_error"], "fate": fate.get("fate"), "fate_source": fate.get("fate_source"),
                "log_fate": fate.get("next_marker_fate") or fate.get("marker_fate"),
                "decided_by": [fate.get("end_conn_id"), fate.get("end_correlation_id"), fate.get("end_copy")]
                if fate.get("end_conn_id") is not None else None,
                "marker": {"offset": marker["offset"], "control": marker["control"]} if marker else None,
            })
        for exchange in produces.values():
            exchange["records"].sort(key=lambda r: (r["topic"], r["partition"], r["offset"] if r["offset"] is not None
                                                    else -1))
        fetches: dict[tuple, dict] = {}
        for r in parts["fetch"]:
            response = fetches.setdefault((r["conn_id"], r["correlation_id"], r["topic"], r["partition"]), {
                f: r[f] for f in ("conn_id", "correlation_id", "mono_ns", "latency_ms", "client_id", "rule", "action",
                                  "topic", "partition", "last_stable_offset", "aborted_transactions")} | {"records": []})
            response["records"].append({"offset": r["offset"], "key": _record_value(r, "key"),
                                        "value": _record_value(r, "value"), "control": r["control"],
                                        "producer_id": r["producer_id"], "listed_aborted": r["listed_aborted"]})
        for response in fetches.values():
            response["records"].sort(key=lambda r: r["offset"])
        stories[case_id] = {
            "produces": sorted(produces.values(), key=lambda e: (e["mono_ns"], e["conn_id"], e["correlation_id"],
                                                                 e["copy"])),
            "end_txns": sorted(parts["end_txn"], key=lambda e: (e["mono_ns"], e["conn_id"], e["correlation_id"],
                                                                 e["copy"])),
            "fetches": sorted(fetches.values(), key=lambda f: (f["mono_ns"], f["conn_id"])),
        }
    return stories


def attach_wire_stories(anomalies: dict[str, list[dict]], views: WireViews) -> int:
    """Fetch the first drawn cases' stories in one job and store each in its case (``wire_story``).

    Returns how many cases got one."""
    anchors = drawn_anchors(anomalies)
    if not anchors:
        return 0
    stories = assemble(story_frame(views, anchors).collect())
    attached = 0
    for anchor in anchors:
        story = stories.get(anchor.case_id)
        if story and (story["produces"] or story["end_txns"] or story["fetches"]):
            name, _, index = anchor.case_id.rpartition("#")
            anomalies[name][int(index)]["wire_story"] = story
            attached += 1
    return attached
