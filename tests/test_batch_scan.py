"""Version-3 partitions (batch headers scanned in place, raw batches in a side file) read back as version 2's.

Each frame is encoded with kio, walked by kproxy.protocol.batch_scan through
the trace writer's classes into an in-memory side file, and its records
decoded as readers do; the result must equal what the version-2 path (a kio
decode of the whole frame, kproxy.protocol.record_views) put in the event.
"""

from __future__ import annotations

from typing import Any

import pytest

from kproxy.obs.trace_records import FetchResponseRecords, ProduceRequestRecords, ProduceResponseRecords
from kproxy.protocol import batch_scan, record_views
from kproxy.protocol.codec import encode_request, encode_response, parse_request_header
from kproxy.protocol.produce_peek import body_start
from kproxy.protocol.records import encode_batch, make_batch, make_control_batch
from tests.test_record_views import produce_request, records_at
from tests.test_response_faults import TOPIC_NAMES, fetch_response, produce_response

V2_FIELDS = ("topic", "partition", "error_code", "base_offset", "high_watermark", "last_stable_offset",
             "log_start_offset", "aborted_transactions", "compression", "records")


class SideFile:
    def __init__(self) -> None:
        self.data = bytearray()

    def side_file_now(self) -> str:
        return "side.records"

    def store_raw(self, raw: memoryview, key: tuple | None = None) -> tuple[str, int]:
        offset = len(self.data)
        self.data += raw
        return "side.records", offset

    def read_back(self, parts: list[dict[str, Any]], api: str, direction: str) -> list[dict[str, Any]]:
        for part in parts:
            if part["records_file"]:
                assert part["records"] is None
                raw = self.data[part["records_offset"] : part["records_offset"] + part["records_length"]]
                part["records"] = record_views.side_records(raw, api, direction, part)
        return [{k: p[k] for k in V2_FIELDS} for p in parts]


def v2(parts: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [{k: p[k] for k in V2_FIELDS} for p in parts]


@pytest.mark.parametrize("version", [3, 5, 8, 9, 12, 13])
@pytest.mark.parametrize("codec", ["none", "gzip", "snappy", "lz4", "zstd"])
def test_produce_request_and_response_read_back_as_version_2(version: int, codec: str) -> None:
    req = produce_request(version, {
        "orders": [(0, encode_batch(make_batch(records_at(0, [b"a", b"\xff", None]), compression=codec, producer_id=5,
                                               producer_epoch=1, base_sequence=9, transactional=True))),
                   (1, None)],
        "audit": [(2, encode_batch(make_batch(records_at(0, [b"d"]))))],
    })
    frame = encode_request(req, 7, "c")
    header = parse_request_header(frame, 4)
    side = SideFile()
    raw_request = ProduceRequestRecords(version, frame, body_start(frame, 4, header), TOPIC_NAMES)
    got = raw_request.resolve(side)
    orders = got[0]
    assert [(b["record_count"], b["compression"], b["producer_id"], b["base_sequence"], b["transactional"])
            for b in orders["batches"]] == [(3, codec, 5, 9, True)]
    want_request = record_views.produce_request_partitions(req, TOPIC_NAMES)
    assert side.read_back(got, "produce", "request") == v2(want_request)

    resp = produce_response(version, {"orders": [(0, 0, 100), (1, 0, 3)], "audit": [(2, 6, 0)]})
    got = ProduceResponseRecords(raw_request, version, encode_response(resp, 7)).resolve(side)
    assert side.read_back(got, "produce", "response") == v2(
        record_views.produce_response_partitions(resp, want_request, TOPIC_NAMES))


@pytest.mark.parametrize("version", [4, 5, 7, 11, 12, 13, 16, 17, 18])
def test_fetch_response_reads_back_as_version_2(version: int) -> None:
    data = make_batch(records_at(10, [b"p", b"q"]), compression="snappy", producer_id=3, producer_epoch=1,
                      base_sequence=0, transactional=True)
    commit = make_control_batch("commit", offset=12, timestamp=1, producer_id=3, producer_epoch=1)
    aborted = make_batch(records_at(13, [b"r"]), producer_id=4, producer_epoch=0, base_sequence=0, transactional=True)
    abort = make_control_batch("abort", offset=14, timestamp=2, producer_id=4, producer_epoch=0)
    raw = b"".join(encode_batch(b) for b in (data, commit, aborted, abort))
    resp = fetch_response(version, {
        "orders": [{"partition_index": 2, "high_watermark": 20, "last_stable_offset": 15, "log_start_offset": 10,
                    "aborted_transactions": [(4, 13)], "records": raw + raw[:30]},  # a batch cut at the fetch size
                   {"partition_index": 3, "high_watermark": 0}],
        "audit": [{"partition_index": 0, "high_watermark": -1, "error_code": batch_scan_error(1)}],
    })
    frame = encode_response(resp, 3)
    side = SideFile()
    chunks = [frame[i : i + 1000] for i in range(0, len(frame), 1000)]  # as a cut-through forwarded it
    fetched = FetchResponseRecords(version, chunks, TOPIC_NAMES)
    assert fetched.error_codes() == [1]
    got = fetched.resolve(side)
    assert [b["marker"] for b in got[0]["batches"]] == [None, "commit", None, "abort"]
    assert got[0]["records_length"] == len(raw) + 30
    assert side.read_back(got, "fetch", "response") == v2(record_views.fetch_response_partitions(resp, TOPIC_NAMES))


def test_a_frame_the_scan_cannot_follow_is_traced_without_partitions() -> None:
    frame = encode_response(fetch_response(12, {"orders": [{"partition_index": 0, "high_watermark": 1}]}), 3)
    assert FetchResponseRecords(12, frame[:-9], None).resolve(SideFile()) is None
    with pytest.raises(batch_scan.ScanError):
        batch_scan.scan_batches(b"\x00" * 8 + b"\x00\x00\x00\x01" + b"\x00" * 20, 0, 32)


def batch_scan_error(code: int):  # noqa: ANN202
    from kio.schema.errors import ErrorCode

    return ErrorCode(code)
