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


def deleted_topics(traces: DataFrame) -> list[str]:
    """Topics a DeleteTopics answer said were deleted (error code 0): one small job."""
    answered = traces.where((F.col("api") == "delete_topics") & (F.col("direction") == "response")).select(
        F.explode("partitions").alias("p")).where(F.col("p.error_code") == 0)
    return sorted({row[0] for row in answered.select("p.topic").distinct().collect()})


def set_aside_deleted(unseen: list[dict], derived: dict) -> list[dict]:
    """The unseen writes a read could still have found; those into topics deleted during the run are
    counted in `derived["deleted_unread"]` instead. Once its topic is gone, a write no consumer read
    cannot be told lost or merely unread: it is not judged, and says so, rather than made `unknown` (or,
    after final reads, lost)."""
    deleted = set(derived.get("deleted_topics") or ())
    if not deleted or not unseen:
        return unseen
    topic_of = {p["key"]: p["topic"] for p in derived["partitions"]}
    kept = [case for case in unseen if topic_of.get(case.get("key")) not in deleted]
    gone = [case for case in unseen if topic_of.get(case.get("key")) in deleted]
    if gone:
        derived["deleted_unread"] = {
            "writes": len(gone),
            "topics": sorted({topic_of[case["key"]] for case in gone}),
            "why": "acknowledged writes no consumer read before their topic was deleted (DeleteTopics): no "
                   "read can find them any more, so whether they were lost is not judged",
        }
    return kept


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


#: Classes a history written by the clients can show and one derived from the wire cannot, and why.
HISTORY_ONLY = {
    "precommitted-read": "a derived operation is a producer's transaction or a consumer's poll, never both: a "
                         "client that reads inside its own transaction shows as two processes",
    "abort-position": "it needs the reads a transaction made, and a derived transaction holds only its sends",
    "G1c": "its cycles need an operation that both wrote and read; derived operations do one or the other",
    "G1c-cycle-exists": "as G1c",
    "int-poll-skip": "a derived poll is one Fetch response, where the client's poll may join several",
    "int-nonmonotonic-poll": "as int-poll-skip",
}

#: History causes (`causes` of poll-skip cases) a derived history cannot establish, and why.
HISTORY_ONLY_CAUSES = {
    "read-in-aborted-txn": "which reads belonged to a transaction that aborted is the client's knowledge; on the "
                           "wire a consumer's reads are its own process's, all acknowledged (the exactly-once "
                           "check finds such input when the transaction commits its offsets)",
}
