"""Fetch rewrites that work batch by batch: skip a batch, hide aborted transactions (and the fix).

Built from real record batches (kproxy.protocol.records), rewritten, sent
through kio's encoder and decoder as the proxy does, and read back.
"""

from __future__ import annotations

import pytest

from kproxy.faults.loader import RuleFileError, load_rule_text
from kproxy.protocol.records import Record, batch_tuples, control_type_of, decode_batches, encode_batch, make_batch
from kproxy.protocol.response_faults import (
    NO_OP_CONTROL_TYPE,
    aborted_batch_starts,
    fetch_hide_aborted,
    fetch_skip_batch,
    hide_aborted,
    without_middle_batch,
)
from tests.test_response_faults import FETCH_VERSIONS, data_batch, fetch_response, marker, partitions_of, wire_round_trip


def plain_batch(offset: int, n: int):
    records = [Record(offset + i, 1_700_000_000_000 + i, b"k", f"p{offset + i}".encode()) for i in range(n)]
    return make_batch(records)


def offsets_of(records: bytes) -> list[int]:
    return [r.offset for b in decode_batches(records) if not b.is_control for r in b.records]


# ---------------------------------------------------------------- fetch_skip_batch


@pytest.mark.parametrize(("batches", "gone"), [(2, 0), (3, 1), (4, 1), (5, 2)])
def test_skip_batch_cuts_the_middle_data_batch_and_keeps_the_later_ones(batches: int, gone: int) -> None:
    raw = [encode_batch(plain_batch(10 * i, 3)) for i in range(batches)]
    kept = without_middle_batch(b"".join(raw))
    assert kept == b"".join(r for i, r in enumerate(raw) if i != gone)
    # The last batch is always there: a consumer's position moves past the hole.
    assert offsets_of(kept)[-1] == 10 * (batches - 1) + 2


def test_skip_batch_ignores_markers_and_needs_two_data_batches() -> None:
    one = encode_batch(data_batch(0, 3)) + encode_batch(marker("commit", 3))
    assert without_middle_batch(one) is one
    layout = [data_batch(0, 2), marker("commit", 2), data_batch(3, 2), marker("commit", 5)]
    raw = [encode_batch(b) for b in layout]
    # Two data batches: the first goes, both markers and the second stay.
    assert without_middle_batch(b"".join(raw)) == raw[1] + raw[2] + raw[3]


def test_skip_batch_keeps_a_truncated_tail_and_unreadable_bytes() -> None:
    raw = [encode_batch(plain_batch(0, 2)), encode_batch(plain_batch(2, 2)), encode_batch(plain_batch(4, 2))]
    tail = encode_batch(plain_batch(6, 2))[:30]
    assert without_middle_batch(b"".join(raw) + tail) == raw[0] + raw[2] + tail
    garbage = b"\x00" * 8 + b"\x00\x00\x00\x03" + b"\x00" * 10
    assert without_middle_batch(garbage) == garbage


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_skip_batch_on_the_wire(version: int) -> None:
    records = b"".join(encode_batch(plain_batch(3 * i, 3)) for i in range(3))
    resp = fetch_response(version, {"orders": [{"partition_index": 0, "high_watermark": 9, "records": records},
                                               {"partition_index": 1, "high_watermark": 3,
                                                "records": encode_batch(plain_batch(0, 3))}]})
    skipped, single = partitions_of(wire_round_trip(fetch_skip_batch(resp)))
    assert offsets_of(skipped.records) == [0, 1, 2, 6, 7, 8] and skipped.high_watermark == 9
    assert offsets_of(single.records) == [0, 1, 2]


# ---------------------------------------------------------------- fetch_hide_aborted


def test_aborted_batches_from_the_list_and_from_markers() -> None:
    # pid 7: aborted txn at 0-1 (listed), committed at 3-4; pid 8: aborted at 6-7, only its marker says so.
    layout = [data_batch(0, 2, pid=7), marker("abort", 2, pid=7), data_batch(3, 2, pid=7), marker("commit", 5, pid=7),
              data_batch(6, 2, pid=8), marker("abort", 8, pid=8), plain_batch(9, 1)]
    raw = [encode_batch(b) for b in layout]
    records = b"".join(raw)
    start_of = [sum(len(r) for r in raw[:i]) for i in range(len(raw))]
    listed = [type("A", (), {"producer_id": 7, "first_offset": 0})()]
    assert aborted_batch_starts(records, listed) == {start_of[0], start_of[4]}
    assert aborted_batch_starts(records, ()) == {start_of[0], start_of[4]}
    # A listed producer whose marker lies beyond these records: its batches stay aborted.
    assert aborted_batch_starts(raw[0] + raw[6], listed) == {0}
    # Committed, or open with no listing: not aborted.
    assert aborted_batch_starts(raw[2] + raw[3], ()) == set()
    assert aborted_batch_starts(raw[2], ()) == set()


def test_hide_aborted_empties_aborted_only_batches_and_removes_markers() -> None:
    aborted = data_batch(0, 3, pid=7, codec="lz4")
    committed = data_batch(4, 2, pid=8)
    layout = [aborted, marker("abort", 3, pid=7), committed, marker("commit", 6, pid=8)]
    records = b"".join(encode_batch(b) for b in layout)
    out = decode_batches(hide_aborted(records, ()))  # CRCs verified
    assert [(b.base_offset, b.last_offset_delta, len(b.records), b.is_control) for b in out] == [
        (0, 2, 0, False), (4, 1, 2, False)]
    assert out[0].producer_id == 7 and out[0].is_transactional and out[0].compression == "none"
    assert hide_aborted(records, ()).endswith(encode_batch(committed))  # byte-exact


def test_the_fix_ends_an_aborted_only_batch_with_a_no_op_control_record() -> None:
    records = encode_batch(data_batch(0, 3, pid=7)) + encode_batch(marker("abort", 3, pid=7))
    (fixed,) = decode_batches(hide_aborted(records, (), end_marker=True))
    assert fixed.is_control and fixed.is_transactional and (fixed.base_offset, fixed.last_offset_delta) == (0, 2)
    (record,) = fixed.records
    assert record.offset == 2 and control_type_of(record.key) is None
    assert int.from_bytes(record.key[2:4], "big") == NO_OP_CONTROL_TYPE


@pytest.mark.parametrize("version", FETCH_VERSIONS)
def test_fetch_hide_aborted_on_the_wire(version: int) -> None:
    records = encode_batch(data_batch(0, 2, pid=7)) + encode_batch(marker("abort", 2, pid=7)) + encode_batch(
        data_batch(3, 2, pid=7)) + encode_batch(marker("commit", 5, pid=7))
    resp = fetch_response(version, {"orders": [
        {"partition_index": 0, "high_watermark": 6, "records": records, "aborted_transactions": [(7, 0)]},
        {"partition_index": 1, "high_watermark": 6, "records": records, "aborted_transactions": None},
    ]})
    committed, uncommitted = partitions_of(wire_round_trip(fetch_hide_aborted(resp)))
    assert committed.aborted_transactions == ()
    assert [(b.base_offset, len(b.records), b.is_control) for b in decode_batches(committed.records)] == [
        (0, 0, False), (3, 2, False)]
    # read_uncommitted (null list) is served as the broker sent it.
    assert uncommitted.records == records and uncommitted.aborted_transactions is None
    (fixed, _) = partitions_of(wire_round_trip(fetch_hide_aborted(resp, end_marker=True)))
    assert [(b.base_offset, b.is_control) for b in decode_batches(fixed.records)] == [(0, True), (3, False)]


# ---------------------------------------------------------------- rule files


RULE = """version: 1
rules:
  - id: r
    match: {{api: fetch, direction: response}}
    action:
      type: rewrite
      field: {field}
{extra}"""


@pytest.mark.parametrize(("field", "extra"), [
    ("fetch_skip_batch", ""),
    ("fetch_drop_control_batches", "      markers: [abort]\n"),
    ("fetch_hide_aborted", "      end_marker: true\n"),
])
def test_new_rewrites_load_from_yaml(field: str, extra: str) -> None:
    loaded = load_rule_text(RULE.format(field=field, extra=extra), "r.yaml")
    assert loaded.rules[0].action.field == field


@pytest.mark.parametrize(("field", "extra", "message"), [
    ("fetch_skip_batch", "      markers: [abort]\n", "'markers' only applies to field fetch_drop_control_batches"),
    ("fetch_drop_control_batches", "      markers: [rollback]\n", "abort"),
    ("fetch_drop_records", "      end_marker: true\n", "'end_marker' only applies to field fetch_hide_aborted"),
    ("fetch_hide_aborted", "      end_marker: true\n      batches: 2\n", "batches"),
])
def test_bad_rewrite_parameters_name_file_and_line(field: str, extra: str, message: str) -> None:
    with pytest.raises(RuleFileError) as info:
        load_rule_text(RULE.format(field=field, extra=extra), "r.yaml")
    text = str(info.value)
    assert "r.yaml:" in text and message in text


def test_the_trace_sees_the_no_op_marker_as_a_control_record() -> None:
    from kproxy.protocol.record_views import _record_views

    records = encode_batch(data_batch(0, 2, pid=7)) + encode_batch(marker("abort", 2, pid=7))
    views = _record_views(batch_tuples(hide_aborted(records, (), end_marker=True)), with_offsets=True)
    assert [(v["offset"], v["control"], v["producer_id"]) for v in views] == [(1, "unknown", 7)]
