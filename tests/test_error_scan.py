"""The streaming Fetch error-code scanner agrees with a full decode, however the bytes are cut."""

from __future__ import annotations

import importlib

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kio.schema.errors import ErrorCode

from kproxy.protocol import apis
from kproxy.protocol.codec import decode_response, encode_response, error_codes
from kproxy.protocol.error_scan import (
    MAX_VERSION,
    MIN_VERSION,
    PRODUCE_MAX_VERSION,
    PRODUCE_MIN_VERSION,
    FetchErrorScan,
    produce_error_codes,
    produce_scannable,
    scannable,
)
from tests.test_codec import kio_values


def fetch_class(version: int) -> type:
    return importlib.import_module(f"kio.schema.fetch.v{version}.response").FetchResponse


VERSIONS = list(range(MIN_VERSION, MAX_VERSION + 1))


def scan_in_pieces(version: int, frame: bytes, cuts: list[int]) -> FetchErrorScan:
    scanner = FetchErrorScan(version)
    start = 0
    for cut in sorted(set(cuts)) + [len(frame)]:
        scanner.feed(memoryview(frame)[start:cut])
        start = cut
    return scanner


@pytest.mark.parametrize("version", VERSIONS)
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_scan_finds_the_error_codes_a_decode_finds(version: int, data: st.DataObject) -> None:
    value = data.draw(kio_values(fetch_class(version)))
    frame = encode_response(value, 7)
    cuts = data.draw(st.lists(st.integers(0, len(frame)), max_size=12))
    scanner = scan_in_pieces(version, frame, cuts)
    decoded = decode_response(apis.FETCH, version, frame[4:])
    assert scanner.complete
    assert sorted(scanner.codes) == sorted(error_codes(decoded))


@pytest.mark.parametrize("version", [4, 11, 12, 16])
def test_every_byte_boundary(version: int) -> None:
    from tests.test_response_faults import fetch_response

    value = fetch_response(
        version,
        {
            "orders": [{"partition_index": 0, "high_watermark": 5, "records": b"x" * 300, "aborted_transactions": [(1, 2)]}],
            "audit": [
                {"partition_index": 1, "high_watermark": 0, "error_code": ErrorCode(6)},
                {"partition_index": 2, "high_watermark": 0, "error_code": ErrorCode(3), "records": b"y" * 10},
            ],
        },
    )
    frame = encode_response(value, 1)
    for cut in range(len(frame) + 1):
        scanner = scan_in_pieces(version, frame, [cut])
        assert scanner.complete
        assert scanner.codes == [6, 3]
    one_byte_at_a_time = FetchErrorScan(version)
    for i in range(len(frame)):
        one_byte_at_a_time.feed(frame[i : i + 1])
    assert one_byte_at_a_time.codes == [6, 3]


def test_garbage_stops_the_scan_without_raising() -> None:
    scanner = FetchErrorScan(12)
    scanner.feed(b"\x00\x00\x00\x10" + b"\x00" * 4 + b"\xff" * 40)
    assert not scanner.complete


def test_scannable_versions() -> None:
    assert scannable(4) and scannable(MAX_VERSION)
    assert not scannable(3) and not scannable(MAX_VERSION + 1)


def produce_class(version: int) -> type:
    return importlib.import_module(f"kio.schema.produce.v{version}.response").ProduceResponse


@pytest.mark.parametrize("version", list(range(PRODUCE_MIN_VERSION, PRODUCE_MAX_VERSION + 1)))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
@given(data=st.data())
def test_produce_scan_finds_the_error_codes_a_decode_finds(version: int, data: st.DataObject) -> None:
    frame = encode_response(data.draw(kio_values(produce_class(version))), 3)
    decoded = decode_response(apis.PRODUCE, version, frame[4:])
    assert sorted(produce_error_codes(version, frame)) == sorted(error_codes(decoded))


@pytest.mark.parametrize("version", [3, 8, 9, 13])
def test_a_truncated_produce_response_is_not_guessed(version: int) -> None:
    from tests.test_response_faults import produce_response

    frame = encode_response(produce_response(version, {"orders": [(0, 6, 5), (1, 0, 9)]}), 3)
    assert produce_error_codes(version, frame) == [6]
    for cut in range(8, len(frame) - 1):
        codes = produce_error_codes(version, frame[:cut])
        assert codes is None or codes in ([], [6]), cut
    assert produce_scannable(version) and not produce_scannable(PRODUCE_MAX_VERSION + 1)


@pytest.mark.parametrize("version", [4, 12, 16])
def test_skipping_records_unseen_gives_the_same_codes(version: int) -> None:
    """The proxy splices a pending skip past the scanner; the codes must not change."""
    from tests.test_response_faults import fetch_response

    value = fetch_response(
        version,
        {
            "orders": [{"partition_index": 0, "high_watermark": 5, "records": b"x" * 5000}],
            "audit": [{"partition_index": 1, "high_watermark": 0, "error_code": ErrorCode(3), "records": b"y" * 700}],
        },
    )
    frame = encode_response(value, 1)
    scanner = FetchErrorScan(version)
    pos = 0
    skipped = 0
    while pos < len(frame):
        if scanner.pending_skip >= 100:
            n = min(scanner.pending_skip, 333)  # in pieces, as a pipe's capacity would cut it
            scanner.skip(n)
            skipped += n
        else:
            n = max(scanner.pending_read, 1)
            scanner.feed(frame[pos : pos + n])
        pos += n
    assert scanner.complete and scanner.codes == [3]
    assert skipped >= 5000 + 700 - 200
    with pytest.raises(ValueError):
        scanner.skip(1)
