"""Order of reads and sends against the version order: skips and inversions.

Within one operation (``int-*``), consecutive reads (or sends) of a key must
be adjacent in the key's version order. Across operations of one process,
the first read of a key must directly follow the last read of it by that
process's previous acknowledged operation, and sends must not go backwards.
A change of assignment/subscription that drops a key, or a crash, resets the
expectation for that key, as Jepsen does.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, Window
from pyspark.sql import functions as F

from spark.checks.orders import by_index, representative_positions
from spark.history import polled, sends

#: How many skipped values a case lists to explain itself; the delta says how many there were.
MAX_SKIPPED_LISTED = 16


def _delta(prev_index: Column, cur_index: Column) -> Column:
    # Unknown positions cannot prove anything: Jepsen treats them as adjacent.
    return F.when(prev_index.isNotNull() & cur_index.isNotNull(), cur_index - prev_index).otherwise(F.lit(1))


def with_skipped(cases: DataFrame, vo: DataFrame, case_id: list[str]) -> DataFrame:
    """Add ``skipped``: the first values strictly between prev_vo_index and vo_index."""
    positions = (
        cases.select(
            *case_id,
            F.explode(
                F.sequence(
                    F.col("prev_vo_index") + 1,
                    F.least(F.col("vo_index") - 1, F.col("prev_vo_index") + MAX_SKIPPED_LISTED),
                )
            ).alias("skipped_index"),
        )
        .join(
            by_index(vo).select("key", F.col("vo_index").alias("skipped_index"), F.col("value").alias("skipped_value")),
            ["key", "skipped_index"],
        )
        .groupBy(*case_id)
        .agg(F.sort_array(F.collect_list(F.struct("skipped_index", "skipped_value"))).alias("s"))
        .select(*case_id, F.col("s.skipped_value").alias("skipped"))
    )
    return cases.join(positions, case_id, "left")


def _positioned(rows: DataFrame, vo: DataFrame) -> DataFrame:
    return rows.join(representative_positions(vo), ["key", "value"], "left")


def _internal_pairs(rows: DataFrame, vo: DataFrame) -> DataFrame:
    order = Window.partitionBy("index", "key").orderBy("mop_index", "pos")
    return (
        _positioned(rows, vo)
        .withColumn("prev_value", F.lag("value").over(order))
        .withColumn("prev_vo_index", F.lag("vo_index").over(order))
        .where(F.col("prev_value").isNotNull())
        .withColumn("delta", _delta(F.col("prev_vo_index"), F.col("vo_index")))
        .select(
            "key", F.array("prev_value", "value").alias("values"), "delta",
            "index", "process", "type", "f", "mop_index", "prev_vo_index", "vo_index",
        )
    )


def internal_poll_pairs(mops: DataFrame, vo: DataFrame) -> DataFrame:
    return _internal_pairs(polled(mops).where(F.col("f").isin("poll", "txn")), vo)


def internal_send_pairs(mops: DataFrame, vo: DataFrame) -> DataFrame:
    return _internal_pairs(sends(mops).where(F.col("f").isin("send", "txn")), vo)


def skips(pairs: DataFrame, vo: DataFrame, case_id: list[str]) -> DataFrame:
    return with_skipped(pairs.where(F.col("delta") > 1), vo, case_id)


def nonmonotonic(pairs: DataFrame) -> DataFrame:
    return pairs.where(F.col("delta") < 1)


# --- across operations of one process -------------------------------------

def segments(rows: DataFrame, vo: DataFrame) -> DataFrame:
    """Per operation and key: the first and last value it read (or sent), with positions.

    Columns: process, index, type, key, first_value, last_value, first_offset,
    last_offset, first_vo_index, last_vo_index.
    """
    positioned = _positioned(rows, vo)
    order = F.struct("mop_index", "pos")
    return (
        positioned.groupBy("process", "index", "type", "key")
        .agg(
            F.min_by("value", order).alias("first_value"),
            F.max_by("value", order).alias("last_value"),
            F.min_by("offset", order).alias("first_offset"),
            F.max_by("offset", order).alias("last_offset"),
            F.min_by("vo_index", order).alias("first_vo_index"),
            F.max_by("vo_index", order).alias("last_vo_index"),
        )
    )


_SEGMENT_FIELDS = [
    "index", "type", "first_value", "last_value", "first_offset", "last_offset",
    "first_vo_index", "last_vo_index", "changes", "kept",
]


def segment_neighbours(segs: DataFrame, changes: DataFrame, previous_types: tuple[str, ...]) -> DataFrame:
    """Each segment with the previous segment of the same process and key (and the next one).

    ``changes`` are membership changes (index, process, f, keys). Between two
    segments of key k, the expectation survives only if every change in
    between still lists k: with C = changes of the process so far and K =
    those of them that listed k, the pair is comparable iff C and K grew by
    the same amount. Both counts come from running sums, so no per-key
    expansion of the change list is needed.

    Adds: prev (struct of the previous segment whose type is in
    previous_types, or null), next (struct of the following segment of any
    type), comparable_prev, comparable_next, subscribed (the process's most
    recent change was a subscribe).
    """
    seg_rows = segs.select(
        "process", "index", "key", "type", "first_value", "last_value", "first_offset", "last_offset",
        "first_vo_index", "last_vo_index", F.lit("seg").alias("kind"), F.lit(None).cast("string").alias("change_f"),
    )
    change_rows = changes.select(
        "process", "index", F.lit(None).cast("long").alias("key"), F.col("type"),
        *[F.lit(None).cast("long").alias(c) for c in
          ("first_value", "last_value", "first_offset", "last_offset", "first_vo_index", "last_vo_index")],
        F.lit("change").alias("kind"), F.col("f").alias("change_f"),
    )
    kept_rows = changes.select("process", "index", F.explode("keys").alias("key"), "type").select(
        "process", "index", "key", "type",
        *[F.lit(None).cast("long").alias(c) for c in
          ("first_value", "last_value", "first_offset", "last_offset", "first_vo_index", "last_vo_index")],
        F.lit("kept").alias("kind"), F.lit(None).cast("string").alias("change_f"),
    )
    by_process = Window.partitionBy("process").orderBy("index").rowsBetween(Window.unboundedPreceding, 0)
    stream = (
        seg_rows.unionByName(change_rows).unionByName(kept_rows)
        .withColumn("changes", F.sum(F.when(F.col("kind") == "change", 1).otherwise(0)).over(by_process))
        .withColumn("last_change_f", F.last("change_f", ignorenulls=True).over(by_process))
        .where(F.col("kind") != "change")
    )
    per_key = Window.partitionBy("process", "key").orderBy("index")
    before = per_key.rowsBetween(Window.unboundedPreceding, -1)
    upto = per_key.rowsBetween(Window.unboundedPreceding, 0)
    # The next segment is asked in the reversed order as the last one
    # before: Spark evaluates a frame that ends at the partition's end afresh
    # for every row, one that starts at its beginning in a single pass.
    after = Window.partitionBy("process", "key").orderBy(F.col("index").desc()).rowsBetween(
        Window.unboundedPreceding, -1
    )
    is_seg = F.col("kind") == "seg"
    stream = stream.withColumn("kept", F.sum(F.when(F.col("kind") == "kept", 1).otherwise(0)).over(upto))
    fields = F.struct(*_SEGMENT_FIELDS)
    prev_candidate = F.when(is_seg & F.col("type").isin(*previous_types), fields)
    next_candidate = F.when(is_seg, fields)
    neighbours = (
        stream.withColumn("prev", F.last(prev_candidate, ignorenulls=True).over(before))
        .withColumn("next", F.last(next_candidate, ignorenulls=True).over(after))
        .where(is_seg)
    )
    return neighbours.select(
        "process", "index", "key", "type", "first_value", "last_value", "first_offset", "last_offset",
        "first_vo_index", "last_vo_index", "prev", "next",
        (F.col("prev").isNotNull() & ((F.col("changes") - F.col("prev.changes")) == (F.col("kept") - F.col("prev.kept")))).alias("comparable_prev"),
        (F.col("next").isNotNull() & ((F.col("next.changes") - F.col("changes")) == (F.col("next.kept") - F.col("kept")))).alias("comparable_next"),
        F.coalesce(F.col("last_change_f") == "subscribe", F.lit(False)).alias("subscribed"),
    )


def _cross_pairs(neigh: DataFrame) -> DataFrame:
    pairs = neigh.where("comparable_prev")
    return pairs.select(
        "key",
        F.array("prev.last_value", "first_value").alias("values"),
        _delta(F.col("prev.last_vo_index"), F.col("first_vo_index")).alias("delta"),
        F.array("prev.index", "index").alias("op_indexes"),
        F.col("prev.index").alias("prev_index"),
        "index", "process", "subscribed",
        F.col("prev.last_vo_index").alias("prev_vo_index"),
        F.col("first_vo_index").alias("vo_index"),
    )


def read_neighbours(mops: DataFrame, vo: DataFrame, changes: DataFrame) -> DataFrame:
    """segment_neighbours of every completed poll/txn's reads, each read
    compared with the previous *acknowledged* read. poll-skip,
    nonmonotonic-poll and abort-position all start from this frame."""
    reads = polled(mops).where(F.col("f").isin("poll", "txn"))
    return segment_neighbours(segments(reads, vo), changes, ("ok",))


def poll_pairs(mops: DataFrame, vo: DataFrame, changes: DataFrame) -> DataFrame:
    """Consecutive reads of a key by one process: last of its previous ok read vs first of this one.

    Every completed poll/txn is checked against the previous *acknowledged*
    read (a failed or crashed op leaves the position unproven), as in Jepsen.
    """
    return _cross_pairs(read_neighbours(mops, vo, changes))


def send_pairs(mops: DataFrame, vo: DataFrame, changes: DataFrame) -> DataFrame:
    """Consecutive sends to a key by one process (ok and info completions only)."""
    writes = sends(mops).where(F.col("f").isin("send", "txn") & F.col("type").isin("ok", "info"))
    return _cross_pairs(segment_neighbours(segments(writes, vo), changes, ("ok", "info")))
