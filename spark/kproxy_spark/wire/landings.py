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

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, StructField, StructType

from kproxy_spark.traces import (
    EXCHANGE,
    NOT_DELIVERED,
    trace_partitions,
    trace_records,
    with_coalesced_ids,
)
from kproxy_spark.wire.log_pass import (
    END_COLUMNS,
    END_TXN_ATTRIBUTION,
    FETCHED,
    MARKER,
    PRODUCED,
    START,
    TXN_KEY,
    decide_attempts,
    fold_partitions,
)
from kproxy_spark.wire.summary import TraceSummary, trace_summary


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


def fetched_records(traces: DataFrame, isolation: str = "auto", summary: TraceSummary | None = None) -> DataFrame:
    """Records (data and control) returned by Fetch responses, with a
    `read_committed` flag.

    The trace carries no isolation level, so it is inferred: brokers send an
    aborted-transactions list (possibly empty) only to read_committed
    fetches. isolation="auto" uses that tell when any fetch in the trace
    carries a list, and otherwise assumes read_committed (the workload's
    default); "read_committed" / "read_uncommitted" force it. `summary`:
    trace_summary(traces), when the caller has it (else its job runs here).
    """
    records = trace_records(traces).where(
        (F.col("api") == "fetch") & (F.col("direction") == "response") & F.col("offset").isNotNull()
    )
    if isolation == "read_committed":
        flag = F.lit(True)
    elif isolation == "read_uncommitted":
        flag = F.lit(False)
    elif isolation == "auto":
        has_lists = (summary or trace_summary(traces)).fetch_lists
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
        *[c for c in END_TXN_ATTRIBUTION if c not in EXCHANGE],
        "delivered",
        "response_error_code",
        "response_ns",
    )


#: The fewest groups each pass of the log runs in (more when the session
#: shuffles into more partitions): each group is one call into Python
#: holding many whole sessions or partitions. A call per session cost about
#: 2 ms each: 1,356 sessions at 100,000 operations.
GROUPS = 16


def spread(frame: DataFrame, *key: str) -> Column:
    """A group number by `key`, for a pass whose groups hold many keys each."""
    groups = max(GROUPS, int(frame.sparkSession.conf.get("spark.sql.shuffle.partitions") or 1))
    return F.pmod(F.hash(*key), F.lit(groups))


def _decided_attempts(produced: DataFrame, ends: DataFrame) -> DataFrame:
    """The landed attempts, each with the END_COLUMNS of the EndTxn that decides it (prefixed `end_`):
    one grouped pass per producer session (kproxy_spark.wire.log_pass.decide_attempts). A record
    without a transactional id is decided by no EndTxn and skips the pass."""
    candidates = ends.where(
        F.col("delivered") & (F.col("response_error_code").isNull() | (F.col("response_error_code") == 0))
    ).select(*TXN_KEY, *[F.col(c).alias(f"end_{c}") for c in (*END_COLUMNS, "mono_ns")])
    # Every column may be null in the pass's output (an attempt no EndTxn decides), whatever Spark
    # proved of its input: a null under a non-nullable field fails the task.
    end_fields = [StructField(f"end_{c}", candidates.schema[f"end_{c}"].dataType) for c in END_COLUMNS]
    schema = StructType([StructField(f.name, f.dataType) for f in (*produced.schema.fields, *end_fields)])
    sessions = produced.where(F.col("txn_id") != "")
    by_session = spread(produced, *TXN_KEY)
    decided = sessions.groupBy(by_session).cogroup(candidates.groupBy(by_session)).applyInArrow(
        decide_attempts, schema)
    plain = produced.where(F.col("txn_id") == "").select(
        *produced.columns, *[F.lit(None).cast(f.dataType).alias(f.name) for f in end_fields])
    return decided.unionByName(plain)


def _aborted_starts(traces: DataFrame) -> DataFrame:
    """Where the Fetch responses' aborted-transactions lists say an aborted transaction began."""
    return (
        trace_partitions(traces)
        .where((F.col("api") == "fetch") & (F.col("direction") == "response") & F.col("aborted_transactions").isNotNull())
        .select("topic", "partition", F.explode("aborted_transactions").alias("a"))
        .select("topic", "partition", F.col("a.producer_id").alias("producer_id"),
                F.col("a.first_offset").alias("offset"))
        .dropDuplicates()
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

    The EndTxn the broker applied decides a traced record (the first of its
    producer delivered after it; else the first delivered for its
    broker-side transaction number); the log itself decides the rest (the
    next transaction marker of the record's producer in that partition, or
    an aborted-transactions entry covering it); a non-transactional record is
    `committed`. Two grouped passes (kproxy_spark.wire.log_pass): one per
    producer session, one per partition.
    """
    # Callers that already hold produce_attempts / fetched_records / end_txns
    # (kept) pass them in, so the plan is not rebuilt from the raw events.
    if attempts is None:
        attempts = produce_attempts(traces)
    if fetched is None:
        fetched = fetched_records(traces, isolation)
    if ends is None:
        ends = end_txns(traces)
    produced = attempts.where(F.col("landed_offset").isNotNull()).select(
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
    )
    decided = _decided_attempts(produced, ends).withColumn("kind", F.lit(PRODUCED))
    # A record is fetched many times over (every consumer, every poll that
    # repeats it: 1.1 million fetched rows for 122,000 landed at 100,000
    # operations); one row per offset is all the fold reads, and Spark folds
    # them before they cross the shuffle.
    read = fetched.where(F.col("control").isNull()).groupBy("topic", "partition", "offset").agg(
        *[F.first(c, ignorenulls=True).alias(c) for c in ("key", "value", "producer_id", "transactional")]
    ).withColumn("kind", F.lit(FETCHED))
    markers = fetched.where(F.col("control").isNotNull()).select(
        "topic", "partition", "offset", "producer_id", "control", F.lit(MARKER).alias("kind")
    ).dropDuplicates(["topic", "partition", "producer_id", "offset"])
    starts = _aborted_starts(traces).withColumn("kind", F.lit(START))
    rows = decided.unionByName(read, allowMissingColumns=True).unionByName(
        markers, allowMissingColumns=True).unionByName(starts, allowMissingColumns=True)
    carried = [c for c in decided.columns if c != "kind"]
    types = {f.name: f.dataType for f in rows.schema.fields}
    names = [*carried[:-len(END_COLUMNS)], "seen_in_fetch", *carried[-len(END_COLUMNS):],
             "marker_fate", "next_marker_fate"]
    schema = StructType([StructField(n, BooleanType() if n == "seen_in_fetch" else
                                     types["control"] if n.endswith("marker_fate") else types[n]) for n in names])
    log = rows.groupBy(spread(rows, "topic", "partition")).applyInArrow(
        lambda table: fold_partitions(table, names), schema)
    return _with_fates(log)


def _with_fates(log: DataFrame) -> DataFrame:
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
    return log.withColumn("fate", fate).withColumn(
        "fate_source",
        F.when(end_fate.isNotNull(), "end_txn")
        .when(F.col("marker_fate").isNotNull(), "marker")
        .when(~transactional, "non-transactional")
        .otherwise(None),
    ).withColumn("key_long", F.col("key").cast("long")).withColumn("value_long", F.col("value").cast("long"))
