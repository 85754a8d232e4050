"""The per-key kernel on its own, without Spark: what the grouped pass runs for each key."""

from kproxy_spark.checks.kernel import check_key
from kproxy_spark.checks.keyview import Event


def event(kind, index, process, type_, f, offset, value, mop_index=0, pos=0, op_writes=0, op_reads=False):
    return Event(kind=kind, index=index, time=index * 1000, process=process, type=type_, f=f,
                 mop_index=mop_index, pos=pos, offset=offset, value=value, error=None,
                 op_writes=op_writes, op_reads=op_reads)


def test_a_key_checked_alone_finds_its_aborted_read_and_lost_write():
    # Given out of order: the view orders by (index, mop_index, pos) itself.
    events = [
        event("poll", 4, 2, "ok", "poll", 0, 10),
        event("poll", 4, 2, "ok", "poll", 1, 11, pos=1),
        event("poll", 4, 2, "ok", "poll", 3, 13, pos=2),
        event("send", 0, 0, "ok", "send", 0, 10, op_writes=1),
        event("send", 1, 0, "fail", "txn", 1, 11),
        event("send", 2, 1, "ok", "send", 2, 12, op_writes=1),
        event("send", 3, 1, "ok", "send", 3, 13, op_writes=1),
    ]
    result = check_key(7, events)
    assert [(c["reader_index"], c["value"], c["writer_index"]) for c in result.cases["G1a"]] == [(4, 11, 1)]
    assert [(c["value"], c["writer_index"]) for c in result.cases["lost-write"]] == [(12, 2)]
    # The poll skipped offset 2 within one op: an internal poll skip over value 12.
    [skip] = result.cases["int-poll-skip"]
    assert (skip["values"], skip["skipped"]) == ([11, 13], [12])
    assert result.micro_ops[("send", "send", "ok")] == 3 and result.micro_ops[("poll", "poll", "ok")] == 3


def test_an_info_send_proven_on_another_key_enters_the_version_order():
    events = [
        event("send", 0, 0, "info", "txn", 0, 10),
        event("send", 1, 1, "ok", "send", 1, 11, op_writes=1),
        event("poll", 2, 2, "ok", "poll", 1, 11),
    ]
    alone = check_key(1, events)
    told = check_key(1, events, proven_elsewhere=frozenset({0}))
    assert alone.unproven == {0} and alone.cases["lost-write"] == []
    assert told.unproven == set()
    assert [(c["value"], c["writer_type"]) for c in told.cases["lost-write"]] == [(10, "info")]


def test_membership_counts_changes_before_an_operation_per_process():
    from kproxy_spark.checks.membership import Membership

    membership = Membership([(0, 5, "assign"), (0, 2, "subscribe"), (1, 3, "crash"), (0, 9, "crash")])
    assert [membership.before(0, i) for i in (0, 2, 3, 5, 6, 10)] == [0, 0, 1, 1, 2, 3]
    assert [membership.latest_before(0, i) for i in (2, 3, 6, 10)] == [None, "subscribe", "assign", "crash"]
    assert (membership.before(1, 4), membership.before(2, 100), membership.latest_before(2, 100)) == (1, 0, None)
    # Both answers in one look-up, as the per-key segments ask them.
    assert [membership.at(0, i) for i in (2, 3, 10)] == [(0, None), (1, "subscribe"), (3, "crash")]
    assert membership.at(2, 100) == (0, None)


def test_a_re_assignment_that_keeps_the_key_still_compares_reads_one_that_drops_it_does_not():
    from kproxy_spark.checks.membership import Membership

    events = [
        event("send", 0, 9, "ok", "send", 0, 10, op_writes=1),
        event("send", 1, 9, "ok", "send", 1, 11, op_writes=1),
        event("send", 2, 9, "ok", "send", 2, 12, op_writes=1),
        event("poll", 4, 0, "ok", "poll", 0, 10),
        event("kept", 5, 0, "ok", "assign", None, None),
        event("poll", 7, 0, "ok", "poll", 2, 12),
    ]
    kept = check_key(1, events, membership=Membership([(0, 5, "assign")]))
    # Op 6 re-assigned process 0 to other keys only: the expectation for key 1 resets.
    dropped = check_key(1, [e for e in events if e.kind != "kept"],
                        membership=Membership([(0, 5, "assign"), (0, 6, "assign")]))
    assert [(c["values"], c["reassigns"]) for c in kept.cases["poll-skip"]] == [([10, 12], [5])]
    assert dropped.cases["poll-skip"] == []
