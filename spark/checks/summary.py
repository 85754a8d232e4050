"""Counts for the report: operations by function and outcome, sends, records polled.

One aggregation over the operations, whatever the history's size: the
micro-op counts are read off each operation's own value, so nothing is
flattened or shuffled for them.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

_RAW_ARRAY = "array<string>"
_POLL_MAP = "map<string,array<array<long>>>"


def _micro_op_counts(value: F.Column) -> tuple[F.Column, F.Column]:
    """(send micro-ops, polled records with a value) in one operation's value."""
    parts = F.transform(F.from_json(value, _RAW_ARRAY), lambda m: F.from_json(m, _RAW_ARRAY))
    sends = F.size(F.filter(parts, lambda p: F.get(p, 0) == "send"))
    polls = F.filter(parts, lambda p: (F.get(p, 0) == "poll") & (F.size(p) > 1))
    records = F.aggregate(
        polls, F.lit(0),
        lambda total, p: total + F.aggregate(
            F.map_values(F.from_json(F.get(p, 1), _POLL_MAP)), F.lit(0),
            lambda inner, pairs: inner + F.size(F.filter(pairs, lambda r: F.get(r, 1).isNotNull())),
        ),
    )
    return F.coalesce(sends, F.lit(0)), F.coalesce(records, F.lit(0))


def summary(ops: DataFrame) -> DataFrame:
    """Per (f, type): ops, sends (micro-ops), polled (records), first/last time, last index.

    Sends and polled records count only data operations' completions (not
    invocations), as the checks see them.
    """
    sends, records = _micro_op_counts(F.col("value"))
    data = F.col("f").isin("send", "poll", "txn") & (F.col("type") != "invoke")
    return ops.groupBy("f", "type").agg(
        F.count(F.lit(1)).alias("ops"),
        F.sum(F.when(data, sends).otherwise(0)).alias("sends"),
        F.sum(F.when(data, records).otherwise(0)).alias("polled"),
        F.min("time").alias("first_time"),
        F.max("time").alias("last_time"),
        F.max("index").alias("last_index"),
    )


def summary_counts(rows) -> dict:  # noqa: ANN001 - summary's rows (or the frame itself)
    """Plain numbers for report.json.

    Returns ``{"ops": {f: {type: n}}, "sends_acknowledged": n,
    "sends_unknown": n, "sends_failed": n, "records_polled": n}``.
    """
    if hasattr(rows, "collect"):
        rows = rows.collect()
    out: dict = {"ops": {}, "sends_acknowledged": 0, "sends_unknown": 0, "sends_failed": 0, "records_polled": 0}
    for row in rows:
        out["ops"].setdefault(row["f"], {})[row["type"]] = row["ops"]
        name = {"ok": "sends_acknowledged", "info": "sends_unknown", "fail": "sends_failed"}.get(row["type"])
        if name:
            out[name] += row["sends"] or 0
        if row["type"] == "ok":
            out["records_polled"] += row["polled"] or 0
    return out
