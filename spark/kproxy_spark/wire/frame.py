"""Every wire check and table as one frame, collected in one Spark job, and
its rows read back on the driver, where each case's sentence is rendered."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame

from kproxy_spark.wire.check import Order
from kproxy_spark.wire.registry import BY_NAME, WIRE_CHECKS, WIRE_ORDER, WIRE_TABLES
from kproxy_spark.wire.views import WireParts, WireViews, wire_views


def wire_frame(ops: DataFrame, traces: DataFrame, isolation: str = "auto",
               cached: list | None = None, parts: WireParts | None = None) -> DataFrame:
    """Every wire check's cases and every wire table in one frame (check,
    case as JSON), so the whole wire analysis is collected in one Spark job.
    `isolation` says how to tell read_committed fetches
    (kproxy_spark.wire.landings.fetched_records). What is kept here (the views'
    rows) is appended to `cached`, for the caller to release
    (``unpersist()``). `parts`: the views of the traces alone, when the caller built them
    (kproxy_spark.wire.views.wire_parts)."""
    return checks_frame(kept_views(ops, traces, isolation, cached, parts))


def kept_views(ops: DataFrame, traces: DataFrame, isolation: str = "auto",
               cached: list | None = None, parts: WireParts | None = None) -> WireViews:
    """The views the checks read, kept until the caller releases `cached`
    (the report's pictures read them again after the checks)."""
    from kproxy_spark.session import keep, one_partition

    level = traces.storageLevel
    ops = one_partition(ops)
    traces = one_partition(traces)
    if not (level.useMemory or level.useDisk):
        # Traces the caller did not cache (a test's literal files) would be
        # read, and their side files decoded, once per view and check.
        traces = keep(traces, cached)
    return wire_views(ops, traces, isolation, cached, parts)


def checks_frame(views: WireViews) -> DataFrame:
    """wire_frame over views already built. An entry its trace cannot feed
    (kproxy_spark.wire.check.built) has no part: it reads back as no rows."""
    parts = [
        json_rows(frame, "check", entry.name, "case")
        for entry in (*WIRE_CHECKS, *WIRE_TABLES)
        for frame in (entry.frame(views),)
        if frame is not None
    ]
    # Unioned pairwise, as a balanced tree: Spark checks the whole plan of
    # each union it is handed, so a chain of twenty costs the driver as much
    # as two hundred unions of one part (0.9 s against 0.3 s on a small trace).
    while len(parts) > 1:
        parts = [parts[i].union(parts[i + 1]) if i + 1 < len(parts) else parts[i] for i in range(0, len(parts), 2)]
    from kproxy_spark.session import shuffles_into_one

    frame = parts[0]
    # A union has a partition per part, and each partition's task is sent the
    # whole union's plan: on a small input, twenty-odd tasks spent 57 ms each
    # deserialising it to compute a few rows. Where every part is one
    # partition anyway, one task computes them all from one copy.
    return frame.coalesce(1) if shuffles_into_one(frame.sparkSession) else frame


def json_rows(frame: DataFrame, label: str, name: str, into: str, fields: tuple[str, ...] = ()) -> DataFrame:
    """`frame` as (label = name, into = each row's `fields` (all when none) as one JSON object, nulls
    kept), in one expression: built from Column objects it cost a call into the JVM per column."""
    if "'" in name or any("`" in f for f in fields):
        raise ValueError(f"a name Spark SQL would have to quote: {name!r} {fields!r}")
    struct = ", ".join(f"`{f}`" for f in fields) if fields else "*"
    return frame.selectExpr(f"'{name}' AS `{label}`", f"to_json(struct({struct}), map('ignoreNullFields', 'false')) AS `{into}`")


def order_key(fields: Order):
    def key(case: dict) -> tuple:
        # Spark's ascending order: nulls first unless asked last.
        return tuple(
            ((1, 0) if last else (0, 0)) if case.get(name) is None else ((0, case[name]) if last else (1, case[name]))
            for name, last in fields
        )

    return key


def read_wire_rows(rows) -> tuple[dict[str, list[dict]], dict]:
    """wire_frame's collected rows -> (cases by check, in report order, each
    with its sentence; the stats they give).

    The cases keep ``~rule-touches``, ``~rule-writes`` and ``~value-facts``
    for kproxy_spark.attribution, which ties cases to their causes and builds
    ``fault-impact``."""
    import orjson

    tables: dict[str, list[dict[str, Any]]] = {name: [] for name in WIRE_ORDER}
    for row in rows:
        tables[row["check"]].append(orjson.loads(row["case"]))
    for name, found in tables.items():
        entry = BY_NAME[name]
        found.sort(key=order_key(entry.order))
        if entry.explain is not None:
            for case in found:
                case[entry.text_field] = entry.explain(case)
    offset = tables.pop("~clock-offset")
    offset_ns = offset[0]["d"] if offset and offset[0].get("d") is not None else None
    stats = {
        "trace_events": tables.pop("~trace-events")[0]["events"],
        "trace_clock_offset_ns": offset_ns,
        "phases": [
            {**p, "start_ns": p["start_ns"] + offset_ns, "end_ns": p["end_ns"] + offset_ns}
            for p in tables.pop("~phases")
        ] if offset_ns is not None else [],
        "end_txn_outcomes": tables.pop("~end-txn-outcomes"),
    }
    return tables, stats
