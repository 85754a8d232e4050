"""Skips and inversions: within one op (int-*) and across one process's ops."""

from tests.fixtures.spark import op


def send(k, o, v):
    return ["send", k, [o, v]]


def poll(**by_key):
    return ["poll", {k.lstrip("k"): pairs for k, pairs in by_key.items()}]


# Key 1's log: 10@0, 11@1, 12@2, 13@3 (written by process 9).
LOG = [op(9, "ok", "send", [send(1, o, 10 + o)]) for o in range(4)]


def test_int_poll_skip_and_nonmonotonic(run_checks):
    found = run_checks(
        LOG + [
            op(0, "ok", "poll", [poll(k1=[[0, 10], [3, 13]])]),
            op(1, "ok", "poll", [poll(k1=[[2, 12]]), poll(k1=[[1, 11]])]),
        ],
        "int-poll-skip", "int-nonmonotonic-poll",
    )
    [skip] = found["int-poll-skip"]
    assert (skip["index"], skip["key"], skip["values"], skip["delta"], skip["skipped"]) == (4, 1, [10, 13], 3, [11, 12])
    [back] = found["int-nonmonotonic-poll"]
    assert (back["index"], back["values"], back["delta"], back["process"]) == (5, [12, 11], -1, 1)


def test_contiguous_reads_within_an_op_are_fine(run_checks):
    found = run_checks(
        LOG + [op(0, "ok", "poll", [poll(k1=[[0, 10], [1, 11]]), poll(k1=[[2, 12], [3, 13]])])],
        "int-poll-skip", "int-nonmonotonic-poll",
    )
    assert found == {"int-poll-skip": [], "int-nonmonotonic-poll": []}


def test_int_send_skip_and_nonmonotonic(run_checks):
    found = run_checks(
        [
            op(0, "ok", "txn", [send(1, 0, 10), send(1, 2, 12)]),
            op(1, "ok", "send", [send(1, 1, 11)]),
            op(2, "ok", "txn", [send(2, 1, 21), send(2, 0, 20)]),
            op(3, "ok", "txn", [send(3, 0, 30), send(3, 1, 31)]),
        ],
        "int-send-skip", "int-nonmonotonic-send",
    )
    [skip] = found["int-send-skip"]
    assert (skip["index"], skip["values"], skip["delta"], skip["skipped"]) == (0, [10, 12], 2, [11])
    [back] = found["int-nonmonotonic-send"]
    assert (back["index"], back["key"], back["values"], back["delta"]) == (2, 2, [21, 20], -1)


def test_poll_skip_between_consecutive_polls_of_a_process(run_checks):
    found = run_checks(
        LOG + [
            op(0, "ok", "assign", [1]),
            op(0, "ok", "poll", [poll(k1=[[0, 10]])]),
            op(0, "ok", "poll", [poll(k1=[[2, 12], [3, 13]])]),
        ],
        "poll-skip", "nonmonotonic-poll",
    )
    [skip] = found["poll-skip"]
    assert (skip["key"], skip["values"], skip["op_indexes"], skip["delta"], skip["skipped"], skip["subscribed"]) == (
        1, [10, 12], [5, 6], 2, [11], False,
    )
    assert found["nonmonotonic-poll"] == []


def test_nonmonotonic_poll_reports_rereads_and_marks_subscribe(run_checks):
    found = run_checks(
        LOG + [
            op(0, "ok", "subscribe", [1]),
            op(0, "ok", "poll", [poll(k1=[[0, 10], [1, 11]])]),
            op(0, "ok", "poll", [poll(k1=[[1, 11], [2, 12]])]),
        ],
        "poll-skip", "nonmonotonic-poll",
    )
    [back] = found["nonmonotonic-poll"]
    assert (back["values"], back["delta"], back["op_indexes"], back["subscribed"]) == ([11, 11], 0, [5, 6], True)
    assert found["poll-skip"] == []


def test_assign_crash_and_failed_polls_reset_or_keep_expectations(run_checks):
    found = run_checks(
        LOG + [
            op(0, "ok", "assign", [1, 2]),
            op(0, "ok", "poll", [poll(k1=[[0, 10]])]),
            # Re-assigning a set that drops key 1 resets its expectation...
            op(0, "ok", "assign", [2]),
            op(0, "ok", "assign", [1, 2]),
            op(0, "ok", "poll", [poll(k1=[[3, 13]])]),
            # ...so does a crash, even if the history kept the process number...
            op(0, "info", "crash"),
            op(0, "ok", "poll", [poll(k1=[[0, 10]])]),
            # ...and an assignment that keeps key 1 does not.
            op(0, "ok", "assign", [1]),
            op(0, "ok", "poll", [poll(k1=[[1, 11]])]),
            # A failed poll is checked but never becomes the reference.
            op(0, "fail", "poll", [poll(k1=[[3, 13]])]),
            op(0, "ok", "poll", [poll(k1=[[2, 12]])]),
            # Another process starts wherever it likes.
            op(1, "ok", "poll", [poll(k1=[[3, 13]])]),
        ],
        "poll-skip", "nonmonotonic-poll",
    )
    assert [(r["op_indexes"], r["values"]) for r in found["poll-skip"]] == [([12, 13], [11, 13])]
    assert found["nonmonotonic-poll"] == []


def test_nonmonotonic_send_across_ops_of_a_process(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 1, 11)]),
            op(0, "info", "send", [send(1, 0, 10)]),
            op(1, "ok", "send", [send(1, 2, 12)]),
            # Info sends take part; a skip between sends is normal (others interleave).
            op(1, "ok", "send", [send(1, 5, 15)]),
            # This poll proves the info send of 10 landed at offset 0.
            op(2, "ok", "poll", [poll(k1=[[0, 10], [3, 13], [4, 14]])]),
            op(2, "ok", "send", [send(2, 0, 20)]),
            op(2, "fail", "send", [send(2, 1, 99)]),
        ],
        "nonmonotonic-send",
    )
    assert [(r["process"], r["values"], r["delta"], r["op_indexes"]) for r in found["nonmonotonic-send"]] == [
        (0, [11, 10], -1, [0, 1])
    ]
