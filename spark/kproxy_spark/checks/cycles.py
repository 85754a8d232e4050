"""Write-write (G0) and write-read (G1c) cycles between transactions.

The dependency graph is Jepsen's queue graph: ``wr`` from the writer of a
value to every other writing operation that polled it and, with ``ww_deps``
(Jepsen's ``--ww-deps``), ``ww`` from the writer of a value to the writer of
the next value in the key's version order. Nodes are completed
(``ok``/``info``) send/txn operations: an operation that writes nothing has
no outgoing edge and can be on no cycle.

Each key's edges come out of the grouped per-key pass (``key_edges``), kept
small there: an operation that writes exactly one value and reads nothing is
only a link in its key's ww chain, so runs of such operations are collapsed
into one ww edge between the nearest operations that can branch (several
writes, reads, or a wr edge out of it). The driver then drops what can be on
no cycle (``prune``: one sort over backward spans, then a few
rounds of source/sink removal, vectorised with numpy) and searches what
survives with networkx, up to ``MAX_EDGES`` edges.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import networkx as nx
import numpy as np

from kproxy_spark.checks.keyview import KeyView

#: The driver refuses to search more candidate edges (those left after
#: ``prune``) than this; it then reports which cycle classes are
#: known to exist (``G0-cycle-exists``, ``G1c-cycle-exists``) and
#: ``cycle-search-incomplete``, instead of guessing.
MAX_EDGES = 2_000_000
#: Per strongly connected component, how many seed edges are tried when looking
#: for the shortest cycle of each kind.
MAX_SEEDS = 32


class Edge(NamedTuple):
    src: int
    dst: int
    type: str  # 'ww' | 'wr'
    key: int
    value: int | None
    value2: int | None
    src_process: int
    dst_process: int


def key_edges(view: KeyView, ww_deps: bool = True) -> list[Edge]:
    """The key's part of the collapsed dependency graph."""
    writers = {v: e for v, e in view.writer.items() if e.type in ("ok", "info")}
    edges: dict[tuple[int, int], Edge] = {}
    wr_sources = set()
    for r in view.polled:
        if r.type not in ("ok", "info") or r.op_writes < 1:
            continue
        w = writers.get(r.value)
        if w is None or w.index == r.index:
            continue
        wr_sources.add(w.index)
        edge = Edge(w.index, r.index, "wr", view.key, r.value, None, w.process, r.process)
        known = edges.get((w.index, r.index))
        if known is None or edge.value < known.value:
            edges[(w.index, r.index)] = edge
    out = list(edges.values())
    if ww_deps:
        out += _ww_chain(view, writers, wr_sources)
    return out


def _ww_chain(view: KeyView, writers: dict, wr_sources: set[int]) -> list[Edge]:
    def branching(w) -> bool:  # noqa: ANN001
        return w.op_writes > 1 or (w.op_writes >= 1 and w.op_reads) or w.index in wr_sources

    edges = []
    last_branching = None  # (writer, value) of the latest branching position so far
    previous = None  # (writer, value) at the previous position, when it had a writer
    for position in sorted(view.by_index):
        value = view.by_index[position][0]
        w = writers.get(value)
        if w is not None and branching(w) and last_branching is not None:
            (b, b_value) = last_branching
            if b.index != w.index:
                edges.append(Edge(b.index, w.index, "ww", view.key, b_value, value, b.process, w.process))
            elif previous is not None and previous[0].index != w.index:
                # The op's own writes are split by others' single writes: the
                # collapsed edge would be a self-loop, so keep the last link.
                p, p_value = previous
                edges.append(Edge(w.index, p.index, "ww", view.key, b_value, p_value, w.process, p.process))
                edges.append(Edge(p.index, w.index, "ww", view.key, p_value, value, p.process, w.process))
        if w is not None and branching(w):
            last_branching = (w, value)
        previous = (w, value) if w is not None else None
    return edges


# --- on the driver -------------------------------------------------------------


def _interval_keep(src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Which edges lie inside one run of overlapping backward spans.

    Number the nodes (operation indexes, roughly time). Along a cycle the
    numbers must come down again, so every number between a cycle's lowest
    and highest node is spanned by one of its backward edges [dst, src]: the
    whole cycle lies in one run of overlapping spans. One sort, no
    iteration; on a history whose dependencies all point forward in time
    nothing survives.
    """
    backward = src > dst
    if not backward.any():
        return np.zeros(len(src), dtype=bool)
    starts, ends = dst[backward], src[backward]
    order = np.argsort(starts, kind="stable")
    starts, ends = starts[order], np.maximum.accumulate(ends[order])
    # A new run begins where a span starts beyond every earlier span's end.
    new_run = np.empty(len(starts), dtype=bool)
    new_run[0] = True
    new_run[1:] = starts[1:] > ends[:-1]
    run_start = starts[new_run]
    run_end = np.append(ends[np.flatnonzero(new_run)[1:] - 1], ends[-1])

    def run_of(nodes: np.ndarray) -> np.ndarray:
        run = np.searchsorted(run_start, nodes, side="right") - 1
        inside = (run >= 0) & (nodes <= run_end[np.maximum(run, 0)])
        return np.where(inside, run, -1)

    src_run, dst_run = run_of(src), run_of(dst)
    return (src_run >= 0) & (src_run == dst_run)


def prune(src: np.ndarray, dst: np.ndarray, rounds: int = 3) -> np.ndarray:
    """Which edges (a mask over src, dst) can lie on a cycle.

    Keeps every edge of every cycle (so the strongly connected components,
    and the edges inside each, are those of the whole graph): first the
    backward-span bound of ``_interval_keep``, then ``rounds`` rounds of
    dropping edges that leave a node nothing enters or enter a node nothing
    leaves (sources and sinks: no cycle passes through them).
    """
    src, dst = np.asarray(src, dtype=np.int64), np.asarray(dst, dtype=np.int64)
    if not len(src):
        return np.zeros(0, dtype=bool)
    keep = _interval_keep(src, dst)
    for _ in range(rounds):
        alive_src, alive_dst = src[keep], dst[keep]
        if not len(alive_src):
            break
        still = keep & np.isin(src, alive_dst) & np.isin(dst, alive_src)
        if (still == keep).all():
            break
        keep = still
    return keep


def _shortest_cycle_through(graph: nx.DiGraph, seeds: list[tuple[int, int]]) -> list[int] | None:
    """Shortest cycle that uses one of the seed edges (u, v): u, v, ..., u."""
    best = None
    for u, v in seeds[:MAX_SEEDS]:
        try:
            path = nx.shortest_path(graph, v, u)
        except nx.NetworkXNoPath:
            continue
        if best is None or len(path) + 1 < len(best):
            best = [u, *path]
    return best


def find_cycles(edges: list[Edge]) -> dict[str, list[dict]]:
    """At most one G0 and one G1c per strongly connected component of ``edges``."""
    graph = nx.DiGraph()
    process_of: dict[int, int] = {}
    for e in sorted(edges):
        if not graph.has_edge(e.src, e.dst):
            graph.add_edge(e.src, e.dst, kinds={})
        graph.edges[e.src, e.dst]["kinds"].setdefault(e.type, (e.key, e.value, e.value2))
        process_of[e.src] = e.src_process
        process_of[e.dst] = e.dst_process

    found: dict[str, list[dict]] = {"G0": [], "G1c": []}

    def record(name: str, cycle: list[int], forced_wr: tuple[int, int] | None = None) -> None:
        steps = []
        for a, b in zip(cycle, cycle[1:]):
            kinds = graph.edges[a, b]["kinds"]
            kind = "wr" if (a, b) == forced_wr or "ww" not in kinds else "ww"
            key, value, value2 = kinds[kind]
            steps.append({"from_index": a, "to_index": b, "type": kind, "key": key, "value": value, "value2": value2})
        found[name].append(
            {"cycle": cycle, "processes": [process_of.get(n) for n in cycle], "steps": steps, "length": len(cycle) - 1}
        )

    for component in sorted(nx.strongly_connected_components(graph), key=min):
        if len(component) < 2:
            continue
        sub = graph.subgraph(component)
        ww_only = nx.DiGraph((a, b) for a, b, d in sub.edges(data=True) if "ww" in d["kinds"])
        for ww_component in sorted(nx.strongly_connected_components(ww_only), key=min):
            if len(ww_component) > 1:
                ww_sub = ww_only.subgraph(ww_component)
                cycle = _shortest_cycle_through(ww_sub, sorted(ww_sub.edges()))
                if cycle:
                    record("G0", cycle)
        wr_seeds = sorted((a, b) for a, b, d in sub.edges(data=True) if "wr" in d["kinds"])
        cycle = _shortest_cycle_through(sub, wr_seeds)
        if cycle:
            record("G1c", cycle, forced_wr=(cycle[0], cycle[1]))
    return found


def cycle_checks(src: np.ndarray, dst: np.ndarray, ww: np.ndarray, explain: Callable[[set[int]], list[Edge]],
                 max_edges: int = MAX_EDGES) -> dict[str, list[dict]]:
    """``G0`` and ``G1c`` cases from the graph's edges as arrays (src, dst,
    and whether each is a ww edge).

    ``explain(nodes)`` returns the full edges (kinds, keys, values) between
    the given operations; it is asked only for operations on a cycle. When
    the edges that could be on a cycle exceed ``max_edges``, the search is
    not attempted: a graph in which every node is entered and left contains
    a cycle, so what survives pruning proves one exists. Jepsen's
    ``G0-cycle-exists`` (the ww edges alone hold one) or
    ``G1c-cycle-exists`` (they do not, so every cycle there has a wr edge)
    is reported, with ``cycle-search-incomplete`` saying how many edges were
    left.
    """
    keep = prune(src, dst, rounds=8)
    if not keep.any():
        return {"G0": [], "G1c": []}
    src, dst, ww = src[keep], dst[keep], np.asarray(ww, dtype=bool)[keep]
    pairs = sorted(set(zip(src.tolist(), dst.tolist())))
    if len(pairs) > max_edges:
        exists = "G0-cycle-exists" if prune(src[ww], dst[ww], rounds=8).any() else "G1c-cycle-exists"
        return {"G0": [], "G1c": [], exists: [{"edges": len(pairs)}],
                "cycle-search-incomplete": [{"edges": len(pairs), "max_edges": max_edges}]}
    graph = nx.DiGraph(pairs)
    on_cycles = {n for c in nx.strongly_connected_components(graph) if len(c) > 1 for n in c}
    if not on_cycles:
        return {"G0": [], "G1c": []}
    kept = [e for e in merge_edges(explain(on_cycles)) if e.src in on_cycles and e.dst in on_cycles]
    return find_cycles(kept)


def merge_edges(rows) -> list[Edge]:  # noqa: ANN001
    """Edges from every key, one per (src, dst, type): the smallest (key, value) explains it."""
    best: dict[tuple[int, int, str], Edge] = {}
    for e in rows:
        edge = Edge(*e)
        slot = (edge.src, edge.dst, edge.type)
        known = best.get(slot)
        if known is None or (edge.key, edge.value or 0) < (known.key, known.value or 0):
            best[slot] = edge
    return list(best.values())


__all__ = ["MAX_EDGES", "Edge", "cycle_checks", "find_cycles", "key_edges", "merge_edges", "prune"]
