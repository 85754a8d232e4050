"""G0 (write-write) and G1c (write-read) cycles between transactions, and abort positions."""

from tests.fixtures.spark import op


def send(k, o, v):
    return ["send", k, [o, v]]


def poll(**by_key):
    return ["poll", {k.lstrip("k"): pairs for k, pairs in by_key.items()}]


def test_g0_write_cycle_across_two_keys(run_checks):
    found = run_checks(
        [
            # T0 precedes T1 on key 1 but follows it on key 2.
            op(0, "ok", "txn", [send(1, 0, 10), send(2, 1, 21)]),
            op(1, "ok", "txn", [send(1, 1, 11), send(2, 0, 20)]),
        ],
        "G0", "G1c",
    )
    [cycle] = found["G0"]
    assert sorted(cycle["cycle"][:-1]) == [0, 1] and cycle["cycle"][0] == cycle["cycle"][-1]
    assert cycle["length"] == 2
    assert {(s["type"], s["key"]) for s in cycle["steps"]} == {("ww", 1), ("ww", 2)}
    assert found["G1c"] == []


def test_g0_through_a_run_of_single_writes(run_checks):
    # Single-write ops between T0's two writes are collapsed, but the cycle stays.
    found = run_checks(
        [
            op(0, "ok", "txn", [send(1, 0, 10), send(1, 3, 13)]),
            op(1, "ok", "send", [send(1, 1, 11)]),
            op(2, "ok", "send", [send(1, 2, 12)]),
        ],
        "G0",
    )
    [cycle] = found["G0"]
    assert cycle["cycle"] in ([0, 2, 0], [2, 0, 2])
    assert all(s["type"] == "ww" for s in cycle["steps"])


def test_g1c_write_read_cycle(run_checks):
    found = run_checks(
        [
            # T0 read T1's write, and T1 read T0's write.
            op(0, "ok", "txn", [send(1, 0, 10), poll(k2=[[0, 20]])]),
            op(1, "ok", "txn", [send(2, 0, 20), poll(k1=[[0, 10]])]),
        ],
        "G0", "G1c",
    )
    [cycle] = found["G1c"]
    assert cycle["length"] == 2
    assert [s["type"] for s in cycle["steps"]] == ["wr", "wr"]
    assert cycle["processes"][:-1] in ([0, 1], [1, 0])
    assert found["G0"] == []


def test_acyclic_history_has_no_cycles(run_checks):
    found = run_checks(
        [
            op(0, "ok", "txn", [send(1, 0, 10), send(2, 0, 20)]),
            op(1, "ok", "txn", [poll(k1=[[0, 10]]), send(1, 1, 11), send(2, 1, 21)]),
            op(2, "ok", "send", [send(1, 2, 12)]),
            op(3, "ok", "poll", [poll(k1=[[0, 10], [1, 11], [2, 12]], k2=[[0, 20], [1, 21]])]),
            # A failed txn is no node: its interleaving proves nothing.
            op(4, "fail", "txn", [send(1, 3, 13), send(2, 3, 23)]),
        ],
        "G0", "G1c",
    )
    assert found == {"G0": [], "G1c": []}


def _abort_history(next_read):
    return [op(9, "ok", "send", [send(1, o, 10 + o)]) for o in range(6)] + [
        op(0, "ok", "assign", [1]),
        op(0, "ok", "txn", [poll(k1=[[0, 10], [1, 11]])]),
        op(0, "fail", "txn", [poll(k1=[[2, 12], [3, 13]]), send(2, 0, 20)], error="aborted"),
        op(0, "ok", "txn", [poll(k1=next_read)]),
    ]


def test_abort_position_advance(run_checks):
    [row] = run_checks(_abort_history([[4, 14]]), "abort-position")["abort-position"]
    assert (row["position"], row["abort_index"], row["next_index"], row["error"]) == ("advance", 8, 9, "aborted")
    assert (row["aborted_first_offset"], row["aborted_last_offset"], row["next_first_offset"]) == (2, 3, 4)


def test_abort_position_rewind(run_checks):
    [row] = run_checks(_abort_history([[2, 12], [3, 13]]), "abort-position")["abort-position"]
    assert row["position"] == "rewind"


def test_abort_position_rewind_further(run_checks):
    [row] = run_checks(_abort_history([[1, 11], [2, 12]]), "abort-position")["abort-position"]
    assert (row["position"], row["next_first_value"]) == ("rewind-further", 11)


def test_abort_position_needs_a_definite_abort_and_no_reassignment(run_checks):
    history = _abort_history([[2, 12]])
    history.insert(-1, op(0, "ok", "assign", [1]))  # keeps key 1: still classified
    unknown = [dict(o) for o in _abort_history([[2, 12]])]
    unknown[-2]["type"] = "info"  # outcome unknown: not classified
    reassigned = _abort_history([[0, 10]])
    reassigned.insert(-1, op(0, "ok", "assign", [2]))
    found_kept = run_checks(history, "abort-position")["abort-position"]
    assert [r["position"] for r in found_kept] == ["rewind"]
    assert run_checks(unknown, "abort-position")["abort-position"] == []
    assert run_checks(reassigned, "abort-position")["abort-position"] == []


def _candidates(pairs, rounds=3):
    import numpy as np

    from kproxy_spark.checks.cycles import prune

    array = np.asarray(pairs, dtype=np.int64).reshape(-1, 2)
    keep = prune(array[:, 0], array[:, 1], rounds)
    return set(zip(array[keep, 0].tolist(), array[keep, 1].tolist()))


def test_pruning_keeps_a_cycle_and_drops_its_acyclic_tails():
    cycle = [(10, 11), (11, 12), (12, 10)]
    # Edges into the cycle from earlier ops, out of it to later ops, and a
    # forward-only chain elsewhere: none of them can be on a cycle.
    tails = [(1, 2), (2, 10), (12, 20), (20, 21), (30, 31), (31, 32), (5, 11)]
    assert _candidates(cycle + tails) == set(cycle)


def test_pruning_keeps_a_cycle_whose_ids_interleave_with_others():
    # The cycle spans ids 3..9; ids 4..8 belong to a chain inside that span,
    # and 5 -> 6 -> 7 hangs off it: the span keeps them, the degree rounds drop them.
    cycle = [(3, 9), (9, 3)]
    inside = [(4, 5), (5, 6), (6, 7), (7, 8)]
    assert _candidates(cycle + inside) == set(cycle)
    # Without degree rounds the span alone keeps the chain inside it.
    assert _candidates(cycle + inside, rounds=0) == set(cycle + inside)


def test_pruning_of_a_forward_only_graph_leaves_nothing():
    forward = [(a, b) for a in range(40) for b in (a + 1, a + 7) if b < 40]
    assert _candidates(forward) == set()


def test_pruning_keeps_every_edge_inside_a_strongly_connected_component():
    import random

    import networkx as nx

    rng = random.Random(7)
    pairs, on_cycles = [], set()
    # Many small random graphs in disjoint id ranges, pruned together.
    for graph_no in range(60):
        base = graph_no * 100
        graph = nx.gnp_random_graph(12, rng.choice([0.05, 0.1, 0.2]), seed=rng.randrange(10**6), directed=True)
        edges = [(base + a, base + b) for a, b in graph.edges()]
        pairs += edges
        for component in nx.strongly_connected_components(nx.DiGraph(edges)):
            if len(component) > 1:
                on_cycles |= {(a, b) for a, b in edges if a in component and b in component}
    kept = _candidates(pairs)
    assert on_cycles and on_cycles <= kept <= set(pairs)
    assert len(kept) < len(pairs)


def test_ww_deps_decides_g0_and_whether_a_g1c_is_an_error(spark, tmp_path):
    """Jepsen's --ww-deps: with ww edges inferred from offsets, a G0 is found
    (and tolerated) and a G1c is tolerated; without them no G0 can be seen and
    a pure write-read cycle makes the history invalid."""
    from kproxy_spark.jobs import analyze
    from tests.fixtures.spark import write_history

    path = write_history(tmp_path / "h.jsonl", [
        # A write cycle across keys 1 and 2...
        op(0, "ok", "txn", [send(1, 0, 10), send(2, 1, 21)]),
        op(1, "ok", "txn", [send(1, 1, 11), send(2, 0, 20)]),
        # ...and a read cycle across keys 3 and 4.
        op(0, "ok", "txn", [send(3, 0, 30), poll(k4=[[0, 40]])]),
        op(1, "ok", "txn", [send(4, 0, 40), poll(k3=[[0, 30]])]),
    ])
    with_ww = analyze(path, None, tmp_path / "ww", spark=spark, ww_deps=True)
    without = analyze(path, None, tmp_path / "no-ww", spark=spark, ww_deps=False)
    assert (with_ww["counts"]["G0"], with_ww["counts"]["G1c"]) == (1, 1)
    assert "G0" not in with_ww["errors"] and "G1c" not in with_ww["errors"]
    assert (without["counts"]["G0"], without["counts"]["G1c"]) == (0, 1)
    assert without["errors"] == ["G1c"] and without["valid"] is False
    assert (with_ww["stats"]["ww_deps"], without["stats"]["ww_deps"]) == (True, False)
