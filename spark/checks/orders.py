"""Version orders per key, and the anomalies visible in them alone.

Jepsen's queue checker trusts every offset/value pair a poll returned (reads
are supposed to be safe whatever happens to the reader's transaction) but a
send's offset only when the send must have committed: it was acknowledged
(``ok``), or it is ``info`` and some acknowledged poll read one of its values.
"""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark.history import polled, sends


def ok_reads(mops: DataFrame) -> DataFrame:
    """Distinct (key, value) pairs returned by acknowledged polls/txns."""
    return polled(mops).where(F.col("type") == "ok").select("key", "value").distinct()


def committed_writer_ops(mops: DataFrame) -> DataFrame:
    """Indexes of send/txn completions that must have committed (Jepsen's must-have-committed?)."""
    writes = sends(mops)
    acknowledged = writes.where(F.col("type") == "ok").select("index")
    proven = (
        writes.where(F.col("type") == "info")
        .join(ok_reads(mops), ["key", "value"], "left_semi")
        .select("index")
    )
    return acknowledged.unionByName(proven).distinct()


def writer_of(mops: DataFrame) -> DataFrame:
    """The completion that sent each (key, value): key, value, writer_index, writer_process, writer_type, writer_offset."""
    writes = sends(mops)
    # Values are unique per key; should a history repeat one, the later
    # writer wins, as in Jepsen.
    latest = Window.partitionBy("key", "value").orderBy(F.col("index").desc(), F.col("mop_index").desc())
    return (
        writes.withColumn("rank", F.row_number().over(latest))
        .where("rank = 1")
        .select(
            "key", "value",
            F.col("index").alias("writer_index"),
            F.col("process").alias("writer_process"),
            F.col("type").alias("writer_type"),
            F.col("offset").alias("writer_offset"),
        )
    )


def version_order_entries(mops: DataFrame) -> DataFrame:
    """Distinct (key, offset, value) observations that shape the version order."""
    trusted_sends = sends(mops).join(committed_writer_ops(mops), "index", "left_semi")
    observations = trusted_sends.unionByName(polled(mops))
    return observations.where(F.col("offset").isNotNull() & F.col("value").isNotNull()).select(
        "key", "offset", "value"
    ).distinct()


def version_orders_from_mops(mops: DataFrame) -> DataFrame:
    """key, offset, value, vo_index: vo_index is the dense position of the offset in the key's log.

    Offsets have gaps (transaction markers take offsets), so the order is
    compared by dense index, never by raw offset.
    """
    entries = version_order_entries(mops)
    by_offset = Window.partitionBy("key").orderBy("offset")
    return entries.withColumn("vo_index", F.dense_rank().over(by_offset) - 1)


def by_value(vo: DataFrame) -> DataFrame:
    """key, value, vo_index (last position of the value, as Jepsen's by-value), first_index, last_index."""
    return vo.groupBy("key", "value").agg(
        F.max("vo_index").alias("vo_index"),
        F.min("vo_index").alias("first_index"),
        F.max("vo_index").alias("last_index"),
    )


def by_index(vo: DataFrame) -> DataFrame:
    """key, vo_index, value: one value per position (the smallest when an offset is inconsistent)."""
    return vo.groupBy("key", "vo_index").agg(F.min("value").alias("value"), F.min("offset").alias("offset"))


def representative_positions(vo: DataFrame) -> DataFrame:
    """key, value, vo_index: positions as Jepsen's by-value, which is built from
    by-index: a value that only shares an inconsistent offset with the value
    standing for it has no position (unknown, so adjacent to anything)."""
    return by_index(vo).groupBy("key", "value").agg(F.max("vo_index").alias("vo_index"))


def inconsistent_offsets(vo: DataFrame, mops: DataFrame) -> DataFrame:
    """One offset of a key holding several values.

    Columns: key, offset, vo_index, values, op_indexes (the ops that sent or
    polled the offset).
    """
    cases = (
        vo.groupBy("key", "offset", "vo_index")
        .agg(F.sort_array(F.collect_set("value")).alias("values"))
        .where(F.size("values") > 1)
    )
    witnesses = (
        mops.where(F.col("type") != "invoke")
        .join(cases.select("key", "offset"), ["key", "offset"], "left_semi")
        .groupBy("key", "offset")
        .agg(F.sort_array(F.collect_set("index")).alias("op_indexes"))
    )
    return cases.join(witnesses, ["key", "offset"], "left")


def duplicates(vo: DataFrame) -> DataFrame:
    """One value of a key stored at several offsets: key, value, count, offsets."""
    return (
        vo.groupBy("key", "value")
        .agg(F.sort_array(F.collect_set("offset")).alias("offsets"))
        .where(F.size("offsets") > 1)
        .select("key", "value", F.size("offsets").alias("count"), "offsets")
    )
