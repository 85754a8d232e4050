"""Error responses the proxy builds itself, for every version kio has.

Each request is a kio dataclass with two entries in every collection (two
topics of two partitions, two coordinator keys, two transactions, ...). The
error response is encoded and decoded again with the proxy's codec, so what
is checked is what a client would read off the wire.
"""

from __future__ import annotations

import dataclasses
import datetime
import types
import typing
import uuid

import pytest
from kio.index import load_request_schema
from kio.schema.errors import ErrorCode
from kio.static.primitive import Records

from kproxy.protocol import apis
from kproxy.protocol.codec import decode_response, encode_response
from kproxy.protocol.error_responses import (
    MIRRORED_APIS,
    UnsupportedErrorResponse,
    error_response,
    replace_error_codes,
)

NOT_LEADER = int(ErrorCode.not_leader_or_follower)
INVALID_TXN_STATE = int(ErrorCode.invalid_txn_state)
UNSUPPORTED_VERSION = int(ErrorCode.unsupported_version)
FANOUT = 2  # entries per collection in the sample requests


# ------------------------------------------------------------ sample requests


def _unwrap(tp):
    if isinstance(tp, types.UnionType):
        return next(a for a in typing.get_args(tp) if a is not type(None))
    return tp


def _scalar(kafka_type: str, tp, name: str, seed: int):
    if kafka_type == "string":
        return f"{name}-{seed}"
    if kafka_type in ("int8", "int16", "int32", "int64", "uint16"):
        return tp(seed)
    if kafka_type == "bool":
        return False
    if kafka_type == "uuid":
        return uuid.UUID(int=seed + 1)
    if kafka_type in ("timedelta_i32", "timedelta_i64"):
        return tp.parse(datetime.timedelta(seconds=1))
    if kafka_type == "bytes":
        return b"x"
    if kafka_type == "records":
        return Records(b"")
    if kafka_type == "float64":
        return tp(1.0)
    if kafka_type == "error_code":
        return ErrorCode.none
    raise TypeError(f"no sample for {name} ({kafka_type})")


def sample_request(cls, seed: int = 0):
    """An entity of `cls` (a request, or any kio class) with FANOUT entries in every collection."""
    kwargs = {}
    for f in dataclasses.fields(cls):
        if "tag" in f.metadata:
            continue
        tp = _unwrap(f.type)
        kafka_type = f.metadata.get("kafka_type", "")
        if typing.get_origin(tp) is tuple:
            item = typing.get_args(tp)[0]
            if dataclasses.is_dataclass(item):
                kwargs[f.name] = tuple(sample_request(item, seed * 10 + i) for i in range(FANOUT))
            else:
                kwargs[f.name] = tuple(_scalar(kafka_type, item, f.name, i) for i in range(FANOUT))
        elif f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
            if dataclasses.is_dataclass(tp):
                kwargs[f.name] = sample_request(tp, seed)
            else:
                kwargs[f.name] = _scalar(kafka_type, tp, f.name, seed)
    return cls(**kwargs)


# ------------------------------------------------------------ expectations


def _field_names(value) -> set[str]:
    return {f.name for f in dataclasses.fields(value)}


def expected_code_count(api_key: int, version: int, response) -> int:
    """How many error codes the response must carry for a FANOUT request."""
    names = _field_names(response)
    partitions = FANOUT * FANOUT  # two topics of two partitions
    top = 1 if "error_code" in names else 0
    if api_key in (apis.PRODUCE, apis.FETCH, apis.TXN_OFFSET_COMMIT, apis.API_KEYS["offset_commit"],
                   apis.API_KEYS["list_offsets"]):
        return top + partitions
    if api_key == apis.METADATA:
        return top + FANOUT  # per requested topic; partitions unknown
    if api_key == apis.FIND_COORDINATOR:
        return FANOUT if "coordinators" in names else 1
    if api_key == apis.ADD_PARTITIONS_TO_TXN:
        return top + (FANOUT * partitions if "results_by_transaction" in names else partitions)
    if api_key == apis.API_KEYS["offset_fetch"]:
        return FANOUT * (1 + partitions) if "groups" in names else top + partitions
    if api_key == apis.API_KEYS["leave_group"]:
        return top + (FANOUT if "members" in names else 0)
    return top


def all_error_codes(value) -> list[int]:
    """Every error code field (whatever its name) anywhere in a payload."""
    found: list[int] = []
    if isinstance(value, tuple):
        for item in value:
            found.extend(all_error_codes(item))
        return found
    if not dataclasses.is_dataclass(value):
        return found
    for f in dataclasses.fields(value):
        v = getattr(value, f.name)
        if f.metadata.get("kafka_type") == "error_code":
            found.append(int(v))
        else:
            found.extend(all_error_codes(v))
    return found


def roundtrip(api_key: int, version: int, response):
    frame = encode_response(response, correlation_id=4242)
    assert int.from_bytes(frame[:4], "big") == len(frame) - 4
    assert int.from_bytes(frame[4:8], "big") == 4242
    return decode_response(api_key, version, frame[4:])


def every_version(api_keys):
    for key in sorted(api_keys):
        low, high = apis.DECODABLE[key]
        for version in range(low, high + 1):
            yield pytest.param(key, version, id=f"{apis.api_name(key)}-v{version}")


# ------------------------------------------------------------ tests


@pytest.mark.parametrize(("api_key", "version"), list(every_version(MIRRORED_APIS)))
def test_error_response_roundtrips_with_the_code_everywhere(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    response = error_response(api_key, version, request, NOT_LEADER)
    decoded = roundtrip(api_key, version, response)
    assert decoded == response
    codes = all_error_codes(decoded)
    assert codes == [NOT_LEADER] * expected_code_count(api_key, version, decoded)
    if "throttle_time" in _field_names(decoded):
        assert decoded.throttle_time == datetime.timedelta(0)


def _produce_keys(request, response):
    sent = [(t.name if hasattr(t, "name") else t.topic_id, p.index) for t in request.topic_data for p in t.partition_data]
    got = [(t.name if hasattr(t, "name") else t.topic_id, p.index) for t in response.responses for p in t.partition_responses]
    return sent, got


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.PRODUCE])))
def test_produce_error_mirrors_partitions_with_unknown_offsets(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    decoded = roundtrip(api_key, version, error_response(api_key, version, request, INVALID_TXN_STATE))
    sent, got = _produce_keys(request, decoded)
    assert got == sent and len(got) == FANOUT * FANOUT
    for topic in decoded.responses:
        for part in topic.partition_responses:
            assert part.base_offset == -1
            assert part.log_append_time is None
            if hasattr(part, "log_start_offset"):
                assert part.log_start_offset == -1


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.FETCH])))
def test_fetch_error_has_no_records_and_unknown_watermarks(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    decoded = roundtrip(api_key, version, error_response(api_key, version, request, NOT_LEADER))
    ident = "topic" if version < 13 else "topic_id"
    assert [getattr(t, ident) for t in decoded.responses] == [getattr(t, ident) for t in request.topics]
    for sent, got in zip(request.topics, decoded.responses):
        assert [p.partition_index for p in got.partitions] == [p.partition for p in sent.partitions]
        for part in got.partitions:
            assert part.high_watermark == -1 and part.last_stable_offset == -1
            assert part.records == b""  # empty, never null (librdkafka rejects null)
            assert not part.aborted_transactions


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.FIND_COORDINATOR])))
def test_find_coordinator_error_names_no_broker(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    decoded = roundtrip(api_key, version, error_response(api_key, version, request, 15))
    entries = decoded.coordinators if version >= 4 else (decoded,)
    if version >= 4:
        assert [c.key for c in entries] == list(request.coordinator_keys)
    for entry in entries:
        assert (entry.node_id, entry.host, entry.port) == (-1, "", -1)


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.INIT_PRODUCER_ID, apis.END_TXN])))
def test_producer_id_and_epoch_are_unknown(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    decoded = roundtrip(api_key, version, error_response(api_key, version, request, 47))
    if hasattr(decoded, "producer_id"):
        assert (decoded.producer_id, decoded.producer_epoch) == (-1, -1)
    assert decoded.error_code == 47


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.ADD_PARTITIONS_TO_TXN])))
def test_add_partitions_to_txn_answers_per_topic_or_per_transaction(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    decoded = roundtrip(api_key, version, error_response(api_key, version, request, INVALID_TXN_STATE))
    if version <= 3:
        per_topic = [(t.name, [p.partition_index for p in t.results_by_partition])
                     for t in decoded.results_by_topic_v3_and_below]
        assert per_topic == [(t.name, list(t.partitions)) for t in request.v3_and_below_topics]
    else:
        assert decoded.error_code == INVALID_TXN_STATE
        got = [(r.transactional_id, [(t.name, [p.partition_index for p in t.results_by_partition])
                                     for t in r.topic_results]) for r in decoded.results_by_transaction]
        sent = [(x.transactional_id, [(t.name, list(t.partitions)) for t in x.topics]) for x in request.transactions]
        assert got == sent


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.API_KEYS["offset_fetch"]])))
def test_offset_fetch_error_has_no_committed_offsets(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    decoded = roundtrip(api_key, version, error_response(api_key, version, request, 16))
    groups = decoded.groups if version >= 8 else (decoded,)
    assert len(groups) == (FANOUT if version >= 8 else 1)
    for group in groups:
        parts = [p for t in group.topics for p in t.partitions]
        assert len(parts) == FANOUT * FANOUT
        assert all(p.committed_offset == -1 and p.metadata == "" for p in parts)


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.METADATA])))
def test_metadata_for_all_topics_gets_no_topics_and_no_brokers(api_key, version):
    cls = load_request_schema(api_key, version)
    if "None" not in str(next(f.type for f in dataclasses.fields(cls) if f.name == "topics")):
        pytest.skip("this version cannot ask for all topics")
    request = dataclasses.replace(sample_request(cls), topics=None)
    decoded = roundtrip(api_key, version, error_response(api_key, version, request, 3))
    assert decoded.topics == () and decoded.brokers == ()
    assert all_error_codes(decoded) == ([3] if hasattr(decoded, "error_code") else [])


def test_join_group_error_has_no_generation_or_member():
    version = apis.DECODABLE[apis.API_KEYS["join_group"]][1]
    key = apis.API_KEYS["join_group"]
    request = sample_request(load_request_schema(key, version))
    decoded = roundtrip(key, version, error_response(key, version, request, 27))
    assert (decoded.generation_id, decoded.member_id, decoded.leader, decoded.members) == (-1, "", "", ())


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.API_VERSIONS])))
def test_api_versions_unsupported_version_says_which_versions_work(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    decoded = roundtrip(api_key, version, error_response(api_key, version, request, UNSUPPORTED_VERSION))
    assert decoded.error_code == UNSUPPORTED_VERSION
    assert [(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys] == [
        (apis.API_VERSIONS, *apis.DECODABLE[apis.API_VERSIONS])
    ]
    other = roundtrip(api_key, version, error_response(api_key, version, request, NOT_LEADER))
    assert other.api_keys == ()


def test_generic_response_for_an_api_with_a_top_level_error():
    key = apis.DESCRIBE_CLUSTER
    for version in range(apis.DECODABLE[key][0], apis.DECODABLE[key][1] + 1):
        request = sample_request(load_request_schema(key, version))
        decoded = roundtrip(key, version, error_response(key, version, request, 31))
        assert decoded.error_code == 31 and decoded.brokers == () and decoded.controller_id == -1
        assert decoded.cluster_authorized_operations == -(2**31)


def test_unsupported_api_names_the_api():
    key = apis.API_KEYS["create_topics"]  # errors only per topic
    version = apis.DECODABLE[key][1]
    request = sample_request(load_request_schema(key, version))
    with pytest.raises(UnsupportedErrorResponse, match="create_topics"):
        error_response(key, version, request, NOT_LEADER)
    with pytest.raises(UnsupportedErrorResponse, match="api key 0"):
        error_response(apis.PRODUCE, 0, None, NOT_LEADER)  # kio has no Produce v0
    assert issubclass(UnsupportedErrorResponse, ValueError)


def test_unknown_error_code_is_refused():
    request = sample_request(load_request_schema(apis.END_TXN, 3))
    with pytest.raises(ValueError, match="unknown Kafka error code 31999"):
        error_response(apis.END_TXN, 3, request, 31999)


# ------------------------------------------------------------ replace_error_codes


def _mixed_produce_response(version: int):
    """A broker's answer where one partition succeeded and one failed."""
    from kproxy.protocol.codec import response_type

    request = sample_request(load_request_schema(apis.PRODUCE, version))
    failed = error_response(apis.PRODUCE, version, request, NOT_LEADER)
    topic = failed.responses[0]
    ok = dataclasses.replace(topic.partition_responses[0], error_code=ErrorCode.none, base_offset=17)
    topic = dataclasses.replace(topic, partition_responses=(ok, topic.partition_responses[1]))
    assert response_type(apis.PRODUCE, version) is type(failed)
    return dataclasses.replace(failed, responses=(topic,))


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.PRODUCE])))
def test_replace_error_codes_reaches_every_partition(api_key, version):
    original = _mixed_produce_response(version)
    replaced = roundtrip(api_key, version, replace_error_codes(original, INVALID_TXN_STATE))
    assert all_error_codes(replaced) == [INVALID_TXN_STATE, INVALID_TXN_STATE]
    # only the codes change: the offset the broker assigned is still there
    assert replaced.responses[0].partition_responses[0].base_offset == 17
    assert all_error_codes(original) == [0, NOT_LEADER]  # input untouched

    only_failed = replace_error_codes(original, INVALID_TXN_STATE, only_nonzero=True)
    assert all_error_codes(only_failed) == [0, INVALID_TXN_STATE]


@pytest.mark.parametrize(("api_key", "version"), list(every_version([apis.ADD_PARTITIONS_TO_TXN])))
def test_replace_error_codes_finds_differently_named_code_fields(api_key, version):
    request = sample_request(load_request_schema(api_key, version))
    success = replace_error_codes(error_response(api_key, version, request, NOT_LEADER), 0)
    assert set(all_error_codes(success)) == {0}
    replaced = roundtrip(api_key, version, replace_error_codes(success, 51))
    assert set(all_error_codes(replaced)) == {51}
    assert len(all_error_codes(replaced)) == expected_code_count(api_key, version, replaced)


def test_replace_error_codes_returns_the_same_object_when_nothing_changes():
    request = sample_request(load_request_schema(apis.END_TXN, 4))
    response = error_response(apis.END_TXN, 4, request, 0)
    assert replace_error_codes(response, 48, only_nonzero=True) is response
    assert replace_error_codes(response, 0) is response


def test_every_error_code_is_named_as_a_rule_spells_it() -> None:
    from kproxy.faults.kafka_errors import resolve_error
    from kproxy.protocol.errors import ERROR_NAMES, error_name

    assert error_name(NOT_LEADER) == "NOT_LEADER_OR_FOLLOWER" and error_name(0) == "NONE"
    for code, name in ERROR_NAMES.items():
        assert error_name(code) == name and resolve_error(name) == code
    assert error_name(32767) == "32767"  # a newer broker's code is shown, not refused
