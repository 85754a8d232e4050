"""Loading, flattening, version orders, inconsistent-offsets and duplicate."""

from tests.fixtures.spark import op, write_history


def send(k, o, v):
    return ["send", k, [o, v]]


def poll(**by_key):
    return ["poll", {k.lstrip("k"): pairs for k, pairs in by_key.items()}]


def test_flatten_mops_covers_sends_polls_and_unknown_offsets(spark, tmp_path):
    from kproxy_spark.history import flatten_mops, load_history

    path = write_history(
        tmp_path / "h.jsonl",
        [
            op(0, "invoke", "txn", [["send", 1, 10], ["poll"]]),
            op(0, "ok", "txn", [send(1, 0, 10), ["send", 2, 20], poll(k1=[[0, 10], [1, 11]], k2=[])]),
        ],
    )
    with open(path, "a") as f:
        f.write("this line is not JSON\n")
    rows = sorted(
        tuple(r) for r in flatten_mops(load_history(spark, path))
        .select("index", "type", "mop_index", "mop", "key", "offset", "value", "pos").collect()
    )
    assert rows == [
        (0, "invoke", 0, "send", 1, None, 10, 0),
        (1, "ok", 0, "send", 1, 0, 10, 0),
        (1, "ok", 1, "send", 2, None, 20, 0),
        (1, "ok", 2, "poll", 1, 0, 10, 0),
        (1, "ok", 2, "poll", 1, 1, 11, 1),
    ]


def test_membership_and_create_helpers(spark, tmp_path):
    from kproxy_spark.checks.membership import change_rows
    from kproxy_spark.history import key_partitions, load_history

    path = write_history(
        tmp_path / "h.jsonl",
        [
            op(0, "invoke", "assign", [1, 2]),
            op(0, "ok", "assign", [1, 2]),
            op(1, "fail", "subscribe", [3]),
            op(1, "info", "crash"),
            op(2, "ok", "create", [7, "kproxy-7", 3]),
        ],
    )
    ops = load_history(spark, path)
    # A failed subscribe changes nothing; an invoked assign is not yet a change.
    assert [tuple(r) for r in change_rows(ops).select("index", "f").orderBy("index").collect()] == [
        (1, "assign"),
        (3, "crash"),
    ]
    assert [tuple(r) for r in key_partitions(ops).select("key", "topic", "partition").collect()] == [(7, "kproxy-7", 3)]


def test_version_orders_trust_polls_and_committed_sends_only(spark, tmp_path):
    from kproxy_spark.checks import version_orders
    from kproxy_spark.history import load_history

    path = write_history(
        tmp_path / "h.jsonl",
        [
            op(0, "ok", "send", [send(1, 0, 10)]),
            # Offsets 1 and 2 are transaction markers: the dense order skips them.
            op(0, "ok", "send", [send(1, 3, 11)]),
            # A failed send's offset is not evidence.
            op(0, "fail", "send", [send(1, 9, 99)]),
            # An info send counts once an acknowledged poll proves it landed.
            op(1, "info", "send", [send(2, 0, 20)]),
            op(2, "ok", "poll", [poll(k2=[[0, 20]])]),
            # Polls count whatever their completion type.
            op(2, "fail", "txn", [poll(k1=[[4, 12]])]),
        ],
    )
    rows = sorted(tuple(r) for r in version_orders(load_history(spark, path)).select("key", "offset", "value", "vo_index").collect())
    assert rows == [(1, 0, 10, 0), (1, 3, 11, 1), (1, 4, 12, 2), (2, 0, 20, 0)]


def test_inconsistent_offsets_found_with_witnesses(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 0, 10)]),
            op(1, "ok", "send", [send(1, 0, 11)]),
            op(2, "ok", "poll", [poll(k1=[[0, 10]])]),
        ],
        "inconsistent-offsets",
    )["inconsistent-offsets"]
    assert found == [{"key": 1, "offset": 0, "vo_index": 0, "values": [10, 11], "op_indexes": [0, 1, 2]}]


def test_consistent_offsets_are_not_reported(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 0, 10), send(1, 1, 11)]),
            op(2, "ok", "poll", [poll(k1=[[0, 10], [1, 11]])]),
            # An info send with a conflicting offset is not trusted, so no conflict.
            op(3, "info", "send", [send(1, 1, 12)]),
        ],
        "inconsistent-offsets",
    )
    assert found["inconsistent-offsets"] == []


def test_duplicate_value_at_two_offsets(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 0, 10)]),
            op(1, "ok", "poll", [poll(k1=[[0, 10], [1, 11], [2, 10]])]),
        ],
        "duplicate",
    )
    assert found["duplicate"] == [{"key": 1, "value": 10, "count": 2, "offsets": [0, 2]}]


def test_no_duplicate_when_each_value_has_one_offset(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 0, 10)]),
            op(1, "ok", "poll", [poll(k1=[[0, 10], [1, 11]])]),
            op(2, "ok", "poll", [poll(k1=[[0, 10]])]),
        ],
        "duplicate",
    )
    assert found["duplicate"] == []
