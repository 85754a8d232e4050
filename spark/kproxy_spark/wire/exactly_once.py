"""Exactly-once for consume-transform-produce: the input offsets the
transactions committed, per consumer group and input partition.

An exactly-once application commits its consumer's position inside each
transaction (TxnOffsetCommit), so what the broker committed is a chain of
offsets per group and input partition, one link per committed transaction,
each transaction standing for the input between the previous link and its
own. The trace gives each TxnOffsetCommit, the transaction that decided it
(the first EndTxn the broker took for the producer's broker-side
transaction: a stale copy's decision is the one that counts), and every
record each Fetch response delivered. Two things break the chain:

* **overlap**: a committed transaction committed an offset below the link
  before it: the input between the two is turned into committed output
  twice (duplicates downstream);
* **output-without-offsets** / **offsets-without-output**: one client
  transaction's output records and its input offsets did not commit
  together (a stale EndTxn committed the output before the offsets
  arrived, say): the input is processed again (duplicates), or its output
  is gone (loss);
* **gap**: input inside a link was never delivered to a consumer while the
  transaction that commits past it was being made: its input was consumed
  without its output being committed (loss). After an aborted transaction
  that had committed offsets for the partition, the input between the last
  committed offset and the aborted one must be delivered again after the
  abort (the consumer goes back to the committed position: KAFKA-17582 is
  the client that does not). A consumer that fetches ahead is not held to
  more: only input below the aborted transaction's offset must come again.
"""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.pandas.types import from_arrow_schema

from kproxy_spark.traces import with_coalesced_ids
from kproxy_spark.wire import phrases as say
from kproxy_spark.wire.check import BY_RULES, ERROR, WireCheck
from kproxy_spark.wire.exactly_once_pass import (
    CASE_SCHEMA,
    COMMIT,
    DECIDED,
    END,
    LINK,
    LOGGED,
    OUTPUT,
    PRODUCER_SCHEMA,
    READ,
    TXN,
    by_partition,
    by_producer,
)
from kproxy_spark.wire.landings import _producer_key, exchanges, spread
from kproxy_spark.wire.views import WireViews


def offset_commits(traces: DataFrame) -> DataFrame:
    """Every TxnOffsetCommit a client sent, per partition: group, offset, its transaction and its answer
    (by_producer's COMMIT rows)."""
    commits = exchanges(with_coalesced_ids(traces).where(
        (F.col("api") == "txn_offset_commit") & F.col("copy").isin(0)))
    parts = commits.where((F.col("direction") == "request") & F.col("partitions").isNotNull()).select(
        "group_id", "mono_ns", *_producer_key("transactional_id", "producer_id", "producer_epoch"), "txn_client",
        "conn_id", "correlation_id", "delivered", "delivery_ns", "response_error_code",
        F.explode("partitions").alias("p"))
    return parts.select(
        F.lit(COMMIT).alias("kind"), "group_id", F.col("p.topic").alias("topic"),
        F.col("p.partition").alias("partition"), F.col("p.committed_offset").alias("committed_offset"), "mono_ns",
        *TXN, "conn_id", "correlation_id", F.col("delivery_ns").alias("at_ns"),
        (F.col("delivered") & (F.coalesce("response_error_code", F.lit(0)) == 0)).alias("ok"),
    ).where(F.col("committed_offset").isNotNull() & F.col("group_id").isNotNull())


def _end_txns(views: WireViews) -> DataFrame:
    """The EndTxns by_producer reads (its END rows): those the broker took (delivered, not refused), and
    the client's own (its last one of a transaction tells what the client meant)."""
    taken = F.col("delivered") & (F.coalesce("response_error_code", F.lit(0)) == 0)
    told = (F.col("copy") == 0) & F.col("txn_client").isNotNull()
    return views.ends.where(taken | told).select(
        F.lit(END).alias("kind"), *TXN, "mono_ns", "conn_id", "correlation_id", "copy",
        F.col("delivery_ns").alias("at_ns"), taken.alias("taken"), F.col("end_txn_commit").alias("commit"),
        F.when(F.col("hazard").isNotNull(), F.col("rule")).alias("rule"))


def _output(views: WireViews) -> DataFrame:
    """Per client transaction (by_producer's OUTPUT rows): its records that committed, that aborted, the
    rules of stale EndTxns that decided them, and its first record's Produce."""
    fate = F.coalesce("next_marker_fate", "fate")
    return views.log.where(F.col("txn_client").isNotNull() & F.col("key_long").isNotNull()).groupBy(*TXN).agg(
        F.lit(OUTPUT).alias("kind"),
        F.sum((fate == "committed").cast("long")).alias("committed_records"),
        F.sum((fate == "aborted").cast("long")).alias("aborted_records"),
        F.collect_set(F.when(F.col("end_hazard").isNotNull(), F.col("end_rule"))).alias("output_rules"),
        F.min("produce_delivery_ns").alias("mono_ns"),
        F.min_by("produce_conn_id", "produce_delivery_ns").alias("conn_id"),
        F.min_by("produce_correlation_id", "produce_delivery_ns").alias("correlation_id"))


def decided_commits(views: WireViews) -> DataFrame:
    """One grouped pass per transactional id (kproxy_spark.wire.exactly_once_pass.by_producer): the
    offset commits a decision reached (kind DECIDED) and the cases of client transactions whose output
    and input offsets did not commit together."""
    rows = offset_commits(views.traces).unionByName(_end_txns(views), allowMissingColumns=True).unionByName(
        _output(views), allowMissingColumns=True)
    return rows.groupBy(spread(rows, "txn_id")).applyInArrow(by_producer, from_arrow_schema(PRODUCER_SCHEMA))


def _chain_breaks(views: WireViews, decided: DataFrame) -> DataFrame:
    """One grouped pass per input partition (kproxy_spark.wire.exactly_once_pass.by_partition): each
    group's overlaps and gaps."""
    links = decided.where(F.col("kind") == DECIDED).select(
        F.lit(LINK).alias("kind"), "group_id", "topic", "partition", F.col("to_offset").alias("offset"),
        F.col("decided_ns").alias("at_ns"), "decided_commit", "decided_rule", "mono_ns", "conn_id",
        "correlation_id", "txn_id", "txn_client")
    # The log's own records only: data that landed and committed.
    logged = views.log.where(
        F.col("key_long").isNotNull() & (F.coalesce("next_marker_fate", "fate") == "committed")).select(
        F.lit(LOGGED).alias("kind"), "topic", "partition", "offset")
    # Served, but listed as aborted to a read_committed consumer, which drops it: the broker's doing.
    reads = views.fetched.where((F.col("copy") == 0) & F.col("control").isNull()).select(
        F.lit(READ).alias("kind"), "topic", "partition", "offset", F.col("mono_ns").alias("at_ns"),
        (F.col("read_committed") & F.coalesce("listed_aborted", F.lit(False))).alias("listed"))
    rows = links.unionByName(logged, allowMissingColumns=True).unionByName(reads, allowMissingColumns=True)
    members = views.summary.member_groups
    return rows.groupBy(spread(rows, "topic", "partition")).applyInArrow(
        lambda table: by_partition(table, members), from_arrow_schema(CASE_SCHEMA))


def exactly_once_breaks(views: WireViews) -> DataFrame:
    """Per group and input partition: committed offsets that went back (overlap) or skipped input (gap),
    and transactions whose output and input offsets did not commit together."""
    # Read twice (the cases, and the chain's links): computed once.
    decided = views.keep(decided_commits(views))
    return decided.where(F.col("kind") != DECIDED).select(*CASE_SCHEMA.names).unionByName(
        _chain_breaks(views, decided))


def _explain(case: dict[str, Any]) -> str:
    where = f"group {case['group_id']} on {case['topic']}[{case['partition']}]"
    txn = f"transaction {case['txn_client']} of {case['txn_id']} {say.at(case['conn_id'], case['correlation_id'])}"
    if case["kind"] == "output-without-offsets" and case["topic"] is None:
        return (f"group {case['group_id']}: {txn} was aborted by its client before it sent its input offsets, "
                f"yet {case['missing']} output record(s) of it committed: the client processes that input again, "
                "and its output is committed twice")
    if case["kind"] == "output-without-offsets":
        return (f"{where}: {txn} committed {case['missing']} output record(s), but not its input offsets (up to "
                f"{case['to_offset']}): that input is processed again and its output committed twice")
    if case["kind"] == "offsets-without-output":
        return (f"{where}: {txn} committed its input offsets (up to {case['to_offset']}), but its "
                f"{case['missing']} output record(s) aborted: that input's output is lost")
    if case["kind"] == "overlap":
        return (f"{where}: committed {txn} moved the committed offset back from {case['to_offset']} to "
                f"{case['from_offset']}, so that input is turned into committed output twice")
    listed = ", ".join(map(str, case["offsets"])) + (" ..." if case["missing"] > len(case["offsets"]) else "")
    return (f"{where}: committed {txn} committed offset {case['to_offset']} past {case['missing']} input record(s) "
            f"from offset {case['from_offset']} (offsets {listed}) that no consumer was delivered while it was made"
            " (after an aborted transaction, the consumer must read again from the committed offset), so their"
            " output was never committed")


CHECKS = (
    WireCheck("exactly-once", ERROR, (("mono_ns", False), ("topic", False), ("partition", False)),
              exactly_once_breaks, BY_RULES, _explain, needs=("txn_offset_commit",)),
)
