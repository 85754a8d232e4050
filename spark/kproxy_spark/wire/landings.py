"""Where each traced record landed and what decided its fate: the frames
kproxy_spark.wire.views keeps for the checks, built from the flattened
traces (kproxy_spark.traces).

* produce_attempts: every record of every Produce request, with how the
  request was answered and where the record landed;
* fetched_records: every record a Fetch response returned, with what the
  response said of it (its aborted-transactions list, its last stable
  offset, and the broker's own response beside a rule's rewrite);
* end_txns: every EndTxn with its synthetic numbers and hazard;
* landings: the log, one row per landed record with its fate and the
  EndTxn or marker that decided it (docs/analysis.md, "The log").
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from kproxy_spark.traces import (
    EXCHANGE,
    NOT_DELIVERED,
    trace_partitions,
    trace_records,
    with_coalesced_ids,
)


def _delivered() -> "F.Column":
    """Whether the request reached the broker. A `held` request is traced
    when the hold ends and it is delivered late on the client's connection;
    the broker's answer (response_ns) is what shows it arrived (a held
    request the client's hang-up cut off is delivered as a ghost copy,
    traced on its own)."""
    outcome = F.coalesce(F.col("outcome"), F.lit("delivered"))
    return ~outcome.isin(*NOT_DELIVERED) & ((outcome != "held") | F.col("response_ns").isNotNull())


def exchanges(traces: DataFrame) -> DataFrame:
    """One row per request event, joined with its response event when traced.

    Adds response_ns, response_error_code, response_error_codes,
    latency_ms / upstream_latency_ms (from the response), `delivered` and
    `delivery_ns`: when the request reached the broker, taken as the response
    time minus the upstream latency because a delayed request's own event
    time is its arrival, not its delivery.
    """
    events = with_coalesced_ids(traces)
    requests = events.where(F.col("direction") == "request").drop("latency_ms", "upstream_latency_ms")
    responses = events.where(F.col("direction") == "response").select(
        *EXCHANGE,
        F.col("mono_ns").alias("response_ns"),
        F.col("error_code").alias("response_error_code"),
        F.col("error_codes").alias("response_error_codes"),
        "latency_ms",
        "upstream_latency_ms",
    )
    joined = requests.join(responses, list(EXCHANGE), "left")
    return joined.withColumn("delivered", _delivered()).withColumn(
        "delivery_ns",
        F.coalesce(
            (F.col("response_ns") - F.col("upstream_latency_ms") * 1e6).cast("long"),
            F.col("mono_ns"),
        ),
    )


def _producer_key(tid: str, pid: str, epoch: str) -> list["F.Column"]:
    # The synthetic transaction numbers are counted per (transactional id,
    # producer id, epoch); nulls become sentinels so the key always joins.
    return [
        F.coalesce(F.col(tid), F.lit("")).alias("txn_id"),
        F.coalesce(F.col(pid), F.lit(-1)).cast("long").alias("txn_pid"),
        F.coalesce(F.col(epoch), F.lit(-1)).cast("int").alias("txn_epoch"),
    ]


TXN_KEY = ("txn_id", "txn_pid", "txn_epoch")


def closed_in_flight(traces: DataFrame) -> DataFrame:
    """Requests a connection left without an answer when it closed (close
    events' `in_flight`): the exchange key, `state` (where the request was)
    and `lost_reason`, e.g. 'lost: connection closed (client_closed)'."""
    closes = with_coalesced_ids(traces).where((F.col("direction") == "close") & F.col("in_flight").isNotNull())
    entries = closes.select("proxy_id", "close_reason", F.explode("in_flight").alias("r"))
    return entries.select(
        "proxy_id", F.col("r.conn_id").alias("conn_id"), F.col("r.correlation_id").alias("correlation_id"),
        F.coalesce(F.col("r.copy"), F.lit(0)).alias("copy"), F.col("r.state").alias("state"),
        F.concat(F.lit("lost: connection closed ("), F.coalesce("close_reason", F.lit("no reason given")),
                 F.lit(")")).alias("lost_reason"),
    ).dropDuplicates(list(EXCHANGE))


def produce_attempts(traces: DataFrame) -> DataFrame:
    """One row per record per Produce request event (copies included), with
    the partition's answer: response_error, landed_offset and a status of
    ok | error | not-delivered | lost (its connection closed with it in
    flight: `lost_reason`) | no-response, and when the answer came (response_ns)."""
    records = trace_records(traces).where((F.col("api") == "produce") & (F.col("direction") == "request"))
    responses = trace_partitions(traces).where(
        (F.col("api") == "produce") & (F.col("direction") == "response")
    ).select(
        *EXCHANGE,
        "topic",
        "partition",
        F.coalesce("partition_error_code", "error_code").alias("response_error"),
        F.col("base_offset").alias("response_base_offset"),
        F.col("mono_ns").alias("response_ns"),
        F.col("upstream_latency_ms").alias("response_upstream_ms"),
    )
    joined = records.join(responses, [*EXCHANGE, "topic", "partition"], "left").join(
        closed_in_flight(traces).select(*EXCHANGE, "lost_reason"), list(EXCHANGE), "left")
    delivered = _delivered()
    status = (
        F.when(delivered & (F.col("response_error") == 0), "ok")
        .when(F.col("response_error") != 0, "error")
        .when(F.col("outcome").isin(*NOT_DELIVERED), "not-delivered")
        .when(F.col("lost_reason").isNotNull(), "lost")
        .when(~delivered, "not-delivered")
        .otherwise("no-response")
    )
    return joined.select(
        *EXCHANGE,
        "mono_ns",
        "wall_time",
        "transactional_id",
        *_producer_key("transactional_id", "event_producer_id", "event_producer_epoch"),
        "producer_id",
        "txn_client",
        "txn_broker",
        "hazard",
        "rule",
        "action",
        "outcome",
        "topic",
        "partition",
        "record_index",
        "key",
        "value",
        F.col("key").cast("long").alias("key_long"),
        F.col("value").cast("long").alias("value_long"),
        "transactional",
        "response_error",
        status.alias("status"),
        F.when(F.col("response_error").isNull(), F.col("lost_reason")).alias("lost_reason"),
        F.when(
            delivered & (F.col("response_error") == 0) & (F.col("response_base_offset") >= 0),
            F.col("response_base_offset") + F.col("record_index"),
        ).alias("landed_offset"),
        F.coalesce(
            (F.col("response_ns") - F.col("response_upstream_ms") * 1e6).cast("long"), F.col("mono_ns")
        ).alias("delivery_ns"),
        "response_ns",
    )


def fetched_records(traces: DataFrame, isolation: str = "auto") -> DataFrame:
    """Records (data and control) returned by Fetch responses, with a
    `read_committed` flag.

    The trace carries no isolation level, so it is inferred: brokers send an
    aborted-transactions list (possibly empty) only to read_committed
    fetches. isolation="auto" uses that tell when any fetch in the trace
    carries a list, and otherwise assumes read_committed (the workload's
    default); "read_committed" / "read_uncommitted" force it.
    """
    records = trace_records(traces).where(
        (F.col("api") == "fetch") & (F.col("direction") == "response") & F.col("offset").isNotNull()
    )
    if isolation == "read_committed":
        flag = F.lit(True)
    elif isolation == "read_uncommitted":
        flag = F.lit(False)
    elif isolation == "auto":
        has_lists = records.where(F.col("aborted_transactions").isNotNull()).limit(1).count() > 0
        flag = F.col("aborted_transactions").isNotNull() if has_lists else F.lit(True)
    else:
        raise ValueError(f"isolation must be auto, read_committed or read_uncommitted, not {isolation!r}")
    return records.withColumn("read_committed", flag).withColumn(
        "key_long", F.col("key").cast("long")
    ).withColumn("value_long", F.col("value").cast("long"))


def end_txns(traces: DataFrame) -> DataFrame:
    """Every EndTxn request with its response, delivery time and producer key."""
    # Both sides filtered before the join: the request side alone would still
    # shuffle every response (a spinning consumer's Fetches) into it.
    return exchanges(traces.where(F.col("api") == "end_txn")).select(
        *EXCHANGE,
        "mono_ns",
        "delivery_ns",
        "transactional_id",
        *_producer_key("transactional_id", "producer_id", "producer_epoch"),
        "txn_client",
        "txn_broker",
        "end_txn_commit",
        "hazard",
        "rule",
        "action",
        "outcome",
        "delivered",
        "response_error_code",
        "response_ns",
    )


END_TXN_ATTRIBUTION = (
    "conn_id",
    "correlation_id",
    "copy",
    "txn_client",
    "txn_broker",
    "end_txn_commit",
    "hazard",
    "rule",
    "action",
    "outcome",
)

#: When and through which proxy the EndTxn reached the broker, carried with
#: the attribution (as `end_proxy_id`, `end_delivery_ns`) so a Fetch served
#: after it can be told from one served while the transaction was open.
END_TXN_TIMING = ("proxy_id", "delivery_ns")


def deciding_end_txns(traces: DataFrame, ends: DataFrame | None = None) -> DataFrame:
    """Per producer and broker-side transaction number, the EndTxn that ended
    it: the first one delivered whose response (if any) was not an error.
    Columns: TXN_KEY and txn_broker prefixed `decided_`, then
    END_TXN_ATTRIBUTION prefixed `end_`. `ends`: end_txns(traces), when the
    caller already holds it."""
    candidates = (end_txns(traces) if ends is None else ends).where(
        F.col("delivered")
        & F.col("txn_broker").isNotNull()
        & (F.col("response_error_code").isNull() | (F.col("response_error_code") == 0))
    )
    first = Window.partitionBy(*TXN_KEY, "txn_broker").orderBy("delivery_ns", "mono_ns", "copy")
    chosen = candidates.withColumn("_n", F.row_number().over(first)).where(F.col("_n") == 1)
    return chosen.select(
        *[F.col(c).alias(f"decided_{c}") for c in TXN_KEY],
        F.col("txn_broker").alias("decided_txn_broker"),
        *[F.col(c).alias(f"end_{c}") for c in (*END_TXN_ATTRIBUTION, *END_TXN_TIMING)],
    )


def landings(
    traces: DataFrame,
    isolation: str = "auto",
    attempts: DataFrame | None = None,
    fetched: DataFrame | None = None,
    ends: DataFrame | None = None,
) -> DataFrame:
    """Every record known to be in a partition's log, once per (topic,
    partition, offset): acknowledged by a Produce response or returned by a
    Fetch. Carries the producing request's numbers, hazard and rule when the
    Produce was traced, and `fate`: committed | aborted | unknown.

    Fate comes first from the log itself (the next transaction marker of the
    record's producer in that partition, or an aborted-transactions entry
    covering it), then from the EndTxn that ended the record's broker-side
    transaction, and is `committed` for non-transactional records.
    """
    # Callers that already hold produce_attempts / fetched_records / end_txns
    # (kept) pass them in, so the plan is not rebuilt from the raw events.
    if attempts is None:
        attempts = produce_attempts(traces)
    if fetched is None:
        fetched = fetched_records(traces, isolation)
    attempts = attempts.where(F.col("landed_offset").isNotNull())
    produced = attempts.select(
        "topic",
        "partition",
        F.col("landed_offset").alias("offset"),
        "key",
        "value",
        "producer_id",
        "transactional",
        *TXN_KEY,
        "txn_client",
        "txn_broker",
        F.col("hazard").alias("produce_hazard"),
        F.col("rule").alias("produce_rule"),
        F.col("action").alias("produce_action"),
        F.col("conn_id").alias("produce_conn_id"),
        F.col("correlation_id").alias("produce_correlation_id"),
        F.col("copy").alias("produce_copy"),
        F.col("delivery_ns").alias("produce_delivery_ns"),
        F.lit(False).alias("seen_in_fetch"),
    )
    read = fetched.where(F.col("control").isNull()).select(
        "topic", "partition", "offset", "key", "value", "producer_id", "transactional",
        F.lit(True).alias("seen_in_fetch"),
    )
    both = produced.unionByName(read, allowMissingColumns=True)
    attributes = [c for c in produced.columns if c not in ("topic", "partition", "offset", "seen_in_fetch")]
    log = both.groupBy("topic", "partition", "offset").agg(
        *[F.first(c, ignorenulls=True).alias(c) for c in attributes],
        F.max("seen_in_fetch").alias("seen_in_fetch"),
    )
    if ends is None:
        ends = end_txns(traces)
    return _with_fates(log, fetched, traces, deciding_end_txns(traces, ends), ends)


def _marker_fates(log: DataFrame, fetched: DataFrame, traces: DataFrame) -> DataFrame:
    # One sort per (topic, partition, producer) instead of a range join: each
    # record looks forward to its producer's next marker and back to the last
    # boundary (marker or aborted-transaction start).
    points = log.select("topic", "partition", "producer_id", "offset", F.lit(1).alias("kind"), F.lit(None).cast("string").alias("control"))
    markers = fetched.where(F.col("control").isNotNull()).select(
        "topic", "partition", "producer_id", "offset", F.lit(2).alias("kind"), "control"
    ).dropDuplicates(["topic", "partition", "producer_id", "offset"])
    starts = (
        trace_partitions(traces)
        .where((F.col("api") == "fetch") & (F.col("direction") == "response") & F.col("aborted_transactions").isNotNull())
        .select("topic", "partition", F.explode("aborted_transactions").alias("a"))
        .select(
            "topic",
            "partition",
            F.col("a.producer_id").alias("producer_id"),
            F.col("a.first_offset").alias("offset"),
            F.lit(0).alias("kind"),
            F.lit(None).cast("string").alias("control"),
        )
        .dropDuplicates()
    )
    timeline = points.unionByName(markers).unionByName(starts)
    ordered = Window.partitionBy("topic", "partition", "producer_id").orderBy("offset", "kind")
    behind = ordered.rowsBetween(Window.unboundedPreceding, -1)
    # "The first marker at or after this row" is asked as "the last marker
    # up to this row" in the reversed order: Spark computes a frame that
    # starts at the current row afresh for every row (quadratic in a
    # producer's records), a frame from the partition's start in one pass.
    ahead = (
        Window.partitionBy("topic", "partition", "producer_id")
        .orderBy(F.col("offset").desc(), F.col("kind").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    next_marker = F.last(F.when(F.col("kind") == 2, F.col("control")), ignorenulls=True).over(ahead)
    last_boundary = F.last(F.when(F.col("kind") != 1, F.col("kind")), ignorenulls=True).over(behind)
    fate = (
        F.when(next_marker == "commit", "committed")
        .when(next_marker == "abort", "aborted")
        .when(last_boundary == 0, "aborted")
    )
    return (
        timeline.withColumn("marker_fate", fate)
        .withColumn("next_marker_fate", F.when(next_marker == "commit", "committed").when(next_marker == "abort", "aborted"))
        .where(F.col("kind") == 1)
        .select("topic", "partition", "offset", "marker_fate", "next_marker_fate")
    )


def _next_end_txns(log: DataFrame, ends: DataFrame) -> DataFrame:
    """For each traced transactional record, the first EndTxn of its producer
    delivered to the broker after the record's Produce: the one the broker
    applies to it, whatever transaction the client meant that EndTxn for.

    One sort per producer (records and EndTxns on one timeline) instead of a
    range join. Columns: topic, partition, offset, then END_TXN_ATTRIBUTION
    prefixed `end_`.
    """
    ends = ends.where(
        F.col("delivered")
        & (F.col("response_error_code").isNull() | (F.col("response_error_code") == 0))
    )
    attribution = F.struct(*[F.col(c).alias(c) for c in (*END_TXN_ATTRIBUTION, *END_TXN_TIMING)])
    records = log.where(F.col("produce_delivery_ns").isNotNull() & F.col("txn_id").isNotNull()).select(
        *TXN_KEY, "topic", "partition", "offset",
        F.col("produce_delivery_ns").alias("t"), F.lit(0).alias("kind"), F.lit(None).alias("end"),
    )
    end_points = ends.select(
        *TXN_KEY, F.lit(None).cast("string").alias("topic"), F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("long").alias("offset"), F.col("delivery_ns").alias("t"), F.lit(1).alias("kind"),
        attribution.alias("end"),
    )
    timeline = records.unionByName(end_points, allowMissingColumns=True)
    # The first EndTxn at or after each record, asked in the reversed order
    # as the last one up to it: one pass instead of a frame per row (see
    # _marker_fates). EndTxns delivered at the same instant are taken in
    # order of their attribution, so the choice does not depend on row order.
    ahead = (
        Window.partitionBy(*TXN_KEY)
        .orderBy(F.col("t").desc(), F.col("kind").desc(), F.col("end").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    nxt = timeline.withColumn("next_end", F.last("end", ignorenulls=True).over(ahead)).where(F.col("kind") == 0)
    return nxt.select(
        "topic", "partition", "offset",
        *[F.col(f"next_end.{c}").alias(f"end_{c}") for c in (*END_TXN_ATTRIBUTION, *END_TXN_TIMING)]
    )


def _with_fates(log: DataFrame, fetched: DataFrame, traces: DataFrame, deciders: DataFrame,
                ends: DataFrame) -> DataFrame:
    marked = log.join(_marker_fates(log, fetched, traces), ["topic", "partition", "offset"], "left")
    by_order = marked.join(_next_end_txns(log, ends), ["topic", "partition", "offset"], "left")
    # Records only seen in a Fetch (no traced Produce) fall back to the EndTxn
    # that ended their broker-side transaction number.
    decided = by_order.join(
        deciders.select(
            *[F.col(f"decided_{c}") for c in (*TXN_KEY, "txn_broker")],
            *[F.col(f"end_{c}").alias(f"num_end_{c}") for c in (*END_TXN_ATTRIBUTION, *END_TXN_TIMING)],
        ),
        [F.col(c) == F.col(f"decided_{c}") for c in (*TXN_KEY, "txn_broker")],
        "left",
    ).drop(*[f"decided_{c}" for c in (*TXN_KEY, "txn_broker")])
    # One side (delivery order, else the transaction number) for every column
    # of the deciding EndTxn: chosen column by column, the commit flag that
    # picks the side would be replaced before the columns after it.
    use_order = F.col("end_end_txn_commit").isNotNull()
    chosen = {f"end_{c}" for c in (*END_TXN_ATTRIBUTION, *END_TXN_TIMING)}
    decided = decided.select(*[
        F.when(use_order, F.col(c)).otherwise(F.col(f"num_{c}")).alias(c) if c in chosen else c
        for c in decided.columns if not c.startswith("num_end_")])
    end_fate = F.when(F.col("end_end_txn_commit"), "committed").when(~F.col("end_end_txn_commit"), "aborted")
    transactional = F.coalesce(
        F.col("transactional"), F.col("txn_broker").isNotNull() | (F.col("txn_id") != "")
    )
    # The EndTxn the broker applied (delivery order) decides a traced record;
    # the log's markers decide the rest. On a broker that writes a marker for
    # every transaction both agree; where it does not (a stale EndTxn ended
    # the transaction early, later records get no marker of their own) the
    # producer's next marker would belong to a later transaction.
    fate = F.coalesce(
        end_fate,
        F.col("marker_fate"),
        F.when(~transactional, F.lit("committed")),
        F.lit("unknown"),
    )
    return decided.withColumn("fate", fate).withColumn(
        "fate_source",
        F.when(end_fate.isNotNull(), "end_txn")
        .when(F.col("marker_fate").isNotNull(), "marker")
        .when(~transactional, "non-transactional")
        .otherwise(None),
    ).withColumn("key_long", F.col("key").cast("long")).withColumn("value_long", F.col("value").cast("long"))
