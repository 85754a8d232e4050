"""What a derived history holds, and which checks it cannot speak to.

A check with nothing to look at passes vacuously; the report says so
instead (`stats.derived_history.not_applicable`), so "no torn transaction"
is never read off a run that had no transaction.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy_spark.derived.identity import Keys

_NO_TXN = "no transactional producer sent a record"
_NO_READS = "no consumer was delivered a record"

#: check -> (what it needs, why it does not apply without it)
NEEDS = {
    "torn-transaction": ("txns", _NO_TXN),
    "client-outcome-mismatch": ("txns", _NO_TXN),
    "G1a": ("reads", _NO_READS),
    "lost-write": ("reads", _NO_READS),
    "poll-skip": ("reads", _NO_READS),
    "nonmonotonic-poll": ("reads", _NO_READS),
    "duplicate": ("idempotent", "no producer is idempotent, so a record is known only by its offset"),
}


def derivation(ops: DataFrame, keys: Keys) -> dict:
    """Counts of what the derived history holds (one small job) and the checks that do not apply."""
    done = ops.where(F.col("type") != "invoke")
    row = done.agg(
        F.sum((F.col("f") == "txn").cast("int")).alias("txns"),
        F.sum((F.col("f") == "send").cast("int")).alias("sends"),
        F.sum((F.col("f") == "poll").cast("int")).alias("polls"),
        F.countDistinct(F.when(F.col("f") == "txn", F.col("process"))).alias("transactional_producers"),
        F.countDistinct(F.when(F.col("f") == "send", F.col("process"))).alias("other_producers"),
        F.countDistinct(F.when(F.col("f") == "poll", F.col("process"))).alias("consumers"),
    ).first()
    counts = {name: int(row[name] or 0) for name in
              ("txns", "sends", "polls", "transactional_producers", "other_producers", "consumers")}
    present = {"txns": counts["txns"] > 0, "reads": counts["polls"] > 0, "idempotent": keys.idempotent > 0}
    return {
        **counts,
        "partitions": [{"key": key, "topic": topic, "partition": partition}
                       for key, (topic, partition) in enumerate(keys.partitions)],
        "proxies": list(keys.proxy_ids),
        "not_applicable": {check: why for check, (need, why) in NEEDS.items() if not present[need]},
    }
