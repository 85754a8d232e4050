"""Request headers, kio payload round-trips and error-code extraction."""

from __future__ import annotations

import dataclasses
import datetime
import struct
import types
import typing
import uuid
from functools import lru_cache

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema, load_response_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kproxy.protocol import apis
from kproxy.protocol.codec import (
    DecodeError,
    decode_request,
    decode_response,
    encode_request,
    encode_response,
    error_codes,
    parse_request_header,
    request_is_flexible,
)

# ------------------------------------------------------------ kio strategies
#
# kio's primitive types are phantom newtypes (i32, TopicName, i32Timedelta,
# ...) that st.from_type does not know. These strategies follow each field's
# kafka_type and draw only values the wire can carry back unchanged:
# millisecond timedeltas, UTC millisecond timestamps, no zero UUID where None
# would come back instead, and small collections to keep encoding fast.

_INT_BOUNDS = {
    "int8": (-(2**7), 2**7 - 1),
    "int16": (-(2**15), 2**15 - 1),
    "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1),
    "uint16": (0, 2**16 - 1),
}
_MAX_ITEMS = 2


def _optional(tp) -> tuple[typing.Any, bool]:
    if isinstance(tp, types.UnionType) or typing.get_origin(tp) is typing.Union:
        return next(a for a in typing.get_args(tp) if a is not type(None)), True
    return tp, False


def _scalar(kafka_type: str, tp) -> st.SearchStrategy:
    if kafka_type in _INT_BOUNDS:
        low, high = _INT_BOUNDS[kafka_type]
        return st.integers(low, high).map(tp)
    if kafka_type == "string":
        return st.text(max_size=12)
    if kafka_type == "bytes":
        return st.binary(max_size=16)
    if kafka_type == "records":
        return st.binary(max_size=16).map(Records)
    if kafka_type == "bool":
        return st.booleans()
    if kafka_type == "error_code":
        return st.sampled_from(list(ErrorCode))
    if kafka_type == "uuid":
        return st.integers(1, 2**128 - 1).map(lambda n: uuid.UUID(int=n))
    if kafka_type == "timedelta_i32":
        return st.integers(-(2**31), 2**31 - 1).map(lambda ms: tp.parse(datetime.timedelta(milliseconds=ms)))
    if kafka_type == "timedelta_i64":
        return st.integers(-(2**40), 2**40).map(lambda ms: tp.parse(datetime.timedelta(milliseconds=ms)))
    if kafka_type == "datetime_i64":
        # kio's TZAware refuses sub-second values (microsecond must be 0)
        return st.integers(0, 2**33).map(lambda s: tp.parse(datetime.datetime.fromtimestamp(s, tz=datetime.UTC)))
    if kafka_type == "float64":
        return st.floats(allow_nan=False, allow_infinity=False).map(tp)
    raise TypeError(f"no strategy for kafka type {kafka_type!r}")


def _field_strategy(f: dataclasses.Field) -> st.SearchStrategy:
    tp, nullable = _optional(f.type)
    kafka_type = f.metadata.get("kafka_type")
    if typing.get_origin(tp) is tuple:
        item = typing.get_args(tp)[0]
        inner = kio_values(item) if dataclasses.is_dataclass(item) else _scalar(kafka_type, item)
        strategy = st.lists(inner, max_size=_MAX_ITEMS).map(tuple)
    elif dataclasses.is_dataclass(tp):
        strategy = kio_values(tp)
    else:
        strategy = _scalar(kafka_type, tp)
    return st.none() | strategy if nullable else strategy


@lru_cache(maxsize=None)
def kio_values(cls: type) -> st.SearchStrategy:
    """Any value of a kio entity class that survives an encode/decode round trip."""
    return st.builds(cls, **{f.name: st.deferred(lambda f=f: _field_strategy(f)) for f in dataclasses.fields(cls)})


# ------------------------------------------------------------ request headers


def raw_header(api_key, version, correlation_id, client_id: bytes | None, tagged: bytes | None = None) -> bytes:
    head = struct.pack(">hhi", api_key, version, correlation_id)
    head += b"\xff\xff" if client_id is None else struct.pack(">h", len(client_id)) + client_id
    if tagged is not None:
        head += tagged
    return head


# two tagged fields: tag 0 with 3 bytes, tag 5 with 1 byte
TAGGED = b"\x02" + b"\x00\x03abc" + b"\x05\x01z"


def test_non_flexible_header():
    payload = raw_header(apis.PRODUCE, 3, 77, b"client-1") + b"BODY"
    header = parse_request_header(payload)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (0, 3, 77, "client-1")
    assert payload[header.body_offset :] == b"BODY"
    assert not request_is_flexible(apis.PRODUCE, 3)


def test_flexible_header_skips_tagged_fields():
    payload = raw_header(apis.PRODUCE, 9, -5, "k\u00e9y".encode(), TAGGED) + b"BODY"
    header = parse_request_header(payload)
    assert (header.api_version, header.correlation_id, header.client_id) == (9, -5, "k\u00e9y")
    assert payload[header.body_offset :] == b"BODY"
    assert request_is_flexible(apis.PRODUCE, 9)


def test_null_client_id():
    payload = raw_header(apis.METADATA, 12, 1, None, b"\x00") + b"B"
    header = parse_request_header(payload)
    assert header.client_id is None
    assert payload[header.body_offset :] == b"B"


def test_header_at_an_offset_inside_a_buffer():
    prefix = b"\x00" * 7
    payload = prefix + raw_header(apis.END_TXN, 4, 9, b"c", b"\x00") + b"B"
    header = parse_request_header(payload, start=len(prefix))
    assert header.correlation_id == 9
    assert payload[len(prefix) + header.body_offset :] == b"B"


@pytest.mark.parametrize(("api_key", "version"), [(999, 0), (apis.PRODUCE, 99), (apis.PRODUCE, 0), (-1, 3)])
def test_unknown_api_or_version_still_names_the_request(api_key, version):
    payload = raw_header(api_key, version, 4242, b"who", TAGGED) + b"whatever"
    header = parse_request_header(payload)
    assert (header.api_key, header.api_version, header.correlation_id, header.client_id) == (
        api_key, version, 4242, "who")
    assert header.body_offset == -1
    with pytest.raises(DecodeError):
        decode_request(header, payload)


@pytest.mark.parametrize("payload", [b"", b"\x00\x01\x00", raw_header(0, 3, 1, None)[:9]])
def test_too_short_for_a_header(payload):
    with pytest.raises(DecodeError):
        parse_request_header(payload)


def test_client_id_past_the_end():
    with pytest.raises(DecodeError):
        parse_request_header(struct.pack(">hhih", 0, 3, 1, 50) + b"short")


def test_tagged_fields_past_the_end():
    with pytest.raises(DecodeError):
        parse_request_header(raw_header(apis.PRODUCE, 9, 1, b"c", b"\x01\x00\x09ab"))
    with pytest.raises(DecodeError):
        parse_request_header(raw_header(apis.PRODUCE, 9, 1, b"c", b"\x01\x80"))


def every_header_version():
    for key, (low, high) in sorted(apis.DECODABLE.items()):
        for version in range(low, high + 1):
            yield key, version


@pytest.mark.parametrize(("api_key", "version"), list(every_header_version()))
def test_body_offset_for_every_api_and_version(api_key, version):
    flexible = request_is_flexible(api_key, version)
    payload = raw_header(api_key, version, 3, b"id", TAGGED if flexible else None) + b"\x00BODY"
    header = parse_request_header(payload)
    assert payload[header.body_offset :] == b"\x00BODY"


# ------------------------------------------------------------ payload round trips

DECODED_APIS = [
    apis.METADATA, apis.FIND_COORDINATOR, apis.DESCRIBE_CLUSTER, apis.API_VERSIONS, apis.PRODUCE, apis.FETCH,
    apis.END_TXN, apis.INIT_PRODUCER_ID, apis.ADD_PARTITIONS_TO_TXN, apis.TXN_OFFSET_COMMIT,
]


def decoded_versions():
    for key in DECODED_APIS:
        low, high = apis.DECODABLE[key]
        for version in range(low, high + 1):
            yield pytest.param(key, version, id=f"{apis.api_name(key)}-v{version}")


ROUNDTRIP = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@pytest.mark.parametrize(("api_key", "version"), list(decoded_versions()))
def test_request_roundtrip(api_key, version):
    cls = load_request_schema(api_key, version)

    @ROUNDTRIP
    @given(kio_values(cls), st.integers(-(2**31), 2**31 - 1), st.none() | st.text(max_size=10))
    def check(value, correlation_id, client_id):
        frame = encode_request(value, correlation_id, client_id)
        assert int.from_bytes(frame[:4], "big") == len(frame) - 4
        payload = frame[4:]
        header = parse_request_header(payload)
        assert (header.api_key, header.api_version) == (api_key, version)
        assert (header.correlation_id, header.client_id) == (correlation_id, client_id)
        assert decode_request(header, payload) == value

    check()


@pytest.mark.parametrize(("api_key", "version"), list(decoded_versions()))
def test_response_roundtrip(api_key, version):
    cls = load_response_schema(api_key, version)

    @ROUNDTRIP
    @given(kio_values(cls), st.integers(-(2**31), 2**31 - 1))
    def check(value, correlation_id):
        frame = encode_response(value, correlation_id)
        assert int.from_bytes(frame[4:8], "big", signed=True) == correlation_id
        assert decode_response(api_key, version, frame[4:]) == value

    check()


def test_undecodable_body_raises_decode_error():
    frame = encode_request(load_request_schema(apis.END_TXN, 3)(
        transactional_id="t", producer_id=1, producer_epoch=0, committed=True), 1, "c")
    payload = frame[4:-3]  # body cut short
    with pytest.raises(DecodeError):
        decode_request(parse_request_header(payload), payload)
    with pytest.raises(DecodeError):
        decode_response(apis.END_TXN, 3, b"\x00\x00\x00\x01\x00")


def test_decode_response_of_an_unknown_version():
    with pytest.raises(DecodeError):
        decode_response(apis.PRODUCE, 99, b"\x00\x00\x00\x01")


# ------------------------------------------------------------ error codes


def _produce_response(codes):
    from kio.schema.produce.v9 import response as r

    parts = tuple(
        r.PartitionProduceResponse(index=i, error_code=ErrorCode(c), base_offset=-1, record_errors=())
        for i, c in enumerate(codes)
    )
    return r.ProduceResponse(responses=(r.TopicProduceResponse(name="t", partition_responses=parts),))


def test_error_codes_are_distinct_nonzero_and_nested():
    assert error_codes(_produce_response([0, 6, 0, 6, 47])) in ([6, 47], [47, 6])
    assert error_codes(_produce_response([0, 0])) == []


def test_error_codes_limit():
    assert len(error_codes(_produce_response([6, 47, 48, 49]), limit=2)) == 2


def test_error_codes_top_level():
    from kio.schema.end_txn.v3.response import EndTxnResponse

    assert error_codes(EndTxnResponse(throttle_time=datetime.timedelta(0), error_code=ErrorCode(48))) == [48]


@pytest.mark.parametrize("version", [0, 3])
def test_error_codes_sees_partition_error_code(version):
    """AddPartitionsToTxn v0-3 names its per-partition code partition_error_code."""
    module = __import__(f"kio.schema.add_partitions_to_txn.v{version}.response", fromlist=["x"])
    result = module.AddPartitionsToTxnPartitionResult(partition_index=0, partition_error_code=ErrorCode(48))
    topic = module.AddPartitionsToTxnTopicResult(name="t", results_by_partition=(result,))
    response = module.AddPartitionsToTxnResponse(
        throttle_time=datetime.timedelta(0), results_by_topic_v3_and_below=(topic,))
    assert error_codes(response) == [48]
