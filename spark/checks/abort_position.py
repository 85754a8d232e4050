"""Where a consumer reads next after its transaction aborted (KAFKA-17582).

After an abort, a transactional consume-process-produce loop expects its
consumer to go back to the last committed position (the start of the aborted
transaction's reads) so the records are processed again. Clients differ: some
keep their in-memory position and *advance*, some *rewind* to the committed
position, and some have been seen to *rewind-further*, re-reading records a
committed transaction already consumed.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.checks.contiguity import read_neighbours

POSITIONS = ("advance", "rewind", "rewind-further")


def abort_positions(mops: DataFrame, vo: DataFrame, changes: DataFrame, ops: DataFrame) -> DataFrame:
    """One row per aborted transaction and key it read, with the next read of that key by the process.

    Only definite aborts (``fail`` txn completions) are classified, and only
    when the process read the key again with no assignment change or crash
    in between. Positions are compared in the version order:
    next first position > aborted last position -> advance; within the
    aborted range -> rewind; before the aborted first position -> rewind-further.

    Columns: key, process, abort_index, error, next_index, aborted_first_offset,
    aborted_last_offset, next_first_offset, aborted_first_value,
    aborted_last_value, next_first_value, position.
    """
    neigh = read_neighbours(mops, vo, changes)
    aborted_txns = ops.where((F.col("f") == "txn") & (F.col("type") == "fail")).select(
        F.col("index"), "error"
    )
    aborted = neigh.join(aborted_txns, "index").where(
        "comparable_next AND last_vo_index IS NOT NULL AND first_vo_index IS NOT NULL "
        "AND next.first_vo_index IS NOT NULL"
    )
    nxt = F.col("next.first_vo_index")
    position = (
        F.when(nxt > F.col("last_vo_index"), F.lit("advance"))
        .when(nxt >= F.col("first_vo_index"), F.lit("rewind"))
        .otherwise(F.lit("rewind-further"))
    )
    return aborted.select(
        "key", "process",
        F.col("index").alias("abort_index"),
        "error",
        F.col("next.index").alias("next_index"),
        F.col("first_offset").alias("aborted_first_offset"),
        F.col("last_offset").alias("aborted_last_offset"),
        F.col("next.first_offset").alias("next_first_offset"),
        F.col("first_value").alias("aborted_first_value"),
        F.col("last_value").alias("aborted_last_value"),
        F.col("next.first_value").alias("next_first_value"),
        position.alias("position"),
    ).orderBy("abort_index", "key")
