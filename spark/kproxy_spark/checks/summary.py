"""Counts for the report: operations by function and outcome, sends, records polled.

One aggregation over the operations, whatever the history's size; the
micro-op counts come from the per-key pass, which reads every micro-op anyway.
"""

from __future__ import annotations

from pyspark.sql import DataFrame
from pyspark.sql import functions as F


def summary(ops: DataFrame) -> DataFrame:
    """Per (f, type): ops, first/last time, last index. One aggregation over
    the operations; their values are not parsed here (the per-key pass counts
    the micro-ops, see kproxy_spark.checks.keypass)."""
    return ops.groupBy("f", "type").agg(
        F.count(F.lit(1)).alias("ops"),
        F.min("time").alias("first_time"),
        F.max("time").alias("last_time"),
        F.max("index").alias("last_index"),
    )


def summary_counts(rows, micro_ops: dict | None = None) -> dict:  # noqa: ANN001 - summary's rows (or the frame)
    """Plain numbers for report.json, from summary's rows and the pass's
    micro-op counts (``{("send"|"poll", f, type): n}``).

    Returns ``{"ops": {f: {type: n}}, "sends_acknowledged": n,
    "sends_unknown": n, "sends_failed": n, "records_polled": n}``.
    """
    if hasattr(rows, "collect"):
        rows = rows.collect()
    out: dict = {"ops": {}, "sends_acknowledged": 0, "sends_unknown": 0, "sends_failed": 0, "records_polled": 0}
    for row in rows:
        out["ops"].setdefault(row["f"], {})[row["type"]] = row["ops"]
    for (mop, _f, kind), n in (micro_ops or {}).items():
        name = {"ok": "sends_acknowledged", "info": "sends_unknown", "fail": "sends_failed"}.get(kind)
        if mop == "send" and name:
            out[name] += n
        elif mop == "poll" and kind == "ok":
            out["records_polled"] += n
    return out
