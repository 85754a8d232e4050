"""The history checks as one grouped pass over the history, partitioned by key.

Every Kafka queue check except the dependency cycles is per key, so the
history is partitioned by key once and each key's rows go through
kproxy_spark.checks.kernel.check_key in one ``groupBy("key").applyInArrow`` call.
Its output is one frame of every check's cases (a ``check`` column and the
case as JSON), the keys' dependency edges and their unseen-writes series,
collected once. Its input is each operation's events on each key, made in
Python and packed per operation and key (kproxy_spark.checks.op_events);
what crosses keys travels with them, per operation: how many committed
writes it made and whether it read anything (the cycle graph's collapsing).

Each process's membership changes (poll-skip's reset, ``subscribed``) are
few: they are collected first and broadcast to every key
(kproxy_spark.checks.membership).

An ``info`` send proven committed by a read of another key is settled
after the pass (``run_pass``).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np
import orjson
from pyspark.sql import DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import LongType, StringType, StructField, StructType

from kproxy_spark.checks.cycles import Edge
from kproxy_spark.checks.kernel import KEY_CHECKS, UNSEEN_BUCKET_NS, check_key
from kproxy_spark.checks.keyview import Event
from kproxy_spark.checks.membership import Membership, collect_membership
from kproxy_spark.checks.op_events import events_of, key_events
from kproxy_spark.gc_pause import collector_paused
from kproxy_spark.session import pass_partitions, rows_frame, rows_table, storage_level

#: The pass's output, one row per finding: a case (check, key, sort, case
#: JSON); an edge ('~edge' and the edge's fields); an unseen delta
#: ('~unseen': sort = bucket, value = delta); a micro-op count ('~micro-ops':
#: etype = "mop:f", case = type, value = count); an info op this key proved
#: or left unproven ('~proven' / '~unproven': sort = op index).
OUTPUT_SCHEMA = StructType(
    [
        StructField("check", StringType()),
        StructField("key", LongType()),
        StructField("sort", LongType()),
        StructField("case", StringType()),
        StructField("src", LongType()),
        StructField("dst", LongType()),
        StructField("etype", StringType()),
        StructField("value", LongType()),
        StructField("value2", LongType()),
        StructField("src_process", LongType()),
        StructField("dst_process", LongType()),
    ]
)
EDGE, UNSEEN, MICRO_OPS, PROVEN, UNPROVEN = "~edge", "~unseen", "~micro-ops", "~proven", "~unproven"


#: OUTPUT_SCHEMA as rows_table's columns.
OUTPUT_COLUMNS = [(f.name, "int64" if isinstance(f.dataType, LongType) else "string") for f in OUTPUT_SCHEMA.fields]


def _output(rows: list[tuple]):  # noqa: ANN202
    return rows_table(rows, OUTPUT_COLUMNS)


def key_rows(key: int, events: list[Event], ww_deps: bool, bucket_ns: int,
             proven: frozenset[int] = frozenset(), membership: Membership | None = None) -> list[tuple]:
    """check_key's findings for one key (events ordered) as OUTPUT_SCHEMA rows."""
    result = check_key(key, events, ww_deps, bucket_ns, ordered=True, proven_elsewhere=proven,
                       membership=membership)
    rows: list[tuple] = []
    for name, cases in result.cases.items():
        order = KEY_CHECKS[name]
        for case in cases:
            rows.append((name, key, case.get(order), orjson.dumps(case).decode(), *([None] * 7)))
    for e in result.edges:
        rows.append((EDGE, e.key, None, None, e.src, e.dst, e.type, e.value, e.value2, e.src_process, e.dst_process))
    for bucket, delta in result.unseen_deltas.items():
        rows.append((UNSEEN, key, bucket, None, None, None, None, delta, None, None, None))
    for (mop, f, kind), n in result.micro_ops.items():
        rows.append((MICRO_OPS, key, None, kind, None, None, f"{mop}:{f}", n, None, None, None))
    for op in result.proven:
        rows.append((PROVEN, key, op, None, None, None, None, None, None, None, None))
    for op in result.unproven:
        rows.append((UNPROVEN, key, op, None, None, None, None, None, None, None, None))
    return rows


def history_pass(ops: DataFrame, ww_deps: bool = True, bucket_ns: int = UNSEEN_BUCKET_NS,
                 proven: frozenset[int] = frozenset(), membership: Membership | None = None) -> DataFrame:
    """Every key's findings (OUTPUT_SCHEMA); lazy: nothing runs until
    collected. ``proven``: info ops known to be committed (see run_pass);
    ``membership``: the processes' membership changes (collected from ops
    when not given: one small job)."""
    if membership is None:
        membership = collect_membership(ops)
    shared = _shared_with_tasks(ops.sparkSession, membership)

    def per_key(table):  # noqa: ANN001, ANN202 - pyarrow.Table in and out
        key = table.column("key")[0].as_py()
        with collector_paused():
            return _output(key_rows(key, events_of(table), ww_deps, bucket_ns, proven, shared()))

    events = key_events(ops)
    spread = pass_partitions(ops.sparkSession)
    if spread is not None:
        events = events.repartition(spread, "key")  # the groupBy keeps this partitioning: one shuffle
    return events.groupBy("key").applyInArrow(per_key, OUTPUT_SCHEMA)


def _shared_with_tasks(spark, value: Membership) -> Callable[[], Membership]:
    """How every task of the pass reads `value`: a broadcast variable on a
    classic session (sent once per executor); on Spark Connect, which has no
    broadcast variables (they are the SparkContext's), inside the pass's own
    function, pickled with it into the plan. Either way every key sees the
    same membership, so the cases are the same."""
    from kproxy_spark.session import is_connect

    if is_connect(spark):
        return lambda: value
    broadcast = spark.sparkContext.broadcast(value)
    return lambda: broadcast.value


@dataclass
class PassResult:
    """The collected pass: cases by check (ordered), the dependency graph's
    (src, dst) pairs, unseen deltas per bucket, micro-op counts.

    The graph can have tens of millions of edges, so only its bare pairs
    come to the driver (two int64 arrays); ``explain(nodes)`` fetches the
    full edges between the given operations, for the few that lie on a
    cycle, from the pass's kept output.
    """

    cases: dict[str, list[dict]] = field(default_factory=dict)
    edge_src: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    edge_dst: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))
    edge_ww: np.ndarray = field(default_factory=lambda: np.empty(0, bool))
    explain: Callable[[set[int]], list[Edge]] = lambda nodes: []  # noqa: E731
    #: Drops the kept pass output once the cycle search is done.
    release: Callable[[], object] = lambda: None  # noqa: E731
    unseen_deltas: Counter = field(default_factory=Counter)
    unseen_by_key: dict[int, Counter] = field(default_factory=dict)
    #: (mop 'send'|'poll', f, type) -> completed send micro-ops / polled records.
    micro_ops: Counter = field(default_factory=Counter)
    #: Info ops some key's reads proved committed; info ops some key left unproven.
    proven: set[int] = field(default_factory=set)
    unproven: set[int] = field(default_factory=set)


def run_pass(ops: DataFrame, ww_deps: bool = True, bucket_ns: int = UNSEEN_BUCKET_NS) -> PassResult:
    """The history pass, collected, with Jepsen's proof of info sends across keys.

    An info operation must have committed once an acknowledged poll read
    any of its values, on any key. Each key proves what its own reads show;
    only when an operation proven on one key is unproven on another (an
    info transaction that wrote several keys) does the pass run again,
    told which operations are proven. That is rare, and cheaper than
    joining every read against every send before the pass.
    """
    membership = collect_membership(ops)
    result = collect_pass(history_pass(ops, ww_deps, bucket_ns, membership=membership))
    if result.proven & result.unproven:
        proven = frozenset(result.proven)
        result.release()
        result = collect_pass(history_pass(ops, ww_deps, bucket_ns, proven, membership))
    return result


def collect_pass(frame: DataFrame) -> PassResult:
    """Collect the pass: its findings in one job, the graph's pairs in a
    second (read from the kept output), the explained edges of operations on
    a cycle in a third only when there are any."""
    kept = frame.persist(storage_level(frame.sparkSession))
    result = read_rows(kept.where(F.col("check") != EDGE).toArrow().to_pylist())
    pairs = kept.where(F.col("check") == EDGE).select("src", "dst", (F.col("etype") == "ww").alias("ww")).toArrow()
    result.edge_src = pairs.column("src").to_numpy()
    result.edge_dst = pairs.column("dst").to_numpy()
    result.edge_ww = pairs.column("ww").to_numpy(zero_copy_only=False)

    def explain(nodes: set[int]) -> list[Edge]:
        if not nodes:
            return []
        ids = rows_frame(kept.sparkSession, [(n,) for n in sorted(nodes)], [("op", "int64")])
        rows = (
            kept.where(F.col("check") == EDGE)
            .join(F.broadcast(ids.withColumnRenamed("op", "src")), "src", "left_semi")
            .join(F.broadcast(ids.withColumnRenamed("op", "dst")), "dst", "left_semi")
            .collect()
        )
        return [Edge(r["src"], r["dst"], r["etype"], r["key"], r["value"], r["value2"], r["src_process"],
                     r["dst_process"]) for r in rows]

    result.explain = explain
    result.release = kept.unpersist
    return result


def read_rows(rows: list[dict]) -> PassResult:
    """Every row of the pass except the edges, sorted into a PassResult."""
    result = PassResult(cases={name: [] for name in KEY_CHECKS})
    ordered: dict[str, list[tuple]] = {name: [] for name in KEY_CHECKS}
    for row in rows:
        check = row["check"]
        if check == MICRO_OPS:
            mop, f = row["etype"].split(":", 1)
            result.micro_ops[(mop, f, row["case"])] += row["value"]
        elif check == PROVEN:
            result.proven.add(row["sort"])
        elif check == UNPROVEN:
            result.unproven.add(row["sort"])
        elif check == UNSEEN:
            result.unseen_deltas[row["sort"]] += row["value"]
            result.unseen_by_key.setdefault(row["key"], Counter())[row["sort"]] += row["value"]
        else:
            ordered[check].append((row["sort"] if row["sort"] is not None else -1, row["key"], row["case"]))
    for name, found in ordered.items():
        result.cases[name] = [orjson.loads(case) for _, _, case in sorted(found)]
    return result


VERSION_ORDER_SCHEMA = "key long, offset long, value long, vo_index long"


def version_orders(ops: DataFrame) -> DataFrame:
    """key, offset, value, vo_index: each key's log as sends and polls observed it."""

    def per_key(table):  # noqa: ANN001, ANN202
        import pyarrow as pa

        from kproxy_spark.checks.keyview import KeyView

        key = table.column("key")[0].as_py()
        with collector_paused():
            vo = KeyView(key, events_of(table), ordered=True).vo
        return pa.table({
            "key": pa.array([key] * len(vo), pa.int64()),
            "offset": pa.array([o for o, _, _ in vo], pa.int64()),
            "value": pa.array([v for _, v, _ in vo], pa.int64()),
            "vo_index": pa.array([i for _, _, i in vo], pa.int64()),
        })

    return key_events(ops).groupBy("key").applyInArrow(per_key, VERSION_ORDER_SCHEMA)
