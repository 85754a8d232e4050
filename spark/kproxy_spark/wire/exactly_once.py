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
from pyspark.sql.window import Window

from kproxy_spark.traces import with_coalesced_ids
from kproxy_spark.wire import phrases as say
from kproxy_spark.wire.check import BY_RULES, ERROR, WireCheck
from kproxy_spark.wire.landings import TXN_KEY, _producer_key, exchanges
from kproxy_spark.wire.views import WireViews

GROUP_PARTITION = ("group_id", "topic", "partition")


def _no_causes() -> F.Column:
    """What the trace establishes about a case beyond its rules (kproxy_spark.attribution's client causes): nothing."""
    return F.array().cast("array<string>").alias("causes")
#: At most this many offsets of one gap are listed in its case.
LISTED = 16


def offset_commits(traces: DataFrame) -> DataFrame:
    """Every TxnOffsetCommit a client sent, per partition: group, offset, its transaction and its answer."""
    commits = exchanges(with_coalesced_ids(traces).where(
        (F.col("api") == "txn_offset_commit") & F.col("copy").isin(0)))
    parts = commits.where((F.col("direction") == "request") & F.col("partitions").isNotNull()).select(
        "group_id", "mono_ns", *_producer_key("transactional_id", "producer_id", "producer_epoch"), "txn_client",
        "txn_broker", "conn_id", "correlation_id", "delivered", "delivery_ns", "response_error_code",
        F.explode("partitions").alias("p"))
    return parts.select(
        "group_id", F.col("p.topic").alias("topic"), F.col("p.partition").alias("partition"),
        F.col("p.committed_offset").alias("committed_offset"), "mono_ns", *TXN_KEY, "txn_client", "txn_broker",
        "conn_id", "correlation_id", F.col("delivery_ns").alias("commit_ns"),
        (F.col("delivered") & (F.coalesce("response_error_code", F.lit(0)) == 0)).alias("ok"),
    ).where(F.col("committed_offset").isNotNull() & F.col("group_id").isNotNull())


def decided(commits: DataFrame, views: WireViews) -> DataFrame:
    """Each offset commit with the EndTxn that decided it: the first of its producer's the broker took (a
    delivered one it did not refuse) after the commit reached it, whatever transaction the client meant
    that EndTxn for, as a record's fate is decided (kproxy_spark.wire.landings). Adds decided_commit,
    decided_ns and decided_rule (the rule, when that EndTxn was a stale copy); null when none came."""
    taken = views.ends.where(F.col("delivered") & (F.coalesce("response_error_code", F.lit(0)) == 0)).select(
        *[F.col(c).alias(f"_{c}") for c in TXN_KEY], F.col("end_txn_commit").alias("decided_commit"),
        F.col("delivery_ns").alias("decided_ns"), F.col("mono_ns").alias("_end_mono"), F.col("copy").alias("_copy"),
        F.when(F.col("hazard").isNotNull(), F.col("rule")).alias("decided_rule"))
    row = F.monotonically_increasing_id()
    commits = commits.withColumn("_row", row)
    after = commits.join(taken, [F.col(c) == F.col(f"_{c}") for c in TXN_KEY] + [
        F.col("decided_ns") >= F.col("commit_ns")], "left")
    first = Window.partitionBy("_row").orderBy(F.col("decided_ns").asc_nulls_last(), "_end_mono", "_copy")
    return after.withColumn("_n", F.row_number().over(first)).where(F.col("_n") == 1).drop(
        "_n", "_row", "_end_mono", "_copy", *[f"_{c}" for c in TXN_KEY])


def decided_commits(views: WireViews) -> DataFrame:
    """offset_commits with the EndTxn that decided each (`decided`)."""
    return decided(offset_commits(views.traces), views)


def committed_chain(commits: DataFrame) -> DataFrame:
    """Each offset commit (`decided` ones) with its fate, and for committed ones the link before it in its
    group partition."""
    decided_commits = commits.where("ok")
    link = Window.partitionBy(*GROUP_PARTITION).orderBy("decided_ns", "mono_ns")
    committed = decided_commits.where(F.col("decided_commit")).withColumns({
        "prev_offset": F.lag("committed_offset").over(link),
        "prev_ns": F.lag("decided_ns").over(link),
        "prev_rule": F.lag("decided_rule").over(link),
    })
    return committed.unionByName(decided_commits.where(~F.coalesce("decided_commit", F.lit(True))),
                                 allowMissingColumns=True)


#: Requests only a member of a group sends: a group none of whose consumers sent one has no members.
MEMBER_APIS = ("join_group", "sync_group", "heartbeat", "consumer_group_heartbeat")


def _overlaps(views: WireViews, chain: DataFrame) -> DataFrame:
    back = chain.where(F.col("decided_commit") & (F.col("committed_offset") < F.col("prev_offset")))
    # A group without members: its consumers assign partitions themselves (kproxy's own workload does), so
    # two of them may commit the same partition, the one behind after the one ahead. No owner, no order:
    # the clients' doing, not the broker's.
    members = views.traces.where(F.col("api").isin(*MEMBER_APIS) & (F.col("direction") == "request")
                                 & F.col("group_id").isNotNull()).select(
        "group_id", F.lit(True).alias("has_members")).dropDuplicates(["group_id"])
    back = back.join(members, "group_id", "left")
    return back.select(
        *GROUP_PARTITION, F.lit("overlap").alias("kind"), "mono_ns", "conn_id", "correlation_id", "txn_id",
        "txn_client", F.col("committed_offset").alias("from_offset"), F.col("prev_offset").alias("to_offset"),
        F.array().cast("array<bigint>").alias("offsets"), F.lit(0).alias("missing"),
        F.array_sort(F.array_compact(F.array_distinct(F.array("decided_rule", "prev_rule")))).alias("rules"),
        F.when(F.col("has_members").isNull(), F.array(F.lit("unowned-partitions")))
        .otherwise(F.array().cast("array<string>")).alias("causes"))


def _not_back() -> F.Column:
    """A missing offset the consumer was delivered before, and not again after an aborted transaction,
    though it lies below that transaction's: it kept the aborted reads' position."""
    return F.col("must_again") & ~F.col("read_again") & F.col("read_before")


def _listed() -> F.Column:
    """A missing offset never delivered, but served listed as aborted to a read_committed consumer."""
    return ~F.col("read_before") & F.col("listed")


def _gaps(views: WireViews, chain: DataFrame) -> DataFrame:
    """Input records inside a committed link that no consumer was delivered while its transaction was made."""
    links = chain.where(F.col("decided_commit") & (F.col("committed_offset") > F.col("prev_offset")))
    aborted = chain.where(~F.coalesce("decided_commit", F.lit(True))).select(
        *GROUP_PARTITION, F.col("committed_offset").alias("aborted_offset"), F.col("decided_ns").alias("abort_ns"),
        F.col("decided_rule").alias("abort_rule"))
    # The aborted transactions that ended between a link's two commits.
    between = links.join(aborted, list(GROUP_PARTITION)).where(
        (F.col("abort_ns") > F.col("prev_ns")) & (F.col("abort_ns") < F.col("decided_ns")))
    recommit = between.groupBy(*GROUP_PARTITION, "decided_ns").agg(
        F.max("aborted_offset").alias("aborted_offset"), F.max("abort_ns").alias("abort_ns"),
        F.collect_set("abort_rule").alias("abort_rules"))
    links = links.join(recommit, [*GROUP_PARTITION, "decided_ns"], "left")
    # Every input record the log shows inside a link (the log's own records only: data that landed and committed).
    records = views.log.where(F.col("key_long").isNotNull() & (F.coalesce("next_marker_fate", "fate") == "committed")
                              ).select("topic", "partition", "offset")
    inside = links.join(records, ["topic", "partition"]).where(
        (F.col("offset") >= F.col("prev_offset")) & (F.col("offset") < F.col("committed_offset")))
    reads = views.fetched.where((F.col("copy") == 0) & F.col("control").isNull()
                                & ~(F.col("read_committed") & F.coalesce("listed_aborted", F.lit(False)))).select(
        "topic", "partition", "offset", F.col("mono_ns").alias("read_ns"))
    # Served, but listed as aborted to a read_committed consumer, which drops it: the broker's doing.
    listed = views.fetched.where((F.col("copy") == 0) & F.col("control").isNull() & F.col("read_committed")
                                 & F.coalesce("listed_aborted", F.lit(False))).select(
        "topic", "partition", "offset", F.lit(True).alias("listed")).dropDuplicates(["topic", "partition", "offset"])
    read = inside.join(reads, ["topic", "partition", "offset"], "left").join(
        listed, ["topic", "partition", "offset"], "left")
    again = F.col("aborted_offset").isNotNull() & (F.col("offset") < F.col("aborted_offset"))
    per_record = read.groupBy(*GROUP_PARTITION, "decided_ns", "offset").agg(
        F.max(F.coalesce(F.col("read_ns") <= F.col("decided_ns"), F.lit(False))).alias("read_before"),
        F.max(F.coalesce((F.col("read_ns") > F.col("abort_ns")) & (F.col("read_ns") <= F.col("decided_ns")),
                         F.lit(False))).alias("read_again"),
        F.first(again).alias("must_again"),
        F.max(F.coalesce("listed", F.lit(False))).alias("listed"),
        *[F.first(c).alias(c) for c in ("mono_ns", "conn_id", "correlation_id", "txn_id", "txn_client", "prev_offset",
                                        "committed_offset", "decided_rule", "abort_rules")],
    )
    missing = per_record.where(~F.col("read_before") | (F.col("must_again") & ~F.col("read_again")))
    return missing.groupBy(*GROUP_PARTITION, "decided_ns").agg(
        F.lit("gap").alias("kind"), *[F.first(c).alias(c) for c in ("mono_ns", "conn_id", "correlation_id", "txn_id",
                                                                      "txn_client")],
        F.first("prev_offset").alias("from_offset"), F.first("committed_offset").alias("to_offset"),
        F.slice(F.array_sort(F.collect_list("offset")), 1, LISTED).alias("offsets"),
        F.count(F.lit(1)).alias("missing"),
        F.array_sort(F.array_compact(F.array_distinct(F.flatten(F.array(
            F.array(F.first("decided_rule")), F.coalesce(F.first("abort_rules"), F.array().cast("array<string>"))))))
        ).alias("rules"),
        # Each missing offset is explained when it lies below an aborted transaction's (the consumer kept the
        # aborted reads' position) or was served listed as aborted (the broker's list); a gap whose every
        # offset is one or the other has those causes (both, when its offsets differ), else none.
        F.when(F.min(_not_back() | _listed()), F.array_compact(F.array(
            F.when(F.max(_not_back()), F.lit("not-back-after-abort")),
            F.when(F.max(_listed()), F.lit("listed-as-aborted")))))
        .otherwise(F.array().cast("array<string>")).alias("causes"),
    ).drop("decided_ns")


TXN = (*TXN_KEY, "txn_client")


def _output(views: WireViews) -> DataFrame:
    """Per client transaction: its records that committed, that aborted, and the rules of stale EndTxns
    that decided them."""
    fate = F.coalesce("next_marker_fate", "fate")
    return views.log.where(F.col("txn_client").isNotNull() & F.col("key_long").isNotNull()).groupBy(*TXN).agg(
        F.sum((fate == "committed").cast("int")).alias("committed_records"),
        F.sum((fate == "aborted").cast("int")).alias("aborted_records"),
        F.collect_set(F.when(F.col("end_hazard").isNotNull(), F.col("end_rule"))).alias("output_rules"),
        F.min("produce_delivery_ns").alias("first_ns"),
        F.min_by("produce_conn_id", "produce_delivery_ns").alias("first_conn_id"),
        F.min_by("produce_correlation_id", "produce_delivery_ns").alias("first_correlation_id"))


def _apart(views: WireViews, commits: DataFrame, output: DataFrame) -> DataFrame:
    """Client transactions whose output and input offsets did not commit together."""
    txn = list(TXN)
    offsets = commits.groupBy(
        *txn, "group_id", "topic", "partition").agg(
        F.min("mono_ns").alias("mono_ns"), F.first("conn_id").alias("conn_id"),
        F.first("correlation_id").alias("correlation_id"), F.max("committed_offset").alias("committed_offset"),
        F.max(F.col("ok") & F.coalesce("decided_commit", F.lit(False))).alias("offsets_committed"),
        F.first("decided_rule", ignorenulls=True).alias("offsets_rule"))
    joined = offsets.join(output, txn)
    # Output that committed without the offsets of its input: that input is processed again (duplicates);
    # offsets that committed without any of the output: that input's output is gone (loss).
    duplicated = (F.col("committed_records") > 0) & ~F.col("offsets_committed")
    lost = F.col("offsets_committed") & (F.col("committed_records") == 0) & (F.col("aborted_records") > 0)
    apart = joined.where(duplicated | lost).select(
        *GROUP_PARTITION, F.when(duplicated, "output-without-offsets").otherwise("offsets-without-output").alias("kind"),
        "mono_ns", "conn_id", "correlation_id", "txn_id", "txn_client",
        F.lit(None).cast("long").alias("from_offset"), F.col("committed_offset").alias("to_offset"),
        F.array().cast("array<bigint>").alias("offsets"),
        F.when(duplicated, F.col("committed_records")).otherwise(F.col("aborted_records")).alias("missing"),
        F.array_sort(F.array_compact(F.array_distinct(F.concat(
            "output_rules", F.array("offsets_rule"))))).alias("rules"), _no_causes())
    # A consume-transform-produce producer (one that commits offsets in its transactions) whose client
    # aborted a transaction before sending its offsets, and whose output committed anyway (a stale EndTxn
    # had committed it; the abort may even be refused): the client processes that input again.
    producers = offsets.groupBy("txn_id").agg(F.first("group_id").alias("group_id"))
    last = Window.partitionBy(*txn).orderBy(F.col("mono_ns").desc())
    aborted = views.ends.where((F.col("copy") == 0) & F.col("txn_client").isNotNull()).withColumn(
        "_n", F.row_number().over(last)).where((F.col("_n") == 1) & ~F.col("end_txn_commit")).select(*txn)
    bare = output.join(producers, "txn_id").join(offsets.select(*txn).distinct(), txn, "left_anti").join(
        aborted, txn).where(F.col("committed_records") > 0)
    return apart.unionByName(bare.select(
        "group_id", F.lit(None).cast("string").alias("topic"), F.lit(None).cast("int").alias("partition"),
        F.lit("output-without-offsets").alias("kind"), F.col("first_ns").alias("mono_ns"),
        F.col("first_conn_id").alias("conn_id"), F.col("first_correlation_id").alias("correlation_id"),
        "txn_id", "txn_client", F.lit(None).cast("long").alias("from_offset"),
        F.lit(None).cast("long").alias("to_offset"), F.array().cast("array<bigint>").alias("offsets"),
        F.col("committed_records").alias("missing"),
        F.array_sort(F.array_compact(F.array_distinct("output_rules"))).alias("rules"), _no_causes()))


def exactly_once_breaks(views: WireViews) -> DataFrame:
    """Per group and input partition: committed offsets that went back (overlap) or skipped input (gap),
    and transactions whose output and input offsets did not commit together."""
    # Every offset commit with its decision, built once for the chain and for the output check.
    commits = views.shared(decided_commits)
    chain = views.keep(committed_chain(commits))
    return _overlaps(views, chain).unionByName(_gaps(views, chain)).unionByName(_apart(views, commits, _output(views)))


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
