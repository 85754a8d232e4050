"""G1a (aborted read), precommitted-read, lost-write and unseen."""

from tests.fixtures.spark import op


def send(k, o, v):
    return ["send", k, [o, v]]


def poll(**by_key):
    return ["poll", {k.lstrip("k"): pairs for k, pairs in by_key.items()}]


def test_aborted_read_of_a_failed_transaction(run_checks):
    found = run_checks(
        [
            op(0, "invoke", "txn", [["send", 1, 10]]),
            op(0, "fail", "txn", [["send", 1, 10]], error="aborted"),
            op(1, "invoke", "poll", [["poll"]]),
            op(1, "ok", "poll", [poll(k1=[[0, 10]])]),
        ],
        "G1a",
    )
    assert found["G1a"] == [
        {"key": 1, "value": 10, "offset": 0, "reader_index": 3, "reader_process": 1, "writer_index": 1, "writer_process": 0,
         "explanation": "process 1 read key 1 value 10 at offset 0 (op 3), though its send failed (op 1, process 0)"}
    ]


def test_reading_an_info_write_or_from_a_failed_poll_is_not_g1a(run_checks):
    found = run_checks(
        [
            # Unknown outcome: reading it is legal.
            op(0, "info", "txn", [["send", 1, 10]], error="timeout"),
            op(1, "ok", "poll", [poll(k1=[[0, 10]])]),
            # A failed send read only by a poll that itself failed: no acknowledged read.
            op(2, "fail", "send", [["send", 2, 20]]),
            op(3, "fail", "poll", [poll(k2=[[0, 20]])]),
        ],
        "G1a",
    )
    assert found["G1a"] == []


def test_precommitted_read_of_own_write(run_checks):
    found = run_checks(
        [
            op(0, "ok", "txn", [send(1, 0, 10), poll(k1=[[0, 10]])]),
            op(1, "ok", "txn", [send(2, 0, 20), poll(k1=[[0, 10]])]),
        ],
        "precommitted-read",
    )
    assert found["precommitted-read"] == [{"index": 0, "process": 0, "type": "ok", "key": 1, "value": 10, "offset": 0}]


def test_reading_others_committed_writes_is_not_precommitted(run_checks):
    found = run_checks(
        [
            op(0, "ok", "txn", [send(1, 0, 10)]),
            op(1, "ok", "txn", [poll(k1=[[0, 10]]), send(1, 2, 11)]),
        ],
        "precommitted-read",
    )
    assert found["precommitted-read"] == []


def test_lost_write_below_the_highest_read(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 0, 10)]),
            op(0, "ok", "send", [send(1, 1, 11)]),
            op(0, "ok", "send", [send(1, 2, 12)]),
            # The poller saw offset 0 and 2 but never 1: 11 was acknowledged and lost.
            op(1, "ok", "poll", [poll(k1=[[0, 10], [2, 12]])]),
        ],
        "lost-write",
    )
    assert found["lost-write"] == [
        {
            "key": 1, "value": 11, "offset": 1, "vo_index": 1,
            "max_read_index": 2, "max_read_value": 12, "max_read_reader_index": 3,
            "writer_index": 1, "writer_process": 0, "writer_type": "ok",
            "explanation": "key 1 value 11 (offset 1, written by op 1, ok) was never read, though value 12 after it was",
        }
    ]


def test_info_write_is_lost_only_when_proven_committed(run_checks):
    history = [
        op(0, "ok", "send", [send(1, 0, 10)]),
        # An info txn whose other write (key 2) was read: it committed, so its
        # key-1 write at offset 1 should have been read too.
        op(0, "info", "txn", [send(1, 1, 11), send(2, 0, 20)]),
        op(0, "ok", "send", [send(1, 2, 12)]),
        op(1, "ok", "poll", [poll(k1=[[0, 10], [2, 12]], k2=[[0, 20]])]),
        # An info send nobody proved: its slot is in no version order, nothing lost.
        op(0, "info", "send", [send(3, 0, 30)]),
        op(0, "ok", "send", [send(3, 1, 31)]),
        op(1, "ok", "poll", [poll(k3=[[1, 31]])]),
    ]
    found = run_checks(history, "lost-write")["lost-write"]
    assert [(r["key"], r["value"], r["writer_type"]) for r in found] == [(1, 11, "info")]


def test_nothing_lost_when_reads_are_complete_or_behind(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 0, 10)]),
            op(0, "ok", "send", [send(1, 1, 11)]),
            op(0, "ok", "send", [send(1, 2, 12)]),
            op(1, "ok", "poll", [poll(k1=[[0, 10], [1, 11]])]),
            op(2, "ok", "poll", [poll(k1=[[2, 12]])]),
            # Written after the highest read: unseen perhaps, but not lost.
            op(0, "ok", "send", [send(1, 3, 13)]),
        ],
        "lost-write",
    )
    assert found["lost-write"] == []


def test_unseen_lists_acknowledged_writes_never_polled(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 0, 10)]),
            op(0, "ok", "send", [send(1, 1, 11)]),
            op(0, "info", "send", [["send", 2, 20]]),
            op(1, "ok", "poll", [poll(k1=[[0, 10]])]),
        ],
        "unseen",
    )
    assert found["unseen"] == [{"key": 1, "value": 11, "offset": 1, "send_index": 1, "send_time": 2_000_000, "process": 0}]


def test_nothing_unseen_when_every_ack_is_polled(run_checks):
    found = run_checks(
        [
            op(0, "ok", "send", [send(1, 0, 10)]),
            op(1, "ok", "poll", [poll(k1=[[0, 10]])]),
        ],
        "unseen",
    )
    assert found["unseen"] == []


def test_unseen_counts_over_time(spark, tmp_path):
    from kproxy_spark.checks import unseen_series, unseen_series_by_key
    from kproxy_spark.checks.keypass import collect_pass, history_pass
    from kproxy_spark.history import load_history
    from tests.fixtures.spark import write_history

    history = [
        {**op(0, "ok", "send", [send(1, 0, 10)]), "index": 0, "time": 100},
        {**op(0, "ok", "send", [send(2, 0, 20)]), "index": 1, "time": 150},
        {**op(0, "ok", "send", [send(1, 1, 11)]), "index": 2, "time": 250},
        {**op(1, "ok", "poll", [poll(k1=[[0, 10], [1, 11]])]), "index": 3, "time": 450},
    ]
    ops = load_history(spark, write_history(tmp_path / "h.jsonl", history))
    result = collect_pass(history_pass(ops, bucket_ns=100))
    total = [(p["time"], p["unseen"]) for p in unseen_series(result, 100)]
    assert total == [(200, 2), (300, 3), (500, 1)]
    per_key = sorted((p["key"], p["time"], p["unseen"]) for p in unseen_series_by_key(result, 100))
    assert per_key == [(1, 200, 1), (1, 300, 2), (1, 500, 0), (2, 200, 1)]
