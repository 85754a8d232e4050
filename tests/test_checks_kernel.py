"""The per-key kernel on its own, without Spark: what the grouped pass runs for each key."""

from spark.checks.kernel import check_key
from spark.checks.keyview import Event


def event(kind, index, process, type_, f, offset, value, mop_index=0, pos=0, op_writes=0, op_reads=False):
    return Event(kind=kind, index=index, time=index * 1000, process=process, type=type_, f=f,
                 mop_index=mop_index, pos=pos, offset=offset, value=value, error=None,
                 op_writes=op_writes, op_reads=op_reads, changes=0, last_change_f=None)


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
