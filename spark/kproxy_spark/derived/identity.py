"""Every traced record named by numbers the checks compare: its partition's
key and its identity on the wire.

The history checks and the wire checks match sends, reads and the log by
`(key, value)` as integers, which only kproxy's own workload writes into
its records. Here a record's key becomes the number of its topic-partition
(one key per partition, as the workload keeps one partition per key) and
its value the record's identity:

* an idempotent or transactional producer's record: a hash of (producer
  id, epoch, sequence), the same in the Produce request that sent it and in
  every Fetch response that returns it, and in a retry of the same batch;
* any other record: its offset, which a Produce request does not know yet
  (its value stays null there; the derived history takes the offset the
  answer gave).

The rewrite is applied to the trace frame itself (`partitions` and
`upstream_partitions`), so every reader downstream sees the same numbers.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

# Produce and Fetch events carry records; the keys come from their partitions.
RECORD_APIS = ("produce", "fetch")


@dataclass(frozen=True)
class Keys:
    """The topic-partitions the trace's records live in, numbered in sorted order, and the proxies."""

    partitions: tuple[tuple[str, int], ...]
    proxy_ids: tuple[str, ...]
    records: int  # events whose partitions carry records: 0 means the trace is not at level `records`
    idempotent: int = 0  # records of idempotent or transactional producers

    def number(self) -> dict[tuple[str, int], int]:
        return {tp: i for i, tp in enumerate(self.partitions)}


def collect_keys(traces: DataFrame) -> Keys:
    """One job: the topic-partitions that hold records, the proxy ids, and how many events carry records."""
    events = traces.where(F.col("api").isin(*RECORD_APIS) & F.col("partitions").isNotNull())
    parts = events.select(
        "proxy_id",
        F.explode(F.filter("partitions", lambda p: F.coalesce(F.size(p["records"]), F.lit(0)) > 0)).alias("p"),
    )
    idempotent = F.size(F.filter("p.records", lambda r: (r["producer_id"] >= 0) & (r["sequence"] >= 0)))
    rows = parts.groupBy(F.col("p.topic").alias("topic"), F.col("p.partition").alias("partition")).agg(
        F.collect_set("proxy_id").alias("proxies"), F.count(F.lit(1)).alias("events"),
        F.sum(idempotent).alias("idempotent")).collect()
    partitions = tuple(sorted((r["topic"], int(r["partition"])) for r in rows if r["topic"] is not None))
    proxies = tuple(sorted({p or "" for r in rows for p in r["proxies"]}))
    return Keys(partitions, proxies, sum(int(r["events"]) for r in rows), sum(int(r["idempotent"] or 0) for r in rows))


def record_value(record: Column) -> Column:
    """A data record's identity as a decimal text: a 62-bit hash of (producer id, epoch, sequence) for an
    idempotent producer, else its offset (null in a Produce request)."""
    idempotent = (record["producer_id"] >= 0) & (record["sequence"] >= 0)
    hashed = F.shiftrightunsigned(F.xxhash64(record["producer_id"], record["producer_epoch"], record["sequence"]), 2)
    return F.when(record["control"].isNotNull(), F.lit(None).cast("string")).when(
        idempotent, hashed.cast("string")).otherwise(record["offset"].cast("string"))


def partition_key(keys: Keys, topic: Column, partition: Column) -> Column:
    """The key number of (topic, partition); null for a partition no record was seen in."""
    numbers = F.create_map(*[lit for (name, index), key in keys.number().items()
                             for lit in (F.lit(f"{name}\u0000{index}"), F.lit(key))])
    return F.element_at(numbers, F.concat_ws("\u0000", topic, partition.cast("string")))


def _identified(partitions: Column, keys: Keys) -> Column:
    def one(part: Column) -> Column:
        key = partition_key(keys, part["topic"], part["partition"])
        records = F.transform(part["records"], lambda r: r.withField("key", F.when(
            r["control"].isNull(), key.cast("string"))).withField("value", record_value(r)))
        return part.withField("records", records)

    return F.transform(partitions, one)


def identify_records(traces: DataFrame, keys: Keys) -> DataFrame:
    """The traces with every record's key and value replaced by its partition's key and its identity."""
    if not keys.partitions:
        return traces
    return traces.withColumn("partitions", _identified(F.col("partitions"), keys)).withColumn(
        "upstream_partitions", _identified(F.col("upstream_partitions"), keys))
