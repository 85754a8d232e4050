"""Which writes were seen, and by whom: G1a, precommitted-read, lost-write, unseen."""

from __future__ import annotations

from pyspark.sql import DataFrame, Window
from pyspark.sql import functions as F

from spark.checks.orders import by_index, by_value, committed_writer_ops, ok_reads, writer_of
from spark.history import polled, sends


def aborted_reads(mops: DataFrame) -> DataFrame:
    """G1a: an acknowledged poll returned a value whose send definitely failed.

    Columns: key, value, offset, reader_index, reader_process, writer_index,
    writer_process.
    """
    failed = sends(mops).where(F.col("type") == "fail").select(
        "key", "value",
        F.col("index").alias("writer_index"),
        F.col("process").alias("writer_process"),
    )
    readers = polled(mops).where(F.col("type") == "ok").select(
        "key", "value", "offset",
        F.col("index").alias("reader_index"),
        F.col("process").alias("reader_process"),
    )
    return readers.join(failed, ["key", "value"]).dropDuplicates(["reader_index", "key", "value"])


def precommitted_reads(mops: DataFrame) -> DataFrame:
    """An operation polled a value that it sent itself, so before its own commit.

    Kafka consumers are never to see a record before the transaction that
    wrote it commits; a transaction's poll necessarily runs before its own
    commit. Columns: index, process, type, key, value, offset.
    """
    written = sends(mops).select("index", "key", "value")
    read = polled(mops).select("index", "process", "type", "key", "value", "offset")
    return read.join(written, ["index", "key", "value"], "left_semi").dropDuplicates(["index", "key", "value"])


def lost_writes(mops: DataFrame, vo: DataFrame) -> DataFrame:
    """A committed write that no acknowledged poll returned, though a later value of its key was polled.

    Per key, the bound is the highest position (earliest appearance) of any
    value an acknowledged poll returned; every value whose last appearance
    lies at or below it should have been read by someone. Columns: key,
    value, offset, vo_index, max_read_index, max_read_value,
    max_read_reader_index, writer_index, writer_process, writer_type.
    """
    positions = by_value(vo)
    seen = ok_reads(mops)
    bound = (
        seen.join(positions, ["key", "value"])
        .groupBy("key")
        .agg(F.max("first_index").alias("max_read_index"))
    )
    bound_value = bound.join(
        by_index(vo).withColumnRenamed("vo_index", "max_read_index").withColumnRenamed("value", "max_read_value"),
        ["key", "max_read_index"],
    ).drop("offset")
    reader_at_bound = (
        polled(mops).where(F.col("type") == "ok")
        .select("key", F.col("value").alias("max_read_value"), F.col("index").alias("max_read_reader_index"))
        .groupBy("key", "max_read_value")
        .agg(F.min("max_read_reader_index").alias("max_read_reader_index"))
    )
    committed = committed_writer_ops(mops).withColumnRenamed("index", "writer_index")
    offsets = vo.groupBy("key", "value").agg(F.min("offset").alias("offset"))
    return (
        positions.join(bound_value, "key")
        .where(F.col("last_index") <= F.col("max_read_index"))
        .join(seen, ["key", "value"], "left_anti")
        .join(writer_of(mops), ["key", "value"])
        .join(committed, "writer_index", "left_semi")
        .join(reader_at_bound, ["key", "max_read_value"], "left")
        .join(offsets, ["key", "value"], "left")
        .select(
            "key", "value", "offset", F.col("first_index").alias("vo_index"),
            "max_read_index", "max_read_value", "max_read_reader_index",
            "writer_index", "writer_process", "writer_type",
        )
    )


def _acknowledged_sends(mops: DataFrame) -> DataFrame:
    return sends(mops).where(F.col("type") == "ok")


def _first_ok_poll(mops: DataFrame) -> DataFrame:
    return (
        polled(mops).where(F.col("type") == "ok")
        .groupBy("key", "value")
        .agg(F.min("index").alias("seen_index"), F.min("time").alias("seen_time"))
    )


def unseen(mops: DataFrame) -> DataFrame:
    """Acknowledged writes that no acknowledged poll ever returned (as of the end of the history).

    Columns: key, value, offset, send_index, send_time, process.
    """
    return (
        _acknowledged_sends(mops)
        .join(_first_ok_poll(mops), ["key", "value"], "left_anti")
        .select(
            "key", "value", "offset",
            F.col("index").alias("send_index"),
            F.col("time").alias("send_time"),
            "process",
        )
    )


def _unseen_deltas(mops: DataFrame, bucket_ns: int) -> DataFrame:
    """+1 when a write is acknowledged, -1 when it is first polled after that, per time bucket."""
    acked = _acknowledged_sends(mops).select("key", "value", F.col("index").alias("send_index"), F.col("time").alias("send_time"))
    joined = acked.join(_first_ok_poll(mops), ["key", "value"], "left")
    ups = joined.select("key", F.floor(F.col("send_time") / bucket_ns).alias("bucket"), F.lit(1).alias("delta"))
    # A value polled before its send was acknowledged was never unseen.
    downs = joined.where(F.col("seen_index") > F.col("send_index")).select(
        "key", F.floor(F.col("seen_time") / bucket_ns).alias("bucket"), F.lit(-1).alias("delta")
    )
    # Net zero in one bucket means the write was seen within the bucket.
    return ups.unionByName(downs).groupBy("key", "bucket").agg(F.sum("delta").alias("delta"))


def unseen_by_key_over_time(mops: DataFrame, bucket_ns: int = 1_000_000_000) -> DataFrame:
    """Unseen acknowledged writes per key, as a step series: key, time (end of bucket, ns), unseen."""
    running = Window.partitionBy("key").orderBy("bucket").rowsBetween(Window.unboundedPreceding, 0)
    return _unseen_deltas(mops, bucket_ns).select(
        "key",
        ((F.col("bucket") + 1) * bucket_ns).alias("time"),
        F.sum("delta").over(running).alias("unseen"),
    )


def unseen_over_time(mops: DataFrame, bucket_ns: int = 1_000_000_000) -> DataFrame:
    """Unseen acknowledged writes over all keys: time (end of bucket, ns), unseen.

    The global window only ever sees one row per bucket, so it stays small.
    """
    per_bucket = _unseen_deltas(mops, bucket_ns).groupBy("bucket").agg(F.sum("delta").alias("delta"))
    running = Window.orderBy("bucket").rowsBetween(Window.unboundedPreceding, 0)
    return per_bucket.select(
        ((F.col("bucket") + 1) * bucket_ns).alias("time"),
        F.sum("delta").over(running).alias("unseen"),
    )
