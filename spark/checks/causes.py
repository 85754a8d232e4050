"""Why a process's reads of a key skipped or went back: the causes the history establishes.

A `poll-skip` or `nonmonotonic-poll` case stays what Jepsen calls it; this
pass only adds what explains it, so a reader can tell the client's or the
broker's known behaviour from a skip nothing accounts for:

* ``read-in-aborted-txn`` (skips): every skipped position was read by the
  process's own transactions that aborted (``fail`` txns) between the two
  reads. Its consumer kept the position those reads left it at instead of
  going back to the committed offset (KAFKA-17582; ``abort-position`` calls
  it ``advance``), so no committed transaction of the process read them.
* ``aborted-writes`` (skips): every skipped position holds a value whose send
  definitely failed. A read_committed consumer must never return it; it is in
  the version order only because some read returned it (``G1a``).
* ``reassigned`` (both): an ``ok``/``info`` assign or subscribe that kept the
  key lies between the two reads. A (re)assigned consumer resumes at the
  group's committed offset, which is not necessarily where the process left
  off (other members commit to the same group; a broker may not have stored
  or published the process's own commit).

Several may hold for one case; ``causes`` lists each that does, in the order
above, and is empty when the history explains nothing.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark.checks.orders import by_index, representative_positions, writer_of
from spark.history import polled

CAUSES = ("read-in-aborted-txn", "aborted-writes", "reassigned")

_CASE = ["index", "key"]


def _aborted_txn_reads(cases: DataFrame, mops: DataFrame, vo: DataFrame) -> DataFrame:
    """index, key, aborted_txns (the process's fail txns between the two reads
    that read the key), covered (distinct skipped positions they read)."""
    reads = (
        polled(mops)
        .where((F.col("f") == "txn") & (F.col("type") == "fail"))
        .select("process", "key", "value", F.col("index").alias("read_index"))
        .join(representative_positions(vo).withColumnRenamed("vo_index", "read_vo_index"), ["key", "value"], "left")
    )
    spans = cases.select(*_CASE, "process", "prev_index", "prev_vo_index", "vo_index")
    inside = (F.col("read_vo_index") > F.col("prev_vo_index")) & (F.col("read_vo_index") < F.col("vo_index"))
    return (
        spans.join(reads, ["process", "key"])
        .where((F.col("read_index") > F.col("prev_index")) & (F.col("read_index") < F.col("index")))
        .groupBy(*_CASE)
        .agg(
            F.sort_array(F.collect_set("read_index")).alias("aborted_txns"),
            F.count_distinct(F.when(inside, F.col("read_vo_index"))).alias("covered"),
        )
    )


def _aborted_positions(cases: DataFrame, mops: DataFrame, vo: DataFrame) -> DataFrame:
    """index, key, aborted_positions: skipped positions whose value's send failed.

    Positions are dense per key, so a running count of failed-writer
    positions answers each case with two equi-joins instead of a range join.
    """
    failed = writer_of(mops).where(F.col("writer_type") == "fail").select("key", "value", F.lit(1).alias("failed"))
    running = Window.partitionBy("key").orderBy("vo_index").rowsBetween(Window.unboundedPreceding, 0)
    prefix = (
        by_index(vo)
        .join(failed, ["key", "value"], "left")
        .select("key", "vo_index", F.sum(F.coalesce("failed", F.lit(0))).over(running).alias("failed_upto"))
    )
    upto_last_skipped = prefix.select("key", (F.col("vo_index") + 1).alias("vo_index"), F.col("failed_upto").alias("hi"))
    upto_prev = prefix.select("key", F.col("vo_index").alias("prev_vo_index"), F.col("failed_upto").alias("lo"))
    return (
        cases.select(*_CASE, "prev_vo_index", "vo_index")
        .join(upto_last_skipped, ["key", "vo_index"], "left")
        .join(upto_prev, ["key", "prev_vo_index"], "left")
        .select(*_CASE, (F.coalesce("hi", F.lit(0)) - F.coalesce("lo", F.lit(0))).alias("aborted_positions"))
    )


def _reassigns(cases: DataFrame, changes: DataFrame) -> DataFrame:
    """index, key, reassigns: the process's assigns/subscribes between the two reads that kept the key."""
    kept = changes.where(F.col("f").isin("assign", "subscribe")).select(
        "process", F.col("index").alias("change_index"), "keys"
    )
    return (
        cases.select(*_CASE, "process", "prev_index")
        .join(kept, "process")
        .where(
            (F.col("change_index") > F.col("prev_index"))
            & (F.col("change_index") < F.col("index"))
            & F.array_contains("keys", F.col("key"))
        )
        .groupBy(*_CASE)
        .agg(F.sort_array(F.collect_set("change_index")).alias("reassigns"))
    )


def _ops(col: str) -> Column:
    return F.array_join(F.transform(F.col(col), lambda i: i.cast("string")), ", ")


def _phrases() -> Column:
    several = F.size("aborted_txns") > 1
    aborted_txn = F.concat(
        F.when(several, F.lit("its own aborted txns (ops ")).otherwise(F.lit("its own aborted txn (op ")),
        _ops("aborted_txns"),
        F.lit(") had read them, and its consumer did not go back after the abort"),
    )
    aborted_writes = F.lit(
        "every skipped value was written by a send that definitely failed or aborted, which a consumer must not return"
    )
    reassigned = F.concat(
        F.when(F.size("reassigns") > 1, F.lit("it was re-assigned in between (ops "))
        .otherwise(F.lit("it was re-assigned in between (op ")),
        _ops("reassigns"),
        F.lit(") and resumed at the group's committed offset"),
    )
    phrase = {"read-in-aborted-txn": aborted_txn, "aborted-writes": aborted_writes, "reassigned": reassigned}
    found = F.array_compact(F.array(*[
        F.when(F.array_contains("causes", name), phrase[name]) for name in CAUSES
    ]))
    return F.when(F.size(found) > 0, F.concat(F.lit("; cause: "), F.array_join(found, "; "))).otherwise(
        F.lit("; no cause found in the history")
    )


def with_causes(cases: DataFrame, mops: DataFrame, vo: DataFrame, changes: DataFrame, skip: bool) -> DataFrame:
    """Add causes, aborted_txns, reassigns and an explanation to poll-skip
    (skip=True) or nonmonotonic-poll (skip=False) cases (as built by
    spark.checks.contiguity from poll_pairs)."""
    empty = F.array().cast("array<long>")
    explained = (
        cases.join(_reassigns(cases, changes), _CASE, "left")
        .join(_aborted_txn_reads(cases, mops, vo), _CASE, "left")
    )
    reassigned = F.when(F.size(F.coalesce("reassigns", empty)) > 0, F.lit("reassigned"))
    reads = F.format_string(
        "process %s read key %s up to value %s (op %s), then from value %s (op %s)",
        "process", "key", F.col("values")[0], "prev_index", F.col("values")[1], "index",
    )
    if skip:
        explained = explained.join(_aborted_positions(cases, mops, vo), _CASE, "left")
        missing = F.col("delta") - 1
        causes = F.array(
            F.when(F.coalesce("covered", F.lit(0)) == missing, F.lit("read-in-aborted-txn")),
            F.when(F.col("aborted_positions") == missing, F.lit("aborted-writes")),
            reassigned,
        )
        shown = F.coalesce(F.col("skipped"), empty)
        lead = F.concat(reads, F.format_string(
            ", skipping %s value(s) [%s%s]",
            missing,
            F.array_join(F.transform(shown, lambda v: v.cast("string")), ", "),
            F.when(F.size(shown) < missing, F.lit(", ...")).otherwise(F.lit("")),
        ))
    else:
        causes = F.array(reassigned)
        lead = F.concat(reads, F.lit(", "), F.when(F.col("delta") == 0, F.lit("the same position again"))
                        .otherwise(F.format_string("%s position(s) back", -F.col("delta"))))
    explained = (
        explained.withColumn("aborted_txns", F.coalesce("aborted_txns", empty))
        .withColumn("reassigns", F.coalesce("reassigns", empty))
        .withColumn("causes", F.array_compact(causes))
    )
    return explained.withColumn("explanation", F.concat(lead, _phrases())).drop("covered", "aborted_positions")
