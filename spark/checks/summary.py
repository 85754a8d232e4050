"""Counts for the report: operations by function and outcome, sends acknowledged, records polled."""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from spark.history import flatten_mops, polled, sends

SUMMARY_COLUMNS = ["metric", "f", "type", "count"]


def summary_from(ops: DataFrame, mops: DataFrame) -> DataFrame:
    """metric, f, type, count. Metrics: ``ops`` (per f and type), ``sends`` and
    ``polled-records`` (micro-op counts per f and completion type)."""
    by_op = ops.groupBy("f", "type").agg(F.count("*").alias("count")).select(
        F.lit("ops").alias("metric"), "f", "type", "count"
    )
    sent = sends(mops).groupBy("f", "type").agg(F.count("*").alias("count")).select(
        F.lit("sends").alias("metric"), "f", "type", "count"
    )
    read = polled(mops).groupBy("f", "type").agg(F.count("*").alias("count")).select(
        F.lit("polled-records").alias("metric"), "f", "type", "count"
    )
    return by_op.unionByName(sent).unionByName(read)


def summary(ops: DataFrame) -> DataFrame:
    return summary_from(ops, flatten_mops(ops))


def summary_counts(summary_df: DataFrame) -> dict:
    """Collect the (small) summary into plain numbers for report.json.

    Returns ``{"ops": {f: {type: n}}, "sends_acknowledged": n,
    "sends_unknown": n, "sends_failed": n, "records_polled": n}``.
    """
    out: dict = {"ops": {}, "sends_acknowledged": 0, "sends_unknown": 0, "sends_failed": 0, "records_polled": 0}
    for metric, f, kind, count in summary_df.select(*SUMMARY_COLUMNS).collect():
        if metric == "ops":
            out["ops"].setdefault(f, {})[kind] = count
        elif metric == "sends":
            name = {"ok": "sends_acknowledged", "info": "sends_unknown", "fail": "sends_failed"}.get(kind)
            if name:
                out[name] += count
        elif metric == "polled-records" and kind == "ok":
            out["records_polled"] += count
    return out
