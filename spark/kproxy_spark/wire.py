"""Wire correlation: set what crossed the proxy beside what the clients believed.

`wire_checks(ops, traces)` returns anomaly name -> cases (a DataFrame each);
`wire_frame` unions them with the wire statistics into one frame, collected
in one job and read back by `read_wire_rows`.
The individual checks take `sent` (history_sends(ops): every completed send
micro-op) and the trace views of kproxy_spark.traces, so each is computed once.
Every case carries `rules`: the fault rules its explanation points at, which
is what `fault-impact` counts. docs/analysis.md describes each anomaly.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from kproxy_spark.history import flatten_mops, key_partitions, sends
from kproxy_spark.traces import (
    END_TXN_ATTRIBUTION,
    EXCHANGE,
    TXN_KEY,
    end_txns,
    fetched_records,
    landings,
    produce_attempts,
    rule_removed_records,
)

WIRE_ANOMALIES = (
    "torn-transaction",
    "stale-end-txn",
    "late-produce",
    "client-outcome-mismatch",
    "spurious-offset",
    "ambiguous-error",
    "broker-aborted-read",
    "stale-aborted-entry",
    "past-lso-read",
    "left-out-records",
    "latency",
    "fault-impact",
)

#: The columns of kproxy_spark.traces.fetched_records that the wire checks read.
FETCHED_COLUMNS = (
    *EXCHANGE, "mono_ns", "client_id", "rule", "action", "topic", "partition", "offset", "key", "value",
    "key_long", "value_long", "control", "producer_id", "transactional", "last_stable_offset",
    "aborted_transactions", "read_committed", "rewritten", "listed_aborted", "upstream_listed_aborted", "past_lso", "upstream_past_lso",
)

_END_TXN = F.struct(*[F.col(f"end_{c}").alias(c) for c in END_TXN_ATTRIBUTION])

# --- explanations: one plain sentence per case, built from its own fields --

# How a fault action reads in a sentence: text before and after the rule's name.
_ACTED = {
    "duplicate": ("duplicated by rule '", "'"),
    "delay": ("delayed by rule '", "'"),
    "hold": ("held back by rule '", "'"),
    "drop": ("dropped by rule '", "'"),
    "drop_response": ("its response dropped by rule '", "'"),
    "respond": ("answered by the proxy (rule '", "')"),
    "replace_error": ("its answer replaced with an error by rule '", "'"),
    "rewrite": ("rewritten by rule '", "'"),
    "disconnect": ("its connection closed by rule '", "'"),
}


_ERROR_NAMES: list = []


def _error_names() -> Column:
    """Kafka's error codes -> names, as a map column: built once per Spark
    context (a few hundred calls into the JVM each time otherwise)."""
    from pyspark import SparkContext
    from kio.schema.errors import ErrorCode

    context = SparkContext._active_spark_context
    if not _ERROR_NAMES or _ERROR_NAMES[0] is not context:
        _ERROR_NAMES[:] = [context, F.create_map(*[x for e in ErrorCode for x in (F.lit(int(e)), F.lit(e.name.upper()))])]
    return _ERROR_NAMES[1]


def _error(code: Column) -> Column:
    """An error code as Kafka names it (the number when kio does not know it)."""
    return F.coalesce(F.element_at(_error_names(), code), code.cast("string"))


def _errors(codes: Column) -> Column:
    return F.array_join(F.transform(codes, _error), ", ")


def _acted(rule: Column, action: Column) -> Column:
    """'duplicated by rule 'x'' and the like; null when no rule acted."""
    phrase = F.concat(F.lit("handled by rule '"), rule, F.lit("' (action "), F.coalesce(action, F.lit("?")), F.lit(")"))
    for name, (before, after) in reversed(_ACTED.items()):
        phrase = F.when(action == name, F.concat(F.lit(before), rule, F.lit(after))).otherwise(phrase)
    return F.when(rule.isNotNull(), phrase)


def _pairs(pairs: Column) -> Column:
    """[key, value] pairs as Kafka engineers write records: [3,0] [0,15]."""
    return F.array_join(
        F.transform(pairs, lambda p: F.concat(F.lit("["), p[0].cast("string"), F.lit(","), p[1].cast("string"), F.lit("]"))),
        " ",
    )


def _numbers(values: Column) -> Column:
    return F.array_join(F.transform(values, lambda v: v.cast("string")), ", ")


def _at(conn: Column, correlation: Column) -> Column:
    return F.concat(F.lit("(conn "), conn.cast("string"), F.lit(", correlation id "), correlation.cast("string"), F.lit(")"))


def _delivered_in(hazard: Column, broker_txn: Column) -> Column:
    return F.when(
        hazard == "stale_end_txn", F.concat(F.lit("delivered while broker txn "), broker_txn.cast("string"), F.lit(" was open"))
    ).otherwise(F.concat(
        F.lit("delivered in broker txn "), broker_txn.cast("string"),
        F.coalesce(F.concat(F.lit(" ("), hazard, F.lit(")")), F.lit("")),
    ))


def _end_txn_phrase(end: Column) -> Column:
    """'the EndTxn(commit) of client txn 4, duplicated by rule 'r' and delivered
    while broker txn 5 was open (conn 8, correlation id 15)' for one END_TXN struct."""
    kind = F.when(end["end_txn_commit"], F.lit("commit")).otherwise(F.lit("abort"))
    acted = _acted(end["rule"], end["action"])
    return F.concat(
        F.lit("the EndTxn("), kind, F.lit(") of client txn "), end["txn_client"].cast("string"),
        F.when(end["hazard"].isNotNull(), F.concat(
            F.lit(", "), F.coalesce(F.concat(acted, F.lit(" and ")), F.lit("")),
            _delivered_in(end["hazard"], end["txn_broker"]),
        )).otherwise(F.coalesce(F.concat(F.lit(", "), acted), F.lit(""))),
        F.lit(" "), _at(end["conn_id"], end["correlation_id"]),
    )


def _rules_involved(rules: Column) -> Column:
    return F.when(F.size(rules) > 0, F.concat(
        F.lit("; fault rules involved: "),
        F.array_join(F.transform(rules, lambda r: F.concat(F.lit("'"), r, F.lit("'"))), ", "),
    )).otherwise(F.lit(""))


def _end_txn_cause(stale: Column, deciding: Column | None, rules: Column) -> Column:
    """'; cause: <the stale EndTxns>' or, when no EndTxn with a hazard decided
    the records, what did (the deciding EndTxns, the rules involved)."""
    def phrases(ends: Column) -> Column:
        return F.array_join(F.transform(ends, _end_txn_phrase), "; and ")

    otherwise = F.lit("; no EndTxn with a hazard decided them")
    if deciding is not None:
        otherwise = F.concat(otherwise, F.when(
            F.size(deciding) > 0, F.concat(F.lit(" (they were decided by "), phrases(deciding), F.lit(")"))
        ).otherwise(F.lit("")))
    otherwise = F.concat(otherwise, _rules_involved(rules))
    return F.when(F.size(stale) > 0, F.concat(F.lit("; cause: "), phrases(stale))).otherwise(otherwise)


def _client_outcome(type_: Column, error: Column, f: Column | None = None) -> Column:
    ok = F.lit("client committed") if f is None else F.when(f == "txn", F.lit("client committed")).otherwise(
        F.lit("client acknowledged"))
    return (
        F.when(type_ == "ok", ok)
        .when((type_ == "fail") & (error == "aborted"), F.lit("client aborted"))
        .when(type_ == "fail", F.concat(F.lit("client failed: "), F.coalesce(error, F.lit("no error given"))))
        .otherwise(F.concat(F.lit("client outcome unknown: "), F.coalesce(error, F.lit("no error given"))))
    )


def history_sends(ops: DataFrame) -> DataFrame:
    """Completed send micro-ops with the key's topic/partition (from `create`
    ops, when the history has them) and the op's error."""
    mops = sends(flatten_mops(ops))
    errors = ops.select(F.col("index").alias("_index"), F.col("error"))
    where = key_partitions(ops).select(
        "key", F.col("topic").alias("key_topic"), F.col("partition").alias("key_partition")
    ).dropDuplicates(["key"])
    return (
        mops.join(errors, mops["index"] == errors["_index"], "left")
        .drop("_index")
        .join(where, "key", "left")
    )


def _sends_with_landings(sent: DataFrame, log: DataFrame) -> DataFrame:
    """Each completed send joined to where its (key, value) is in the log.
    Values are unique per key, so (key, value) names one write; the create
    mapping, when present, pins it to its topic-partition."""
    hs = sent.select(
        "index", "time", "process", "type", "f", "mop_index", "error", "key_topic", "key_partition",
        F.col("key").alias("h_key"), F.col("value").alias("h_value"), F.col("offset").alias("client_offset"),
    )
    joined = hs.join(log, (hs["h_key"] == log["key_long"]) & (hs["h_value"] == log["value_long"]), "left")
    placed = F.col("key_topic").isNull() | F.col("topic").isNull() | (
        (F.col("key_topic") == F.col("topic")) & (F.col("key_partition") == F.col("partition"))
    )
    # A late Produce copy of a write that also landed in its own transaction
    # is a second landing whose fate is its later transaction's (late-produce
    # reports it): it says nothing about the transaction the client meant.
    write = Window.partitionBy("index", "mop_index")
    proper = F.sum(F.when(F.col("offset").isNotNull() & F.col("produce_hazard").isNull(), 1).otherwise(0)).over(write)
    late_copy = (F.col("produce_hazard") == "late_produce") & (proper > 0)
    return (joined.where(placed).withColumn("_late_copy", F.coalesce(late_copy, F.lit(False)))
            .where(~F.col("_late_copy")).drop("_late_copy"))


def _stale(col_prefix: str = "end_") -> F.Column:
    return F.col(f"{col_prefix}hazard").isNotNull()


def _fate_summary(grouped_by: list[str], rows: DataFrame, extra: list[F.Column]) -> DataFrame:
    """Per group: which values met which fate and which EndTxns decided them."""
    pair = F.array(F.col("key_long"), F.col("value_long"))
    return rows.groupBy(*grouped_by).agg(
        F.array_sort(F.collect_set(F.when(F.col("fate") == "committed", pair))).alias("committed"),
        F.array_sort(F.collect_set(F.when(F.col("fate") == "aborted", pair))).alias("aborted"),
        F.array_sort(F.collect_set(F.when(F.col("fate") == "unknown", pair))).alias("unknown"),
        # Sorted: a set's order is its rows' order, which the plan decides.
        F.array_sort(F.collect_set(F.when(_stale() & F.col("end_conn_id").isNotNull(), _END_TXN))).alias("stale_end_txns"),
        F.array_sort(F.collect_set(F.when(F.col("end_conn_id").isNotNull(), _END_TXN))).alias("end_txns"),
        F.array_sort(F.collect_set("txn_client")).alias("txn_clients"),
        F.array_sort(F.collect_set("txn_broker")).alias("txn_brokers"),
        F.array_sort(
            F.array_union(
                F.collect_set(F.when(_stale(), F.col("end_rule"))),
                F.collect_set(F.col("produce_rule")),
            )
        ).alias("rules"),
        *extra,
    )


def torn_transactions(sent: DataFrame, log: DataFrame) -> DataFrame:
    """Client transactions whose records met different fates (some
    committed, some aborted). A transaction is a history `txn` op; records
    of a transactional producer that no history op claims are grouped by
    the producer's client-side synthetic number instead."""
    claimed = _sends_with_landings(sent, log).where((F.col("f") == "txn") & F.col("offset").isNotNull())
    by_op = _fate_summary(
        ["index"],
        claimed,
        [
            F.first("process").alias("process"),
            F.first("type").alias("client_type"),
            F.first("error").alias("client_error"),
            F.first("time").alias("time"),
            F.first("txn_id").alias("transactional_id"),
            F.first("txn_pid").alias("producer_id"),
        ],
    ).withColumn("source", F.lit("history"))

    history_pairs = sent.select(F.col("key").alias("key_long"), F.col("value").alias("value_long"))
    unclaimed = log.join(history_pairs, ["key_long", "value_long"], "left_anti").where(
        F.col("txn_client").isNotNull() & (F.col("txn_id") != "")
    )
    by_wire_txn = _fate_summary(
        ["txn_id", "txn_pid", "txn_epoch", "txn_client"],
        unclaimed,
        [F.min("produce_conn_id").alias("produce_conn_id")],
    ).select(
        F.lit(None).cast("long").alias("index"),
        F.lit(None).cast("long").alias("process"),
        F.lit(None).cast("string").alias("client_type"),
        F.lit(None).cast("string").alias("client_error"),
        F.lit(None).cast("long").alias("time"),
        F.col("txn_id").alias("transactional_id"),
        F.col("txn_pid").alias("producer_id"),
        "committed", "aborted", "unknown", "stale_end_txns", "end_txns", "txn_clients", "txn_brokers", "rules",
        F.lit("wire").alias("source"),
    )
    both = by_op.unionByName(by_wire_txn)
    torn = both.where((F.size("committed") > 0) & (F.size("aborted") > 0))
    which = F.when(
        F.col("source") == "history",
        F.format_string("txn op %s (process %s, %s, %s)", "index", "process", "transactional_id",
                        _client_outcome(F.col("client_type"), F.col("client_error"))),
    ).otherwise(F.format_string(
        "client txn %s of %s (producer %s, in no history op)", _numbers(F.col("txn_clients")),
        "transactional_id", "producer_id",
    ))
    return torn.withColumn(
        "explanation",
        F.concat(
            which, F.lit(": records "), _pairs(F.col("committed")), F.lit(" committed but "),
            _pairs(F.col("aborted")), F.lit(" aborted"),
            F.when(F.size("unknown") > 0, F.concat(F.lit(", and "), _pairs(F.col("unknown")), F.lit(" of unknown fate")))
            .otherwise(F.lit("")),
            _end_txn_cause(F.col("stale_end_txns"), F.col("end_txns"), F.col("rules")),
        ),
    )


def _mismatch_explanation() -> Column:
    def also(word: str, col: str) -> Column:
        return F.when(F.size(col) > 0, F.concat(F.lit(f" (and {word} "), _pairs(F.col(col)), F.lit(")"))).otherwise(F.lit(""))

    said = F.format_string("%s op %s (process %s, %s)", "f", "index", "process",
                           _client_outcome(F.col("client_type"), F.col("client_error"), F.col("f")))
    wire = F.when(
        F.col("direction") == "client-fail-wire-committed",
        F.concat(F.lit(" but the wire committed "), _pairs(F.col("committed")), also("aborted", "aborted")),
    ).otherwise(F.concat(F.lit(" but the wire aborted "), _pairs(F.col("aborted")), also("committed", "committed")))
    # A plain send has no EndTxn to blame: only the rules involved can speak for it.
    cause = F.when(F.col("f") == "txn", _end_txn_cause(F.col("stale_end_txns"), None, F.col("rules"))).otherwise(
        _rules_involved(F.col("rules")))
    return F.concat(said, wire, cause)


def client_outcome_mismatches(sent: DataFrame, log: DataFrame) -> DataFrame:
    """Ops whose client outcome contradicts the wire, both ways:
    `client-fail-wire-committed` (a definite failure or abort whose values
    committed) and `client-ok-wire-aborted` (an ok whose values aborted)."""
    landed = _sends_with_landings(sent, log).where(
        F.col("f").isin("send", "txn") & F.col("type").isin("ok", "fail") & F.col("offset").isNotNull()
    )
    summary = _fate_summary(
        ["index"],
        landed,
        [
            F.first("process").alias("process"),
            F.first("f").alias("f"),
            F.first("type").alias("client_type"),
            F.first("error").alias("client_error"),
            F.first("time").alias("time"),
        ],
    )
    direction = (
        F.when((F.col("client_type") == "fail") & (F.size("committed") > 0), "client-fail-wire-committed")
        .when((F.col("client_type") == "ok") & (F.size("aborted") > 0), "client-ok-wire-aborted")
    )
    return (
        summary.withColumn("direction", direction)
        .where(F.col("direction").isNotNull())
        .select("index", "time", "process", "f", "client_type", "client_error", "direction",
                "committed", "aborted", "txn_clients", "txn_brokers", "stale_end_txns", "rules",
                _mismatch_explanation().alias("explanation"))
    )


def _attempts_by_write(attempts: DataFrame) -> DataFrame:
    """Per written (key, value): how its Produce attempts were answered."""
    return attempts.groupBy("key_long", "value_long").agg(
        F.max((F.col("status") == "ok").cast("int")).alias("any_ok"),
        F.max((F.col("status") == "error").cast("int")).alias("any_error"),
        F.array_sort(F.collect_set(F.when(F.col("status") == "error", F.col("response_error")))).alias("error_codes"),
        F.array_sort(F.collect_set(
            F.when(
                F.col("status") == "error",
                F.struct("conn_id", "correlation_id", "copy", "topic", "partition", "rule", "action", "outcome", "response_error"),
            )
        )).alias("errored_produces"),
        F.array_sort(F.collect_set(F.when(F.col("status") == "error", F.col("rule")))).alias("rules"),
    )


def spurious_offsets(sent: DataFrame, attempts: DataFrame) -> DataFrame:
    """Sends the client reported at an offset while every traced Produce of
    that write (`attempts`: kproxy_spark.traces.produce_attempts) was answered with
    an error."""
    reported = sent.where(F.col("offset").isNotNull() & F.col("type").isin("ok", "info"))
    answers = _attempts_by_write(attempts)
    joined = reported.join(
        answers, (reported["key"] == answers["key_long"]) & (reported["value"] == answers["value_long"])
    )
    return joined.where((F.col("any_error") == 1) & (F.col("any_ok") == 0)).select(
        "index", "time", "process", "type", "key", "value", F.col("offset").alias("client_offset"),
        "error_codes", "errored_produces", "rules",
        F.concat(
            F.format_string("op %s (process %s) reported key %s value %s at offset %s, but every Produce of it was"
                            " answered with an error (%s)", "index", "process", "key", "value", "offset",
                            _errors(F.col("error_codes"))),
            _rules_involved(F.col("rules")),
        ).alias("explanation"),
    )


def ambiguous_errors(sent: DataFrame, attempts: DataFrame, fetched: DataFrame) -> DataFrame:
    """Writes whose every Produce was answered with an error, yet which a
    Fetch (`fetched`: kproxy_spark.traces.fetched_records) later returned: the
    error did not mean "not written"."""
    answers = _attempts_by_write(attempts).where((F.col("any_error") == 1) & (F.col("any_ok") == 0))
    reads = fetched.where(F.col("control").isNull()).groupBy(
        "key_long", "value_long", "topic", "partition"
    ).agg(F.array_sort(F.collect_set("offset")).alias("read_offsets"))
    client = sent.select(
        F.col("key").alias("key_long"), F.col("value").alias("value_long"),
        F.col("index"), F.col("type").alias("client_type"), F.col("error").alias("client_error"),
    )
    return (
        answers.join(reads, ["key_long", "value_long"])
        .join(client, ["key_long", "value_long"], "left")
        .select(
            "index", "client_type", "client_error",
            F.col("key_long").alias("key"), F.col("value_long").alias("value"),
            "topic", "partition", "read_offsets", "error_codes", "errored_produces", "rules",
            F.concat(
                F.format_string("every Produce of key %s value %s was answered with an error (%s), yet a Fetch read it"
                                " from %s partition %s at offset %s; the client saw %s",
                                "key_long", "value_long", _errors(F.col("error_codes")), "topic", "partition",
                                _numbers(F.col("read_offsets")),
                                F.coalesce(F.concat(F.lit("op "), F.col("index").cast("string"), F.lit(" "),
                                                    F.col("client_type"),
                                                    F.coalesce(F.concat(F.lit(" ("), "client_error", F.lit(")")),
                                                               F.lit(""))),
                                           F.lit("no history op for it"))),
                _rules_involved(F.col("rules")),
            ).alias("explanation"),
        )
    )


def stale_end_txns(traces: DataFrame, ends: DataFrame | None = None) -> DataFrame:
    """Every delivered EndTxn whose numbers disagreed at delivery (a hazard).
    `ends`: end_txns(traces), when the caller holds it."""
    return (
        (end_txns(traces) if ends is None else ends)
        .where(F.col("delivered") & F.col("hazard").isNotNull())
        .select(
            "proxy_id", "conn_id", "correlation_id", "copy", "mono_ns", "transactional_id",
            F.col("txn_pid").alias("producer_id"), F.col("txn_epoch").alias("producer_epoch"),
            "txn_client", "txn_broker", "end_txn_commit", "hazard", "rule", "action", "outcome",
            "response_error_code", F.array_compact(F.array("rule")).alias("rules"),
            F.concat(
                F.format_string("EndTxn(%s) of client txn %s from %s (producer %s, epoch %s), ",
                                F.when(F.col("end_txn_commit"), "commit").otherwise("abort"), "txn_client",
                                "transactional_id", "txn_pid", "txn_epoch"),
                F.coalesce(F.concat(_acted(F.col("rule"), F.col("action")), F.lit(" and ")), F.lit("")),
                _delivered_in(F.col("hazard"), F.col("txn_broker")), F.lit(" "),
                _at(F.col("conn_id"), F.col("correlation_id")),
                F.when(F.col("response_error_code").isNull(), F.lit("; no response was traced"))
                .when(F.col("response_error_code") == 0, F.lit("; the broker accepted it"))
                .otherwise(F.concat(F.lit("; the broker answered "), _error(F.col("response_error_code")))),
            ).alias("explanation"),
        )
    )


def late_produces(attempts: DataFrame, log: DataFrame) -> DataFrame:
    """Every delivered Produce that slid into a later broker-side
    transaction, with the fate of what it landed (`landed_fates`): a copy
    that lands in a transaction which then aborts is an aborted duplicate,
    not a torn transaction of the one it was sent in."""
    attempts = attempts.where(
        (F.col("status") != "not-delivered") & (F.col("hazard") == "late_produce")
    )
    fates = log.select("topic", "partition", F.col("offset").alias("landed_offset"), F.col("fate").alias("landed_fate"))
    attempts = attempts.join(fates, ["topic", "partition", "landed_offset"], "left")
    return (
        attempts.groupBy("proxy_id", "conn_id", "correlation_id", "copy")
        .agg(
            F.min("mono_ns").alias("mono_ns"),
            F.first("transactional_id").alias("transactional_id"),
            F.first("txn_pid").alias("producer_id"),
            F.first("txn_client").alias("txn_client"),
            F.first("txn_broker").alias("txn_broker"),
            F.first("rule").alias("rule"),
            F.first("action").alias("action"),
            F.first("outcome").alias("outcome"),
            F.array_sort(F.collect_list(F.array("key_long", "value_long"))).alias("records"),
            F.array_sort(F.collect_set("landed_offset")).alias("landed_offsets"),
            F.array_sort(F.collect_set("landed_fate")).alias("landed_fates"),
            F.first("lost_reason", ignorenulls=True).alias("lost_reason"),
        )
        .withColumn("rules", F.array_compact(F.array("rule")))
        .withColumn("explanation", F.concat(
            F.format_string("Produce of records %s in client txn %s of %s (producer %s), ",
                            _pairs(F.col("records")), "txn_client", "transactional_id", "producer_id"),
            F.coalesce(F.concat(_acted(F.col("rule"), F.col("action")), F.lit(" and ")), F.lit("")),
            # The tracker's three kinds of late Produce (kproxy/txn/machine.py), by their numbers.
            F.when(F.col("txn_client") < F.col("txn_broker"),
                   F.format_string("delivered while broker txn %s was open", "txn_broker"))
            .when(F.col("txn_client") == F.col("txn_broker"),
                  F.format_string("delivered after an EndTxn of client txn %s had reached the broker, into broker txn %s",
                                  "txn_client", "txn_broker"))
            .otherwise(F.format_string("delivered into broker txn %s, whose EndTxn had not reached the broker yet",
                                       "txn_broker")),
            F.lit(" "), _at(F.col("conn_id"), F.col("correlation_id")),
            F.when(F.size("landed_offsets") == 1, F.concat(F.lit(", landed at offset "), _numbers(F.col("landed_offsets"))))
            .when(F.size("landed_offsets") > 1, F.concat(F.lit(", landed at offsets "), _numbers(F.col("landed_offsets"))))
            .otherwise(F.concat(F.lit(", did not land ("),
                                F.coalesce(F.col("lost_reason"), F.lit("error or no response")), F.lit(")"))),
            F.when(F.size("landed_fates") > 0, F.concat(
                F.lit(" in a transaction that "),
                F.array_join(F.transform("landed_fates", lambda f: F.when(f == "committed", F.lit("committed"))
                                         .when(f == "aborted", F.lit("aborted")).otherwise(F.lit("is undecided"))),
                             " / "),
                F.when(F.col("copy") > 0, F.lit(" (a copy the proxy delivered; the client's own request is traced"
                                                " separately)")).otherwise(F.lit("")),
            )).otherwise(F.lit("")),
        ))
    )


def _served(fetched: DataFrame, log: DataFrame) -> DataFrame:
    """Data records served to read_committed fetches, with their fate in the
    log. A broker is judged by its own log: where the trace shows the
    producer's next marker after the record, that marker is its fate here
    (not an aborted-transactions entry, which is what is being judged)."""
    fates = log.select("topic", "partition", "offset", F.coalesce("next_marker_fate", "fate").alias("fate"),
                       "fate_source")
    return fetched.where(F.col("read_committed") & F.col("control").isNull()).join(
        fates, ["topic", "partition", "offset"])


def _by_response(rows: DataFrame, rule_caused: Column, extra: list[Column]) -> DataFrame:
    """One case per fetch response partition: its records and, when a rule's
    rewrite is what made them so (`rule_caused`), that rule."""
    return rows.groupBy("proxy_id", "conn_id", "correlation_id", "copy", "topic", "partition").agg(
        F.min("mono_ns").alias("mono_ns"),
        F.first("client_id").alias("client_id"),
        F.count(F.lit(1)).alias("record_count"),
        F.array_sort(F.collect_set("offset")).alias("offsets"),
        F.array_sort(F.collect_set(F.array("key_long", "value_long"))).alias("records"),
        F.array_sort(F.collect_set("producer_id")).alias("producer_ids"),
        F.first("last_stable_offset").alias("last_stable_offset"),
        F.first("rule", ignorenulls=True).alias("response_rule"),
        F.first("action", ignorenulls=True).alias("response_action"),
        F.array_sort(F.collect_set(F.when(rule_caused, F.col("rule")))).alias("rules"),
        *extra,
    )


def _who(what: str) -> Column:
    """'; the broker sent them' or the rule whose rewrite made them so."""
    return F.when(F.size("rules") > 0, F.concat(
        F.lit(f"; {what} because rule '"), F.array_join("rules", "', '"),
        F.lit("' rewrote the broker's response"))).otherwise(F.lit("; the broker's own response"))


def broker_aborted_reads(fetched: DataFrame, log: DataFrame) -> DataFrame:
    """read_committed Fetch responses that returned records of aborted
    transactions which their aborted-transactions list does not cover (one
    case per fetch response partition): the client has nothing to drop them
    by (broker diagnosis `aborted-txn-not-listed`). Covered ones are how
    Kafka serves read_committed and are no anomaly. A rule is the cause only
    when the broker's own response covered them and the rule's rewrite
    removed that (upstream_listed_aborted)."""
    aborted = _served(fetched, log).where((F.col("fate") == "aborted") & ~F.col("listed_aborted"))
    return _by_response(aborted, F.coalesce(F.col("upstream_listed_aborted"), F.lit(False)), [
        F.array_sort(F.collect_set("fate_source")).alias("known_by"),
    ]).withColumnRenamed("record_count", "aborted_records").withColumn("explanation", F.concat(
        F.lit("a read_committed Fetch"), F.coalesce(F.concat(F.lit(" by "), "client_id"), F.lit("")), F.lit(" "),
        _at(F.col("conn_id"), F.col("correlation_id")),
        F.format_string(" returned %s record(s) of aborted transactions: topic %s partition %s at offset(s) %s"
                        " (aborted per %s), and its aborted-transactions list covers none of them",
                        "aborted_records", "topic", "partition", _numbers(F.col("offsets")),
                        F.array_join(F.transform("known_by", lambda k: F.when(k == "end_txn", F.lit("the EndTxn"))
                                                 .when(k == "marker", F.lit("the log's markers")).otherwise(k)),
                                     " and ")),
        _who("uncovered"),
    ))


def stale_aborted_entries(fetched: DataFrame, log: DataFrame) -> DataFrame:
    """read_committed Fetch responses whose aborted-transactions list covers
    records of committed transactions (broker diagnosis
    `stale-aborted-entry`): an entry whose transaction ended before these
    records, with no ABORT marker of the producer in between, so the client
    drops committed records. Kafka lists only aborted transactions that
    overlap the fetched range."""
    dropped = _served(fetched, log).where((F.col("fate") == "committed") & F.col("listed_aborted"))
    covering = F.filter(F.coalesce(F.col("aborted_transactions"), F.array()),
                        lambda a: a["producer_id"] == F.col("producer_id"))
    return _by_response(dropped, ~F.coalesce(F.col("upstream_listed_aborted"), F.lit(True)), [
        F.array_sort(F.flatten(F.collect_set(F.transform(covering, lambda a: a["first_offset"]))))
        .alias("listed_first_offsets"),
    ]).withColumnRenamed("record_count", "committed_records").withColumn("explanation", F.concat(
        F.lit("a read_committed Fetch"), F.coalesce(F.concat(F.lit(" by "), "client_id"), F.lit("")), F.lit(" "),
        _at(F.col("conn_id"), F.col("correlation_id")),
        F.format_string(" returned %s committed record(s) of topic %s partition %s at offset(s) %s, yet listed"
                        " their producer(s) %s as aborted from offset(s) %s with no abort marker in between,"
                        " so the client drops them",
                        "committed_records", "topic", "partition", _numbers(F.col("offsets")),
                        _numbers(F.col("producer_ids")), _numbers(F.col("listed_first_offsets"))),
        _who("listed"),
    ))


def past_lso_reads(fetched: DataFrame, log: DataFrame) -> DataFrame:
    """read_committed Fetch responses that returned records at or beyond
    their own last stable offset (broker diagnosis `past-last-stable-offset`):
    records of transactions not yet decided when the response was sent."""
    past = _served(fetched, log).where(F.col("past_lso"))
    return _by_response(past, ~F.coalesce(F.col("upstream_past_lso"), F.lit(True)), [
        F.array_sort(F.collect_set("fate")).alias("fates"),
    ]).withColumnRenamed("record_count", "past_records").withColumn("explanation", F.concat(
        F.lit("a read_committed Fetch"), F.coalesce(F.concat(F.lit(" by "), "client_id"), F.lit("")), F.lit(" "),
        _at(F.col("conn_id"), F.col("correlation_id")),
        F.format_string(" returned %s record(s) of topic %s partition %s at offset(s) %s, at or beyond its own"
                        " last stable offset %s", "past_records", "topic", "partition", _numbers(F.col("offsets")),
                        "last_stable_offset"),
        _who("past it"),
    ))


#: A gap wider than this in one response is read as this many offsets: a
#: compacted or truncated range says nothing more per offset, and the
#: explode must stay bounded.
MAX_GAP = 1000


def _left_out(fetched: DataFrame, log: DataFrame) -> DataFrame:
    """Per record: committed data records a read_committed Fetch response
    skipped over, inside a gap between two offsets it did serve (responses a
    rule rewrote are left to the rule's own `removed-by-rule`)."""
    parts = fetched.where(F.col("read_committed") & ~F.coalesce("rewritten", F.lit(False))).groupBy(
        *EXCHANGE, "topic", "partition").agg(
        F.min("mono_ns").alias("mono_ns"), F.first("client_id").alias("client_id"),
        F.array_sort(F.collect_set("offset")).alias("served"))
    served = F.col("served")
    gaps = F.when(F.size(served) >= 2, F.flatten(F.transform(
        F.sequence(F.lit(1), F.size(served) - 1),
        lambda i: F.when(served[i] - served[i - 1] > 1,
                         F.sequence(served[i - 1] + 1, F.least(served[i] - 1, served[i - 1] + MAX_GAP)))
        .otherwise(F.array().cast("array<bigint>")),
    ))).otherwise(F.array().cast("array<bigint>"))
    missing = parts.select(*EXCHANGE, "topic", "partition", "mono_ns", "client_id",
                           F.explode(gaps).alias("offset"))
    committed = log.where(F.col("key_long").isNotNull()).select(
        "topic", "partition", "offset", "key_long", "value_long", "producer_id",
        F.coalesce("next_marker_fate", "fate").alias("fate"))
    return missing.join(committed, ["topic", "partition", "offset"]).where(F.col("fate") == "committed")


def left_out_records(fetched: DataFrame, log: DataFrame) -> DataFrame:
    """read_committed Fetch responses that skipped committed records in the
    middle of what they served (broker diagnosis `records-left-out`): no
    control batch, abort or rule explains the gap, and the client, handed the
    records after it, moves past them. One case per response partition."""
    rows = _left_out(fetched, log)
    return rows.groupBy(*EXCHANGE, "topic", "partition").agg(
        F.min("mono_ns").alias("mono_ns"), F.first("client_id").alias("client_id"),
        F.count(F.lit(1)).alias("left_out"),
        F.array_sort(F.collect_set("offset")).alias("offsets"),
        F.array_sort(F.collect_set(F.array("key_long", "value_long"))).alias("records"),
        F.array().cast("array<string>").alias("rules"),
    ).withColumn("explanation", F.concat(
        F.lit("a read_committed Fetch"), F.coalesce(F.concat(F.lit(" by "), "client_id"), F.lit("")), F.lit(" "),
        _at(F.col("conn_id"), F.col("correlation_id")),
        F.format_string(" left out %s committed record(s) of topic %s partition %s at offset(s) %s, between"
                        " records it did serve; the broker's own response", "left_out", "topic", "partition",
                        _numbers(F.col("offsets"))),
    ))


#: What the driver needs to tie a history case to the wire (kproxy_spark.attribution):
#: per written (key, value), every wire fact that explains why a client saw
#: it, missed it or saw its fate differ from what it was told.
VALUE_FACT_COLUMNS = ("key", "value", "fact", "rule", "topic", "partition", "offset", "conn_id", "correlation_id",
                      "detail", "evidence")


def cut_off_records(log: DataFrame, ends: DataFrame) -> DataFrame:
    """Traced records a rule's stale EndTxn cut off from their own
    transaction: the stale EndTxn, of the same producer, was answered after
    the producer's previous own EndTxn reached the broker and before the
    record's Produce did, so it ended the record's transaction early; the
    record landed after that end, the client's own EndTxn (the next one
    delivered) did not reach it, and the log gave it another fate than that
    EndTxn's: its producer's next marker in the partition, or an
    aborted-transactions entry covering it (noida-db: the next transaction's
    ABORT, so a committed write is dropped; docs/analysis.md, "Causes").

    One row per record, the latest such stale EndTxn, with `log_fate` and
    the ids of the Produce, the stale EndTxn and the client's own EndTxn."""
    ok = F.col("delivered") & (F.col("response_error_code").isNull() | (F.col("response_error_code") == 0))
    told = F.when(F.col("end_end_txn_commit"), "committed").when(~F.col("end_end_txn_commit"), "aborted")
    records = log.where(
        F.col("produce_delivery_ns").isNotNull() & F.col("end_hazard").isNull() & F.col("marker_fate").isNotNull()
        & told.isNotNull() & (F.col("marker_fate") != told)
    ).select(*TXN_KEY, "topic", "partition", "offset", "key_long", "value_long", "produce_delivery_ns",
             "produce_conn_id", "produce_correlation_id", "end_conn_id", "end_correlation_id", "end_end_txn_commit",
             F.col("marker_fate").alias("log_fate"), F.col("next_marker_fate").isNotNull().alias("by_marker"))
    own = ends.where(ok & F.col("hazard").isNull()).select(*TXN_KEY, F.col("delivery_ns").alias("own_ns"))
    began = records.join(own, list(TXN_KEY)).where(F.col("own_ns") < F.col("produce_delivery_ns")).groupBy(
        "topic", "partition", "offset").agg(F.max("own_ns").alias("began_ns"))
    stale = ends.where(ok & F.col("hazard").isNotNull() & F.col("rule").isNotNull() & F.col("response_ns").isNotNull())
    stale = stale.select(*TXN_KEY, F.struct(
        F.col("response_ns").alias("answered_ns"), F.col("conn_id").alias("conn_id"),
        F.col("correlation_id").alias("correlation_id"), F.col("copy").alias("copy"),
        F.col("end_txn_commit").alias("commit"), F.col("rule").alias("rule")).alias("stale"))
    cut = records.join(began, ["topic", "partition", "offset"], "left").join(stale, list(TXN_KEY)).where(
        (F.col("stale.answered_ns") < F.col("produce_delivery_ns"))
        & (F.col("began_ns").isNull() | (F.col("stale.answered_ns") > F.col("began_ns"))))
    return cut.groupBy(*[c for c in records.columns if c not in TXN_KEY]).agg(
        F.max_by("stale", "stale.answered_ns").alias("stale"))


def _cut_off_evidence() -> Column:
    def verb(commit: Column) -> Column:
        return F.when(commit, F.lit("commit")).otherwise(F.lit("abort"))

    return F.concat(
        F.format_string("its Produce (conn %d, correlation id %d) reached the broker after the stale EndTxn(",
                        "produce_conn_id", "produce_correlation_id"),
        verb(F.col("stale.commit")),
        F.format_string(") (conn %d, correlation id %d, copy %d) had ended its producer's transaction there, so the"
                        " client's own EndTxn(", "stale.conn_id", "stale.correlation_id", "stale.copy"),
        verb(F.col("end_end_txn_commit")),
        F.format_string(") (conn %d, correlation id %d) did not reach it, and ", "end_conn_id", "end_correlation_id"),
        F.when(F.col("by_marker"), F.format_string(
            "its producer's next marker in %s[%d] after offset %d %s it", "topic", "partition", "offset",
            F.when(F.col("log_fate") == "aborted", F.lit("aborted")).otherwise(F.lit("committed"))))
        .otherwise(F.format_string("an aborted-transactions entry covers it at %s[%d] offset %d",
                                   "topic", "partition", "offset")),
    )


def value_facts(fetched: DataFrame, log: DataFrame, removed: DataFrame, ends: DataFrame | None = None) -> DataFrame:
    """Rows (VALUE_FACT_COLUMNS) of the facts kproxy_spark.attribution reads:

    * ``stale-end-txn``: the EndTxn that decided the record was stale (rule:
      the rule that delivered it), detail its fate;
    * ``late-produce``: the record's Produce landed in a later transaction;
    * ``aborted-txn-not-listed`` / ``stale-aborted-entry``: a
      read_committed response served it so (rule: the rewriting rule when its
      rewrite made it so); ``past-last-stable-offset``: the broker's own
      response served it beyond its LSO;
    * ``removed-by-rule``: a rule took it out of a Fetch response;
    * ``cut-off-by-stale-end-txn``: a rule's stale EndTxn ended its
      transaction before its Produce arrived and the log decided it otherwise
      than the client's own EndTxn (cut_off_records; detail: the log's fate,
      at: the stale EndTxn, evidence: the exchanges that show it). Needs `ends`.
    """
    def pick(frame: DataFrame, fact: str, rule: Column, detail: Column, evidence: Column | None = None,
             at: tuple[Column, Column] | None = None) -> DataFrame:
        conn, correlation = at or [F.col(c) if c in frame.columns else F.lit(None) for c in ("conn_id", "correlation_id")]
        return frame.select(
            F.col("key_long").alias("key"), F.col("value_long").alias("value"), F.lit(fact).alias("fact"),
            rule.alias("rule"), "topic", "partition", "offset",
            conn.cast("long").alias("conn_id"), correlation.cast("long").alias("correlation_id"),
            detail.cast("string").alias("detail"),
            (F.lit(None) if evidence is None else evidence).cast("string").alias("evidence"),
        )

    landed = log.where(F.col("key_long").isNotNull() & F.col("value_long").isNotNull())
    served = _served(fetched, log).where(F.col("key_long").isNotNull() & F.col("value_long").isNotNull())
    parts = [
        pick(landed.where(F.col("end_hazard").isNotNull()), "stale-end-txn", F.col("end_rule"), F.col("fate")),
        pick(landed.where(F.col("produce_hazard").isNotNull()), "late-produce", F.col("produce_rule"), F.col("fate")),
        pick(served.where((F.col("fate") == "aborted") & ~F.col("listed_aborted")), "aborted-txn-not-listed",
             F.when(F.coalesce("upstream_listed_aborted", F.lit(False)), F.col("rule")), F.col("client_id")),
        pick(served.where((F.col("fate") == "committed") & F.col("listed_aborted")), "stale-aborted-entry",
             F.when(~F.coalesce("upstream_listed_aborted", F.lit(True)), F.col("rule")), F.col("client_id")),
        # Only the broker's own: a rule that lowers the LSO changes a number,
        # not which records the client gets, so it explains no read.
        pick(served.where(F.col("past_lso") & F.coalesce("upstream_past_lso", F.lit(True))),
             "past-last-stable-offset", F.lit(None).cast("string"), F.col("client_id")),
        pick(removed.where(F.col("control").isNull() & F.col("key_long").isNotNull()), "removed-by-rule",
             F.col("rule"), F.col("client_id")),
        pick(landed.where(F.col("produce_copy") > 0), "copy-landed", F.col("produce_rule"), F.col("fate")),
        pick(_left_out(fetched, log), "records-left-out", F.lit(None).cast("string"), F.col("client_id")),
    ]
    if ends is not None:
        cut = cut_off_records(log, ends).where(F.col("key_long").isNotNull() & F.col("value_long").isNotNull())
        parts.append(pick(cut, "cut-off-by-stale-end-txn", F.col("stale.rule"), F.col("log_fate"), _cut_off_evidence(),
                          at=(F.col("stale.conn_id"), F.col("stale.correlation_id"))))
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    # One row per value, fact and rule: the first place it was seen says where.
    return union.groupBy("key", "value", "fact", "rule").agg(
        *[F.min_by(c, F.struct("offset", "conn_id", "correlation_id")).alias(c)
          for c in ("topic", "partition", "offset", "conn_id", "correlation_id", "detail", "evidence")]
    )


def latency(traces: DataFrame) -> DataFrame:
    """Per API: responses, p50/p95/p99/max of client-seen and upstream latency."""
    responses = traces.where((F.col("direction") == "response") & F.col("latency_ms").isNotNull())
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


def rule_touches(traces: DataFrame) -> DataFrame:
    """Per rule: the exchanges it touched (request rules and response rules
    alike), with its actions, the APIs, the outcomes and the error codes
    the clients got back on those exchanges."""
    touched = traces.fillna({"proxy_id": "", "copy": 0}).where(F.col("rule").isNotNull())
    return touched.groupBy("rule").agg(
        F.count_distinct(*EXCHANGE).alias("events"),
        F.array_sort(F.collect_set("action")).alias("actions"),
        F.array_sort(F.collect_set("api")).alias("apis"),
        F.array_sort(F.collect_set("direction")).alias("directions"),
        F.array_sort(F.collect_set("outcome")).alias("outcomes"),
        F.array_sort(F.array_distinct(F.flatten(F.collect_list(
            F.when(F.col("direction") == "response", F.coalesce("error_codes", F.array().cast("array<int>")))
            .otherwise(F.array().cast("array<int>")))))).alias("error_codes"),
    )


def rule_writes(sent: DataFrame, attempts: DataFrame, log: DataFrame) -> DataFrame:
    """Per rule that touched Produce requests: the writes it touched, how
    often each landed in the log, and what the client said of them."""
    touched = attempts.where(F.col("rule").isNotNull() & F.col("key_long").isNotNull()).select(
        "rule", "key_long", "value_long").distinct()
    landed = log.where(F.col("key_long").isNotNull()).groupBy("key_long", "value_long").agg(
        F.count(F.lit(1)).alias("landings"),
        F.sum((F.col("fate") == "committed").cast("int")).alias("committed"),
    )
    said = sent.groupBy(F.col("key").alias("key_long"), F.col("value").alias("value_long")).agg(
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


def fault_impact(touches: list[dict], cases: dict[str, list[dict]]) -> list[dict]:
    """Per rule: how many events it touched (and with which actions), and how
    many cases of each anomaly point at it. Rules that fired without any
    attributed anomaly appear with anomaly null; a rule named by cases but
    not traced appears with no actions and 0 events.

    Computed on the driver from the collected cases: in Spark it would run
    every check's plan a second time.
    """
    attributed: dict[tuple[str, str], int] = {}
    for name, found in cases.items():
        for case in found:
            for rule in case.get("rules") or ():
                attributed[(rule, name)] = attributed.get((rule, name), 0) + 1
    touched = {t["rule"]: t for t in touches}
    rows = [
        {"rule": rule, "actions": touched.get(rule, {}).get("actions"), "events": touched.get(rule, {}).get("events", 0),
         "anomaly": anomaly, "cases": n}
        for (rule, anomaly), n in attributed.items()
    ]
    named = {rule for rule, _ in attributed}
    rows += [
        {"rule": rule, "actions": t["actions"], "events": t["events"], "anomaly": None, "cases": 0}
        for rule, t in touched.items() if rule not in named
    ]
    return sorted(rows, key=_order_key((("rule", False), ("anomaly", False))))


def clock_offset(ops: DataFrame, traces: DataFrame, sent: DataFrame | None = None,
                 attempts: DataFrame | None = None) -> DataFrame:
    """One row, d: history time minus trace monotonic time, estimated from
    acknowledged sends (their completion follows the Produce response
    closely), so plots can put wire events and history ops on one axis. Null
    when nothing joins."""
    sent = history_sends(ops) if sent is None else sent
    attempts = produce_attempts(traces) if attempts is None else attempts
    acked = sent.where((F.col("type") == "ok") & F.col("offset").isNotNull())
    attempts = attempts.where(F.col("status") == "ok").groupBy("key_long", "value_long").agg(
        F.min("mono_ns").alias("mono_ns")
    )
    joined = acked.join(attempts, (acked["key"] == attempts["key_long"]) & (acked["value"] == attempts["value_long"]))
    return joined.agg(F.percentile_approx(F.col("time") - F.col("mono_ns"), 0.5, 1000).alias("d"))


#: How each wire table is ordered in the report: (field, nulls last?) pairs.
#: The tables themselves are unordered: a global sort in Spark samples its
#: input in a job of its own, and the driver orders these few rows anyway.
WIRE_ORDER = {
    "torn-transaction": (("index", True), ("transactional_id", False)),
    "client-outcome-mismatch": (("index", False),),
    "spurious-offset": (("index", False), ("key", False)),
    "ambiguous-error": (("key", False), ("value", False)),
    "stale-end-txn": (("mono_ns", False), ("conn_id", False), ("correlation_id", False), ("copy", False)),
    "late-produce": (("mono_ns", False), ("conn_id", False), ("correlation_id", False), ("copy", False)),
    "broker-aborted-read": (("mono_ns", False), ("conn_id", False), ("correlation_id", False)),
    "stale-aborted-entry": (("mono_ns", False), ("conn_id", False), ("correlation_id", False)),
    "past-lso-read": (("mono_ns", False), ("conn_id", False), ("correlation_id", False)),
    "left-out-records": (("mono_ns", False), ("conn_id", False), ("correlation_id", False)),
    "~value-facts": (("key", False), ("value", False), ("fact", False), ("rule", False)),
    "latency": (("api", False),),
    "~rule-touches": (("rule", False),),
    "~rule-writes": (("rule", False),),
    "~phases": (("start_ns", False),),
    "~end-txn-outcomes": (("delivery_ns", False),),
    "~trace-events": (),
    "~clock-offset": (),
}


def wire_frame(ops: DataFrame, traces: DataFrame, isolation: str = "auto",
               cached: list[DataFrame] | None = None) -> DataFrame:
    """Every wire check's cases and every wire statistic in one frame
    (check, case as JSON), so the whole wire analysis is collected in one
    Spark job: the anomalies of wire_checks, the ``latency`` and
    ``fault-impact`` tables, and ``~phases``, ``~end-txn-outcomes``,
    ``~trace-events`` and ``~clock-offset`` for the report's stats."""
    from kproxy_spark.session import keep, one_partition

    level = traces.storageLevel
    ops = one_partition(ops)
    traces = one_partition(traces)
    if not (level.useMemory or level.useDisk):
        # Traces the caller did not cache (a test's literal files) would be
        # read, and their side files decoded, once per view and check.
        traces = keep(traces, cached)
    views = wire_views(ops, traces, isolation, cached)
    tables = dict(wire_checks(ops, traces, isolation, views=views))
    tables["~rule-touches"] = rule_touches(traces)
    tables["~phases"] = fault_phases(traces)
    tables["~end-txn-outcomes"] = end_txn_outcomes(traces, views.ends)
    tables["~trace-events"] = traces.agg(F.count(F.lit(1)).alias("events"))
    tables["~clock-offset"] = clock_offset(ops, traces, views.sent, views.attempts)
    parts = [
        frame.select(
            F.lit(name).alias("check"),
            F.to_json(F.struct(*[F.col(c) for c in frame.columns]), {"ignoreNullFields": "false"}).alias("case"),
        )
        for name, frame in tables.items()
    ]
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    return union


def _order_key(fields: tuple[tuple[str, bool], ...]):  # noqa: ANN202
    def key(case: dict) -> tuple:
        # Spark's ascending order: nulls first unless asked last.
        return tuple(
            ((1, 0) if last else (0, 0)) if case.get(name) is None else ((0, case[name]) if last else (1, case[name]))
            for name, last in fields
        )

    return key


def read_wire_rows(rows) -> tuple[dict[str, list[dict]], dict]:  # noqa: ANN001
    """wire_frame's collected rows -> (cases by check, in report order; the stats they give).

    The cases keep ``~rule-touches``, ``~rule-writes`` and ``~value-facts``
    for kproxy_spark.attribution, which ties cases to their causes and builds
    ``fault-impact``."""
    import orjson

    tables: dict[str, list[dict]] = {name: [] for name in WIRE_ORDER}
    for row in rows:
        tables[row["check"]].append(orjson.loads(row["case"]))
    for name, fields in WIRE_ORDER.items():
        tables[name].sort(key=_order_key(fields))
    offset = tables.pop("~clock-offset")
    offset_ns = offset[0]["d"] if offset and offset[0].get("d") is not None else None
    stats = {
        "trace_events": tables.pop("~trace-events")[0]["events"],
        "trace_clock_offset_ns": offset_ns,
        "phases": [
            {**p, "start_ns": p["start_ns"] + offset_ns, "end_ns": p["end_ns"] + offset_ns}
            for p in tables.pop("~phases")
        ] if offset_ns is not None else [],
        "end_txn_outcomes": tables.pop("~end-txn-outcomes"),
    }
    return tables, stats


@dataclass(frozen=True)
class WireViews:
    """The views of the history and the traces that several checks read,
    each computed once (kproxy_spark.session.keep) inside the job that
    collects the checks."""

    sent: DataFrame
    attempts: DataFrame
    fetched: DataFrame
    ends: DataFrame
    log: DataFrame


def wire_views(ops: DataFrame, traces: DataFrame, isolation: str = "auto", held: list | None = None) -> WireViews:
    """history_sends, produce_attempts, fetched_records (FETCHED_COLUMNS),
    end_txns and landings, kept; their releases go to `held`, for the caller:
    analyses that share a session must not clear each other's rows."""
    from kproxy_spark.session import keep as keep_rows, one_partition

    def keep(frame, held):  # noqa: ANN001, ANN202
        return keep_rows(one_partition(frame, joined=True), held)

    sent = keep(history_sends(ops), held)
    attempts = keep(produce_attempts(traces), held)
    # Only the columns the checks read: a Fetch record carries every column
    # of its event, and at a million operations the whole width no longer
    # fits in memory.
    fetched = keep(fetched_records(traces, isolation).select(*FETCHED_COLUMNS), held)
    ends = keep(end_txns(traces), held)
    log = keep(landings(traces, isolation, attempts=attempts, fetched=fetched, ends=ends), held)
    return WireViews(sent, attempts, fetched, ends, log)


def wire_checks(ops: DataFrame, traces: DataFrame, isolation: str = "auto",
                cached: list | None = None, views: WireViews | None = None) -> dict[str, DataFrame]:
    """Every wire anomaly: name -> cases. `isolation` says how to tell
    read_committed fetches (see kproxy_spark.traces.fetched_records). What
    is kept here (wire_views, unless `views` are given) is appended to
    `cached`, for the caller to release (``unpersist()``)."""
    if views is None:
        views = wire_views(ops, traces, isolation, cached)
    sent, attempts, fetched, log = views.sent, views.attempts, views.fetched, views.log
    cases: dict[str, DataFrame] = {
        "torn-transaction": torn_transactions(sent, log),
        "stale-end-txn": stale_end_txns(traces, views.ends),
        "late-produce": late_produces(attempts, log),
        "client-outcome-mismatch": client_outcome_mismatches(sent, log),
        "spurious-offset": spurious_offsets(sent, attempts),
        "ambiguous-error": ambiguous_errors(sent, attempts, fetched),
        "broker-aborted-read": broker_aborted_reads(fetched, log),
        "stale-aborted-entry": stale_aborted_entries(fetched, log),
        "past-lso-read": past_lso_reads(fetched, log),
        "left-out-records": left_out_records(fetched, log),
        "~value-facts": value_facts(fetched, log, rule_removed_records(traces), views.ends),
        "~rule-writes": rule_writes(sent, attempts, log),
    }
    cases["latency"] = latency(traces)
    return cases





def fault_phases(traces: DataFrame) -> DataFrame:
    """When each rule acted: rule, actions, start_ns, end_ns (trace clock), events."""
    return (
        traces.where(F.col("rule").isNotNull())
        .groupBy("rule")
        .agg(
            F.array_sort(F.collect_set("action")).alias("actions"),
            F.min("mono_ns").alias("start_ns"),
            F.max("mono_ns").alias("end_ns"),
            F.count(F.lit(1)).alias("events"),
        )
    )


def end_txn_outcomes(traces: DataFrame, ends: DataFrame | None = None) -> DataFrame:
    """Delivered EndTxns by producer and broker-side number: transactional_id, txn_broker, commits, aborts,
    stale (with a hazard), first delivery (trace clock)."""
    return (
        (end_txns(traces) if ends is None else ends)
        .where(F.col("delivered"))
        .groupBy("transactional_id", "txn_broker")
        .agg(
            F.sum(F.col("end_txn_commit").cast("int")).alias("commits"),
            F.sum((~F.col("end_txn_commit")).cast("int")).alias("aborts"),
            F.sum(F.col("hazard").isNotNull().cast("int")).alias("stale"),
            F.min("delivery_ns").alias("delivery_ns"),
        )
    )

__all__ = ["WIRE_ANOMALIES", "WireViews", "clock_offset", "end_txn_outcomes", "fault_phases", "history_sends",
           "read_wire_rows", "wire_checks", "wire_frame", "wire_views"]
