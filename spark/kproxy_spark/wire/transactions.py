"""Wire checks of transactions: what the records of one client transaction
met on the broker, and the EndTxns and Produces that slid into another
transaction than the client's."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from kproxy_spark.wire import phrases as say
from kproxy_spark.wire.check import BY_RULES, ERROR, INFO, WireCheck
from kproxy_spark.wire.log_pass import END_TXN_ATTRIBUTION
from kproxy_spark.wire.views import WireViews


def _end_txn() -> F.Column:
    """The EndTxn that decided a record (the log's end_* columns), as one struct."""
    return F.struct(*[F.col(f"end_{c}").alias(c) for c in END_TXN_ATTRIBUTION])


#: Cases of one exchange, in the order they crossed the proxy.
BY_EXCHANGE = (("mono_ns", False), ("conn_id", False), ("correlation_id", False), ("copy", False))


def sends_with_landings(views: WireViews) -> DataFrame:
    """Each completed send joined to where its (key, value) is in the log.
    Values are unique per key, so (key, value) names one write; the create
    mapping, when present, pins it to its topic-partition."""
    log = views.log
    hs = views.sent.select(
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


def _fate_summary(grouped_by: list[str], rows: DataFrame, extra: list[F.Column]) -> DataFrame:
    """Per group: which values met which fate and which EndTxns decided them."""
    pair = F.array(F.col("key_long"), F.col("value_long"))
    stale = F.col("end_hazard").isNotNull()
    end = _end_txn()
    return rows.groupBy(*grouped_by).agg(
        F.array_sort(F.collect_set(F.when(F.col("fate") == "committed", pair))).alias("committed"),
        F.array_sort(F.collect_set(F.when(F.col("fate") == "aborted", pair))).alias("aborted"),
        F.array_sort(F.collect_set(F.when(F.col("fate") == "unknown", pair))).alias("unknown"),
        # Sorted: a set's order is its rows' order, which the plan decides.
        F.array_sort(F.collect_set(F.when(stale & F.col("end_conn_id").isNotNull(), end))).alias("stale_end_txns"),
        F.array_sort(F.collect_set(F.when(F.col("end_conn_id").isNotNull(), end))).alias("end_txns"),
        F.array_sort(F.collect_set("txn_client")).alias("txn_clients"),
        F.array_sort(F.collect_set("txn_broker")).alias("txn_brokers"),
        F.array_sort(
            F.array_union(
                F.collect_set(F.when(stale, F.col("end_rule"))),
                F.collect_set(F.col("produce_rule")),
            )
        ).alias("rules"),
        *extra,
    )


def _op_fates(views: WireViews) -> DataFrame:
    """Per send or txn op whose records landed: the fates of its records and the EndTxns that decided them
    (_fate_summary), with the op's own fields. The torn-transaction and client-outcome checks read it
    alike (kept once: `views.shared`): an op's f and type are the op's, so each check's rows are a
    whole op's or none."""
    landed = sends_with_landings(views).where(F.col("f").isin("send", "txn") & F.col("offset").isNotNull())
    return _fate_summary(
        ["index"],
        landed,
        [
            F.first("process").alias("process"),
            F.first("f").alias("f"),
            F.first("type").alias("client_type"),
            F.first("error").alias("client_error"),
            F.first("time").alias("time"),
            F.first("txn_id").alias("transactional_id"),
            F.first("txn_pid").alias("producer_id"),
        ],
    )


def torn_transactions(views: WireViews) -> DataFrame:
    """Client transactions whose records met different fates (some
    committed, some aborted). A transaction is a history `txn` op; records
    of a transactional producer that no history op claims are grouped by
    the producer's client-side synthetic number instead."""
    log = views.log
    by_op = views.shared(_op_fates).where(F.col("f") == "txn").drop("f").withColumn("source", F.lit("history"))

    history_pairs = views.sent.select(F.col("key").alias("key_long"), F.col("value").alias("value_long"))
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
    return both.where((F.size("committed") > 0) & (F.size("aborted") > 0))


def explain_torn(case: dict[str, Any]) -> str:
    if case.get("source") == "history":
        which = (f"txn op {say.text(case.get('index'))} (process {say.text(case.get('process'))},"
                 f" {say.text(case.get('transactional_id'))},"
                 f" {say.client_outcome(case.get('client_type'), case.get('client_error'))})")
    else:
        which = (f"client txn {say.numbers(case.get('txn_clients'))} of {say.text(case.get('transactional_id'))}"
                 f" (producer {say.text(case.get('producer_id'))}, in no history op)")
    unknown = f", and {say.pairs(case['unknown'])} of unknown fate" if case.get("unknown") else ""
    return (f"{which}: records {say.pairs(case.get('committed'))} committed but {say.pairs(case.get('aborted'))}"
            f" aborted{unknown}"
            + say.end_txn_cause(case.get("stale_end_txns"), case.get("end_txns"), case.get("rules")))


def client_outcome_mismatches(views: WireViews) -> DataFrame:
    """Ops whose client outcome contradicts the wire, both ways:
    `client-fail-wire-committed` (a definite failure or abort whose values
    committed) and `client-ok-wire-aborted` (an ok whose values aborted)."""
    direction = (
        F.when((F.col("client_type") == "fail") & (F.size("committed") > 0), "client-fail-wire-committed")
        .when((F.col("client_type") == "ok") & (F.size("aborted") > 0), "client-ok-wire-aborted")
    )
    return (
        views.shared(_op_fates).withColumn("direction", direction)
        .where(F.col("direction").isNotNull())
        .select("index", "time", "process", "f", "client_type", "client_error", "direction",
                "committed", "aborted", "txn_clients", "txn_brokers", "stale_end_txns", "rules")
    )


def explain_mismatch(case: dict[str, Any]) -> str:
    def also(word: str, field: str) -> str:
        return f" (and {word} {say.pairs(case[field])})" if case.get(field) else ""

    f = case.get("f")
    said = (f"{say.text(f)} op {say.text(case.get('index'))} (process {say.text(case.get('process'))},"
            f" {say.client_outcome(case.get('client_type'), case.get('client_error'), f)})")
    if case.get("direction") == "client-fail-wire-committed":
        wire = f" but the wire committed {say.pairs(case.get('committed'))}" + also("aborted", "aborted")
    else:
        wire = f" but the wire aborted {say.pairs(case.get('aborted'))}" + also("committed", "committed")
    # A plain send has no EndTxn to blame: only the rules involved can speak for it.
    if f == "txn":
        cause = say.end_txn_cause(case.get("stale_end_txns"), None, case.get("rules"), with_deciding=False)
    else:
        cause = say.rules_involved(case.get("rules"))
    return said + wire + cause


def stale_end_txns(views: WireViews) -> DataFrame:
    """Every delivered EndTxn whose numbers disagreed at delivery (a hazard)."""
    return views.ends.where(F.col("delivered") & F.col("hazard").isNotNull()).select(
        "proxy_id", "conn_id", "correlation_id", "copy", "mono_ns", "transactional_id",
        F.col("txn_pid").alias("producer_id"), F.col("txn_epoch").alias("producer_epoch"),
        "txn_client", "txn_broker", "end_txn_commit", "hazard", "rule", "action", "outcome",
        "response_error_code", F.array_compact(F.array("rule")).alias("rules"),
    )


def explain_stale_end_txn(case: dict[str, Any]) -> str:
    code = case.get("response_error_code")
    answer = ("; no response was traced" if code is None else "; the broker accepted it" if code == 0
              else f"; the broker answered {say.error(code)}")
    return (f"EndTxn({say.commit_or_abort(case.get('end_txn_commit'))}) of client txn {say.text(case.get('txn_client'))}"
            f" from {say.text(case.get('transactional_id'))} (producer {say.text(case.get('producer_id'))},"
            f" epoch {say.text(case.get('producer_epoch'))}), "
            + say.acted_and(case.get("rule"), case.get("action"))
            + say.delivered_in(case.get("hazard"), case.get("txn_broker"))
            + f" {say.at(case.get('conn_id'), case.get('correlation_id'))}{answer}")


def late_produces(views: WireViews) -> DataFrame:
    """Every delivered Produce that slid into a later broker-side
    transaction, with the fate of what it landed (`landed_fates`): a copy
    that lands in a transaction which then aborts is an aborted duplicate,
    not a torn transaction of the one it was sent in."""
    attempts = views.attempts.where(
        (F.col("status") != "not-delivered") & (F.col("hazard") == "late_produce")
    )
    fates = views.log.select("topic", "partition", F.col("offset").alias("landed_offset"),
                             F.col("fate").alias("landed_fate"))
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
    )


def explain_late_produce(case: dict[str, Any]) -> str:
    client, broker = case.get("txn_client"), case.get("txn_broker")
    # The tracker's three kinds of late Produce (kproxy/txn/machine.py), by their numbers.
    if client is not None and broker is not None and client < broker:
        how = f"delivered while broker txn {broker} was open"
    elif client is not None and client == broker:
        how = f"delivered after an EndTxn of client txn {client} had reached the broker, into broker txn {broker}"
    else:
        how = f"delivered into broker txn {say.text(broker)}, whose EndTxn had not reached the broker yet"
    offsets = case.get("landed_offsets") or []
    if len(offsets) == 1:
        landed = f", landed at offset {say.numbers(offsets)}"
    elif offsets:
        landed = f", landed at offsets {say.numbers(offsets)}"
    else:
        reason = case.get("lost_reason")
        landed = f", did not land ({reason if reason is not None else 'error or no response'})"
    fates = case.get("landed_fates") or []
    if fates:
        landed += " in a transaction that " + " / ".join(
            f if f in ("committed", "aborted") else "is undecided" for f in fates)
        if (case.get("copy") or 0) > 0:
            landed += " (a copy the proxy delivered; the client's own request is traced separately)"
    return (f"Produce of records {say.pairs(case.get('records'))} in client txn {say.text(client)}"
            f" of {say.text(case.get('transactional_id'))} (producer {say.text(case.get('producer_id'))}), "
            + say.acted_and(case.get("rule"), case.get("action"))
            + f"{how} {say.at(case.get('conn_id'), case.get('correlation_id'))}{landed}")


CHECKS = (
    WireCheck("torn-transaction", ERROR, (("index", True), ("transactional_id", False)), torn_transactions,
              BY_RULES, explain_torn),
    WireCheck("stale-end-txn", INFO, BY_EXCHANGE, stale_end_txns, BY_RULES, explain_stale_end_txn,
              needs=("end_txn",)),
    WireCheck("late-produce", INFO, BY_EXCHANGE, late_produces, BY_RULES, explain_late_produce),
    WireCheck("client-outcome-mismatch", ERROR, (("index", False),), client_outcome_mismatches, BY_RULES,
              explain_mismatch),
)
