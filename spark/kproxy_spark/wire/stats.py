"""Wire statistics for the report, and the per-rule rows attribution reads,
computed in the same job as the checks."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy_spark.traces import EXCHANGE
from kproxy_spark.wire.check import WireTable
from kproxy_spark.wire.views import WireViews


def each_exchange(responses: DataFrame) -> DataFrame:
    """One row per response that crossed the wire: a folded idle Fetch response (`repeats`, docs/traces.md)
    becomes one per exchange it stands for, with that exchange's latencies, the rest as they are."""
    folded = responses.where(F.col("repeats").isNotNull())
    exchanges = F.arrays_zip(
        F.col("repeat_latencies_ms").alias("latency_ms"),
        F.coalesce("repeat_upstream_latencies_ms", "repeat_latencies_ms").alias("upstream_latency_ms"))
    unfolded = (folded.select("*", F.explode(exchanges).alias("_x"))
                .withColumn("latency_ms", F.col("_x.latency_ms"))
                .withColumn("upstream_latency_ms", F.col("_x.upstream_latency_ms")).drop("_x"))
    return responses.where(F.col("repeats").isNull()).unionByName(unfolded)


def latency(views: WireViews) -> DataFrame:
    """Per API: responses, p50/p95/p99/max of client-seen and upstream latency (every folded exchange counted)."""
    responses = views.traces.where(F.col("direction") == "response").select(
        "api", "error_code", "latency_ms", "upstream_latency_ms", "repeats", "repeat_latencies_ms",
        "repeat_upstream_latencies_ms")
    responses = each_exchange(responses).where(F.col("latency_ms").isNotNull())
    pct = F.array(F.lit(0.5), F.lit(0.95), F.lit(0.99))
    return (
        responses.groupBy("api")
        .agg(
            F.count(F.lit(1)).alias("responses"),
            F.percentile_approx("latency_ms", pct, 1000).alias("_p"),
            F.max("latency_ms").alias("max_ms"),
            F.percentile_approx("upstream_latency_ms", F.lit(0.99), 1000).alias("upstream_p99_ms"),
            F.sum((F.coalesce("error_code", F.lit(0)) != 0).cast("long")).alias("errors"),
        )
        .select(
            "api", "responses", "errors",
            F.col("_p")[0].alias("p50_ms"), F.col("_p")[1].alias("p95_ms"), F.col("_p")[2].alias("p99_ms"),
            "max_ms", "upstream_p99_ms",
        )
    )


def _rule_activity(views: WireViews) -> DataFrame:
    """Per rule, everything rule_touches and fault_phases say of the events it touched, in one
    aggregation, kept (`views.shared`): both read its rows, where each aggregated the traces on its own
    (Spark does not reuse the shuffle of two aggregations that keep different columns)."""
    touched = views.traces.fillna({"proxy_id": "", "copy": 0}).where(F.col("rule").isNotNull())
    return touched.groupBy("rule").agg(
        F.count_distinct(*EXCHANGE).alias("exchanges"),
        F.count(F.lit(1)).alias("rule_events"),
        F.array_sort(F.collect_set("action")).alias("actions"),
        F.array_sort(F.collect_set("api")).alias("apis"),
        F.array_sort(F.collect_set("direction")).alias("directions"),
        F.array_sort(F.collect_set("outcome")).alias("outcomes"),
        F.array_sort(F.array_distinct(F.flatten(F.collect_list(
            F.when(F.col("direction") == "response", F.coalesce("error_codes", F.array().cast("array<int>")))
            .otherwise(F.array().cast("array<int>")))))).alias("error_codes"),
        F.min("mono_ns").alias("start_ns"),
        F.max("mono_ns").alias("end_ns"),
    )


def rule_touches(views: WireViews) -> DataFrame:
    """Per rule: the exchanges it touched (request rules and response rules
    alike), with its actions, the APIs, the outcomes and the error codes
    the clients got back on those exchanges."""
    return views.shared(_rule_activity).select("rule", F.col("exchanges").alias("events"), "actions", "apis", "directions",
                                        "outcomes", "error_codes")


def rule_writes(views: WireViews) -> DataFrame:
    """Per rule that touched Produce requests: the writes it touched, how
    often each landed in the log, and what the client said of them."""
    touched = views.attempts.where(F.col("rule").isNotNull() & F.col("key_long").isNotNull()).select(
        "rule", "key_long", "value_long").distinct()
    landed = views.log.where(F.col("key_long").isNotNull()).groupBy("key_long", "value_long").agg(
        F.count(F.lit(1)).alias("landings"),
        F.sum((F.col("fate") == "committed").cast("int")).alias("committed"),
    )
    said = views.sent.groupBy(F.col("key").alias("key_long"), F.col("value").alias("value_long")).agg(
        F.first("type").alias("client_type"))
    rows = touched.join(landed, ["key_long", "value_long"], "left").join(said, ["key_long", "value_long"], "left")
    landings = F.coalesce("landings", F.lit(0))
    return rows.groupBy("rule").agg(
        F.count(F.lit(1)).alias("writes"),
        F.sum((landings == 0).cast("int")).alias("never_landed"),
        F.sum((landings == 1).cast("int")).alias("landed_once"),
        F.sum((landings > 1).cast("int")).alias("landed_more"),
        F.sum((F.coalesce("committed", F.lit(0)) > 0).cast("int")).alias("committed"),
        F.sum((F.col("client_type") == "ok").cast("int")).alias("client_ok"),
        F.sum((F.col("client_type") == "fail").cast("int")).alias("client_fail"),
        F.sum((F.col("client_type") == "info").cast("int")).alias("client_info"),
    )


def fault_phases(views: WireViews) -> DataFrame:
    """When each rule acted: rule, actions, start_ns, end_ns (trace clock), events."""
    return views.shared(_rule_activity).select("rule", "actions", "start_ns", "end_ns", F.col("rule_events").alias("events"))


def end_txn_outcomes(views: WireViews) -> DataFrame:
    """Delivered EndTxns by producer and broker-side number: transactional_id,
    txn_broker, commits, aborts, stale (with a hazard), first delivery (trace clock)."""
    return (
        views.ends.where(F.col("delivered"))
        .groupBy("transactional_id", "txn_broker")
        .agg(
            F.sum(F.col("end_txn_commit").cast("int")).alias("commits"),
            F.sum((~F.col("end_txn_commit")).cast("int")).alias("aborts"),
            F.sum(F.col("hazard").isNotNull().cast("int")).alias("stale"),
            F.min("delivery_ns").alias("delivery_ns"),
        )
    )


def trace_events(views: WireViews) -> DataFrame:
    """Events that crossed the wire: a folded idle Fetch event counts for every exchange it stands for."""
    return views.traces.agg(F.coalesce(F.sum(F.coalesce("repeats", F.lit(1))), F.lit(0)).alias("events"))


def clock_offset(views: WireViews) -> DataFrame:
    """One row, d: history time minus trace monotonic time, estimated from
    acknowledged sends (their completion follows the Produce response
    closely), so plots can put wire events and history ops on one axis. Null
    when nothing joins."""
    acked = views.sent.where((F.col("type") == "ok") & F.col("offset").isNotNull())
    attempts = views.attempts.where(F.col("status") == "ok").groupBy("key_long", "value_long").agg(
        F.min("mono_ns").alias("mono_ns")
    )
    joined = acked.join(attempts, (acked["key"] == attempts["key_long"]) & (acked["value"] == attempts["value_long"]))
    return joined.agg(F.percentile_approx(F.col("time") - F.col("mono_ns"), 0.5, 1000).alias("d"))


TABLES = (
    WireTable("latency", (("api", False),), latency, stat="latency"),
    WireTable("~rule-touches", (("rule", False),), rule_touches),
    WireTable("~rule-writes", (("rule", False),), rule_writes),
    WireTable("~phases", (("start_ns", False),), fault_phases),
    WireTable("~end-txn-outcomes", (("delivery_ns", False),), end_txn_outcomes, needs=("end_txn",)),
    WireTable("~trace-events", (), trace_events),
    WireTable("~clock-offset", (), clock_offset),
)
