"""Write-write (G0) and write-read (G1c) cycles between transactions.

The dependency graph is Jepsen's queue graph: ``ww`` from the writer of a
value to the writer of the next value in the key's version order, ``wr``
from the writer of a value to every other operation that polled it. Nodes
are completed (``ok``/``info``) send/txn operations: an operation that writes
nothing has no outgoing edge and can be on no cycle.

The graph is built in Spark and kept small before it reaches the driver:
an operation that writes exactly one value and reads nothing is only a link
in its key's ww chain, so runs of such operations are collapsed into one ww
edge between the nearest operations that can branch (several writes, reads,
or a wr edge into one that reads). Edges that cannot lie on a cycle are
dropped in Spark as well (``cycle_candidates``), so the driver only holds the
part of the graph that could be cyclic. The driver then runs a bounded
search (see ``MAX_EDGES``/``MAX_SEEDS``) with networkx.
"""

from __future__ import annotations

import networkx as nx
from pyspark.sql import DataFrame, SparkSession, Window
from pyspark.sql import functions as F
from pyspark.sql.types import ArrayType, IntegerType, LongType, StringType, StructField, StructType

from spark.checks.orders import by_index, writer_of
from spark.history import polled, sends

#: The driver refuses to search more distinct candidate edges (those left
#: after ``cycle_candidates``) than this (about 1 GB of driver memory); the
#: run then reports
#: ``cycle-search-incomplete`` instead of guessing.
MAX_EDGES = 2_000_000
#: Per strongly connected component, how many seed edges are tried when looking
#: for the shortest cycle of each kind.
MAX_SEEDS = 32

STEP = StructType(
    [
        StructField("from_index", LongType()),
        StructField("to_index", LongType()),
        StructField("type", StringType()),
        StructField("key", LongType()),
        StructField("value", LongType()),
        StructField("value2", LongType()),
    ]
)
CYCLE_SCHEMA = StructType(
    [
        StructField("cycle", ArrayType(LongType())),
        StructField("processes", ArrayType(LongType())),
        StructField("steps", ArrayType(STEP)),
        StructField("length", IntegerType()),
    ]
)
INCOMPLETE_SCHEMA = StructType([StructField("edges", LongType()), StructField("max_edges", LongType())])

EDGE_COLUMNS = ["src", "dst", "type", "key", "value", "value2", "src_process", "dst_process"]


def dependency_edges(mops: DataFrame, vo: DataFrame) -> DataFrame:
    """The collapsed dependency graph: src, dst, type ('ww'|'wr'), key, value, value2, src_process, dst_process."""
    committed_writes = sends(mops).where(F.col("f").isin("send", "txn") & F.col("type").isin("ok", "info"))
    write_counts = committed_writes.groupBy("index").agg(F.count("*").alias("writes"))
    writers = writer_of(mops).where(F.col("writer_type").isin("ok", "info"))

    reads_by_writers = (
        polled(mops).where(F.col("type").isin("ok", "info"))
        .join(write_counts, "index", "left_semi")
    )
    wr = (
        reads_by_writers.join(writers, ["key", "value"])
        .where(F.col("writer_index") != F.col("index"))
        .groupBy(F.col("writer_index").alias("src"), F.col("index").alias("dst"))
        .agg(
            F.min(F.struct("key", "value")).alias("kv"),
            F.first("writer_process").alias("src_process"),
            F.first("process").alias("dst_process"),
        )
        .select(
            "src", "dst", F.lit("wr").alias("type"), F.col("kv.key").alias("key"), F.col("kv.value").alias("value"),
            F.lit(None).cast("long").alias("value2"), "src_process", "dst_process",
        )
    )

    branching = (
        write_counts.where("writes > 1").select("index")
        .unionByName(reads_by_writers.select("index"))
        .unionByName(wr.select(F.col("src").alias("index")))
        .distinct()
        .withColumn("branching", F.lit(True))
    )
    chain = (
        by_index(vo)
        .join(writers, ["key", "value"], "left")
        .join(branching, F.col("writer_index") == F.col("index"), "left")
        .withColumn("branching", F.coalesce("branching", F.lit(False)))
    )
    before = Window.partitionBy("key").orderBy("vo_index").rowsBetween(Window.unboundedPreceding, -1)
    link = F.struct(F.col("writer_index").alias("op"), F.col("value").alias("value"), F.col("writer_process").alias("process"))
    chain = (
        chain.withColumn("prev_branching", F.last(F.when(F.col("branching"), link), ignorenulls=True).over(before))
        .withColumn("prev_link", F.lag(F.when(F.col("writer_index").isNotNull(), link)).over(Window.partitionBy("key").orderBy("vo_index")))
        .where("branching")
    )

    def ww(src: str, dst_op: str, dst_value: str, dst_process: str, src_value: str, src_process: str) -> list:
        return [
            F.col(src).alias("src"), F.col(dst_op).alias("dst"), F.lit("ww").alias("type"), F.col("key"),
            F.col(src_value).alias("value"), F.col(dst_value).alias("value2"),
            F.col(src_process).alias("src_process"), F.col(dst_process).alias("dst_process"),
        ]

    collapsed = chain.where("prev_branching IS NOT NULL AND prev_branching.op != writer_index").select(
        *ww("prev_branching.op", "writer_index", "value", "writer_process", "prev_branching.value", "prev_branching.process")
    )
    # An operation whose own writes are split by others' single writes: the
    # collapsed edge would be a self-loop, so keep the last link explicitly.
    split = chain.where(
        "prev_branching IS NOT NULL AND prev_branching.op = writer_index "
        "AND prev_link IS NOT NULL AND prev_link.op != writer_index"
    )
    into_split = split.select(
        *ww("writer_index", "prev_link.op", "prev_link.value", "prev_link.process", "prev_branching.value", "writer_process")
    )
    out_of_split = split.select(
        *ww("prev_link.op", "writer_index", "value", "writer_process", "prev_link.value", "prev_link.process")
    )
    return wr.unionByName(collapsed).unionByName(into_split).unionByName(out_of_split).select(*EDGE_COLUMNS)


def _interval_groups(pairs: DataFrame) -> DataFrame:
    """node, group: the nodes that some cycle could pass through, numbered by
    the stretch of node ids they lie in.

    Number the nodes (operation indexes, roughly time). An edge to a smaller
    number is a backward edge. Along a cycle the numbers must come down
    again, so every number between a cycle's lowest and highest node is
    spanned by one of its backward edges [dst, src]: the whole cycle lies in
    one run of overlapping backward spans. A node outside every span, or an
    edge whose ends lie in different runs, is on no cycle. One sort over the
    nodes and spans, no iteration; on a history whose dependencies all point
    forward in time (every clean one) nothing survives.
    """
    spans = pairs.where(F.col("src") > F.col("dst")).select(
        F.col("dst").alias("pos"), F.lit(0).alias("kind"), F.col("src").alias("hi")
    )
    nodes = (
        pairs.select(F.col("src").alias("pos")).unionByName(pairs.select(F.col("dst").alias("pos"))).distinct()
        .select("pos", F.lit(1).alias("kind"), F.lit(None).cast("long").alias("hi"))
    )
    # A span sorts before a node at the same number: spans are closed.
    ordered = Window.orderBy("pos", "kind")
    reach = F.max("hi").over(ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow))
    reach_before = F.max("hi").over(ordered.rowsBetween(Window.unboundedPreceding, -1))
    starts_run = (F.col("kind") == 0) & (reach_before.isNull() | (F.col("pos") > reach_before))
    return (
        spans.unionByName(nodes)
        .withColumn("reach", reach)
        .withColumn("group", F.sum(starts_run.cast("long")).over(
            ordered.rowsBetween(Window.unboundedPreceding, Window.currentRow)))
        .where((F.col("kind") == 1) & (F.col("reach") >= F.col("pos")))
        .select(F.col("pos").alias("node"), "group")
    )


def cycle_candidates(pairs: DataFrame, rounds: int = 3) -> DataFrame:
    """The (src, dst) pairs that can lie on a cycle, found in Spark so the
    driver only receives what could be cyclic.

    Keeps every edge of every cycle (so the strongly connected components,
    and the edges inside each, are those of the whole graph): first the
    backward-span bound of ``_interval_groups``, then ``rounds`` rounds of
    dropping edges that leave a node nothing enters or enter a node nothing
    leaves (sources and sinks: no cycle passes through them).

    Every step reads the previous one several times, so each is
    checkpointed (computed once, lineage cut): otherwise the plan, and the
    time Spark spends planning it, triples with every round.
    """
    pairs = pairs.localCheckpoint()
    groups = _interval_groups(pairs)
    src_group = groups.select(F.col("node").alias("src"), F.col("group").alias("src_group"))
    dst_group = groups.select(F.col("node").alias("dst"), F.col("group").alias("dst_group"))
    candidates = (
        pairs.join(src_group, "src").join(dst_group, "dst")
        .where(F.col("src_group") == F.col("dst_group"))
        .select("src", "dst")
        .localCheckpoint()
    )
    for _ in range(rounds):
        entered = candidates.select(F.col("dst").alias("src")).distinct()
        left = candidates.select(F.col("src").alias("dst")).distinct()
        candidates = (
            candidates.join(entered, "src", "left_semi").join(left, "dst", "left_semi")
            .select("src", "dst")
            .localCheckpoint()
        )
    return candidates


def _shortest_path(graph: nx.DiGraph, source: int, target: int) -> list[int] | None:
    try:
        return nx.shortest_path(graph, source, target)
    except nx.NetworkXNoPath:
        return None


def _shortest_cycle_through(graph: nx.DiGraph, seeds: list[tuple[int, int]]) -> list[int] | None:
    """Shortest cycle that uses one of the seed edges (u, v): u, v, ..., u."""
    best = None
    for u, v in seeds[:MAX_SEEDS]:
        path = _shortest_path(graph, v, u)
        if path is not None and (best is None or len(path) + 1 < len(best)):
            best = [u, *path]
    return best


def _steps(graph: nx.DiGraph, cycle: list[int], forced_wr: tuple[int, int] | None) -> list[dict]:
    steps = []
    for a, b in zip(cycle, cycle[1:]):
        kinds = graph.edges[a, b]["kinds"]
        kind = "wr" if (a, b) == forced_wr or "ww" not in kinds else "ww"
        key, value, value2 = kinds[kind]
        steps.append({"from_index": a, "to_index": b, "type": kind, "key": key, "value": value, "value2": value2})
    return steps


def find_cycles(edges: list[tuple]) -> dict[str, list[dict]]:
    """Driver-side search over a small collapsed graph: at most one G0 and one G1c per component."""
    graph = nx.DiGraph()
    process_of: dict[int, int] = {}
    for src, dst, kind, key, value, value2, src_process, dst_process in edges:
        if not graph.has_edge(src, dst):
            graph.add_edge(src, dst, kinds={})
        graph.edges[src, dst]["kinds"].setdefault(kind, (key, value, value2))
        process_of[src] = src_process
        process_of[dst] = dst_process

    found: dict[str, list[dict]] = {"G0": [], "G1c": []}

    def record(name: str, cycle: list[int], forced_wr=None) -> None:
        steps = _steps(graph, cycle, forced_wr)
        found[name].append(
            {"cycle": cycle, "processes": [process_of.get(n) for n in cycle], "steps": steps, "length": len(cycle) - 1}
        )

    for component in nx.strongly_connected_components(graph):
        if len(component) < 2:
            continue
        sub = graph.subgraph(component)
        ww_only = nx.DiGraph((a, b) for a, b, d in sub.edges(data=True) if "ww" in d["kinds"])
        for ww_component in nx.strongly_connected_components(ww_only):
            if len(ww_component) > 1:
                ww_sub = ww_only.subgraph(ww_component)
                cycle = _shortest_cycle_through(ww_sub, list(ww_sub.edges()))
                if cycle:
                    record("G0", cycle)
        wr_seeds = [(a, b) for a, b, d in sub.edges(data=True) if "wr" in d["kinds"]]
        cycle = _shortest_cycle_through(sub, wr_seeds)
        if cycle:
            record("G1c", cycle, forced_wr=(cycle[0], cycle[1]))
    return found


def _nodes_on_cycles(pairs: list[tuple[int, int]]) -> set[int]:
    graph = nx.DiGraph(pairs)
    return {node for component in nx.strongly_connected_components(graph) if len(component) > 1 for node in component}


def cycle_checks(spark: SparkSession, mops: DataFrame, vo: DataFrame) -> dict[str, DataFrame]:
    """``G0`` and ``G1c`` cases; plus ``cycle-search-incomplete`` when the
    edges that could be on a cycle exceed MAX_EDGES.

    Spark first drops what can be on no cycle (``cycle_candidates``); only the
    bare (src, dst) pairs left travel to the driver, and the explained edges
    are fetched for the few operations that sit on a cycle at all.
    """
    edges = dependency_edges(mops, vo).cache()
    try:
        candidates = cycle_candidates(edges.select("src", "dst").distinct())
        pairs = [tuple(r) for r in candidates.limit(MAX_EDGES + 1).collect()]
        if len(pairs) > MAX_EDGES:
            empty = spark.createDataFrame([], CYCLE_SCHEMA)
            return {
                "G0": empty,
                "G1c": empty,
                "cycle-search-incomplete": spark.createDataFrame([(len(pairs), MAX_EDGES)], INCOMPLETE_SCHEMA),
            }
        on_cycles = _nodes_on_cycles(pairs)
        if on_cycles:
            nodes = F.broadcast(spark.createDataFrame([(n,) for n in sorted(on_cycles)], "op long"))
            rows = (
                edges.join(nodes.withColumnRenamed("op", "src"), "src", "left_semi")
                .join(nodes.withColumnRenamed("op", "dst"), "dst", "left_semi")
                .select(*EDGE_COLUMNS)
                .collect()
            )
            found = find_cycles([tuple(r) for r in rows])
        else:
            found = {"G0": [], "G1c": []}
    finally:
        edges.unpersist()
    return {name: spark.createDataFrame(cases, CYCLE_SCHEMA) for name, cases in found.items()}
