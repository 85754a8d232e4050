"""Address rewriting of every broker-naming response, and ApiVersions capping.

Responses are built in every version kio has, encoded and decoded the way
the proxy meets them, rewritten, and encoded again: the bytes a client would
receive must not contain an upstream host or port.
"""

from __future__ import annotations

import dataclasses
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_response_schema
from kio.schema.errors import ErrorCode

from kproxy.protocol import apis
from kproxy.protocol.codec import decode_response, encode_response
from kproxy.protocol.broker_addresses import (
    LEADER_HINT_MIN_VERSION,
    AddressMap,
    Endpoint,
    STREAMING_VERSION_CAPS,
    cap_api_versions,
    rewrite_addresses,
)
from tests.test_codec import kio_values
from tests.test_error_responses import sample_request as sample

UPSTREAM_HOST = "upstream-broker.internal.example"
UPSTREAM_PORT = 19092  # + node id; 0x4A94 does not occur in the sample payloads
ADVERTISE = "proxy.local"
PORT_BASE = 40000
NODES = (1, 7)


def amap() -> AddressMap:
    return AddressMap(advertise_host=ADVERTISE, broker_port_base=PORT_BASE)


def endpoints(item_cls, node_field: str = "node_id"):
    """Two upstream brokers as entries of `item_cls` (rack kept to check it survives)."""
    base = sample(item_cls)
    return tuple(
        dataclasses.replace(base, **{node_field: n}, host=UPSTREAM_HOST, port=UPSTREAM_PORT + n)
        for n in NODES
    )


def item_cls(cls, field_name):
    tp = next(f.type for f in dataclasses.fields(cls) if f.name == field_name)
    return tp.__args__[0]


def wire(api_key, version, value):
    """Encode and decode, as the proxy receives it from a broker."""
    return decode_response(api_key, version, encode_response(value, 1)[4:])


def assert_no_upstream_address(api_key, version, rewritten):
    data = encode_response(rewritten, 1)
    assert UPSTREAM_HOST.encode() not in data
    for n in NODES:
        assert struct.pack(">i", UPSTREAM_PORT + n) not in data
    return decode_response(api_key, version, data[4:])


def check_entries(entries, node_field="node_id"):
    assert [(getattr(e, node_field), e.host, e.port) for e in entries] == [
        (n, ADVERTISE, PORT_BASE + n) for n in NODES
    ]


def versions(api_key, low=None):
    first, last = apis.DECODABLE[api_key]
    return [pytest.param(v, id=f"v{v}") for v in range(max(first, low or first), last + 1)]


# ------------------------------------------------------------ broker-naming responses


@pytest.mark.parametrize("version", versions(apis.METADATA))
def test_metadata_brokers(version):
    cls = load_response_schema(apis.METADATA, version)
    response = wire(apis.METADATA, version,
                    dataclasses.replace(sample(cls), brokers=endpoints(item_cls(cls, "brokers"))))
    addresses = amap()
    rewritten, learnt = rewrite_addresses(response, addresses)
    assert learnt == list(NODES)
    decoded = assert_no_upstream_address(apis.METADATA, version, rewritten)
    check_entries(decoded.brokers)
    if hasattr(decoded.brokers[0], "rack"):
        assert [b.rack for b in decoded.brokers] == [b.rack for b in response.brokers]
    assert decoded.topics == response.topics  # nothing else touched
    assert addresses.upstream == {n: Endpoint(UPSTREAM_HOST, UPSTREAM_PORT + n) for n in NODES}
    # the same brokers again: nothing new to listen for
    assert rewrite_addresses(response, addresses)[1] == []


@pytest.mark.parametrize("version", versions(apis.FIND_COORDINATOR))
def test_find_coordinator(version):
    cls = load_response_schema(apis.FIND_COORDINATOR, version)
    base = sample(cls)
    if version <= 3:
        response = dataclasses.replace(base, node_id=7, host=UPSTREAM_HOST, port=UPSTREAM_PORT + 7)
    else:
        coordinators = tuple(
            dataclasses.replace(c, node_id=n, host=UPSTREAM_HOST, port=UPSTREAM_PORT + n)
            for c, n in zip(base.coordinators, NODES)
        )
        response = dataclasses.replace(base, coordinators=coordinators)
    response = wire(apis.FIND_COORDINATOR, version, response)
    rewritten, learnt = rewrite_addresses(response, amap())
    decoded = assert_no_upstream_address(apis.FIND_COORDINATOR, version, rewritten)
    if version <= 3:
        assert learnt == [7]
        assert (decoded.node_id, decoded.host, decoded.port) == (7, ADVERTISE, PORT_BASE + 7)
    else:
        assert learnt == list(NODES)
        check_entries(decoded.coordinators)
        assert [c.key for c in decoded.coordinators] == [c.key for c in response.coordinators]


@pytest.mark.parametrize("version", versions(apis.FIND_COORDINATOR))
def test_find_coordinator_error_is_left_alone(version):
    cls = load_response_schema(apis.FIND_COORDINATOR, version)
    base = sample(cls)
    if version <= 3:
        response = dataclasses.replace(base, error_code=ErrorCode.coordinator_not_available, node_id=-1, host="", port=-1)
    else:
        response = dataclasses.replace(
            base, coordinators=tuple(dataclasses.replace(c, error_code=ErrorCode.coordinator_not_available, node_id=-1, host="", port=-1)
                                     for c in base.coordinators))
    response = wire(apis.FIND_COORDINATOR, version, response)
    addresses = amap()
    rewritten, learnt = rewrite_addresses(response, addresses)
    assert rewritten is response
    assert learnt == [] and addresses.upstream == {}


@pytest.mark.parametrize("version", versions(apis.DESCRIBE_CLUSTER))
def test_describe_cluster(version):
    cls = load_response_schema(apis.DESCRIBE_CLUSTER, version)
    brokers = endpoints(item_cls(cls, "brokers"), node_field="broker_id")
    response = wire(apis.DESCRIBE_CLUSTER, version, dataclasses.replace(sample(cls), brokers=brokers))
    rewritten, learnt = rewrite_addresses(response, amap())
    decoded = assert_no_upstream_address(apis.DESCRIBE_CLUSTER, version, rewritten)
    check_entries(decoded.brokers, node_field="broker_id")
    assert learnt == list(NODES)


@pytest.mark.parametrize(
    ("api_key", "version"),
    [pytest.param(k, v.values[0], id=f"{apis.api_name(k)}-{v.id}")
     for k, low in LEADER_HINT_MIN_VERSION.items() for v in versions(k, low)],
)
def test_leader_hints_in_produce_and_fetch(api_key, version):
    cls = load_response_schema(api_key, version)
    response = wire(api_key, version,
                    dataclasses.replace(sample(cls), node_endpoints=endpoints(item_cls(cls, "node_endpoints"))))
    assert UPSTREAM_HOST.encode() in encode_response(response, 1)  # the tagged field is on the wire
    rewritten, learnt = rewrite_addresses(response, amap())
    decoded = assert_no_upstream_address(api_key, version, rewritten)
    check_entries(decoded.node_endpoints)
    assert learnt == list(NODES)
    assert decoded.responses == response.responses


@pytest.mark.parametrize("version", [pytest.param(v, id=f"v{v}") for v in (3, 9)])
def test_produce_without_leader_hints_is_returned_as_is(version):
    cls = load_response_schema(apis.PRODUCE, version)
    response = wire(apis.PRODUCE, version, sample(cls))
    assert rewrite_addresses(response, amap()) == (response, [])


@settings(max_examples=40, deadline=None)
@given(kio_values(load_response_schema(apis.METADATA, 12)),
       st.lists(st.integers(0, 5000), min_size=1, max_size=4, unique=True))
def test_metadata_any_payload(response, node_ids):
    cls = type(response)
    entry = item_cls(cls, "brokers")
    brokers = tuple(entry(node_id=n, host=UPSTREAM_HOST, port=UPSTREAM_PORT + n, rack=None) for n in node_ids)
    response = dataclasses.replace(response, brokers=brokers)
    rewritten, learnt = rewrite_addresses(response, amap())
    assert sorted(learnt) == sorted(node_ids)
    assert UPSTREAM_HOST.encode() not in encode_response(rewritten, 1)
    assert [(b.node_id, b.port) for b in rewritten.brokers] == [(n, PORT_BASE + n) for n in node_ids]
    assert dataclasses.replace(rewritten, brokers=response.brokers) == response


# ------------------------------------------------------------ AddressMap


def test_learn_reports_new_and_moved_brokers():
    addresses = amap()
    assert addresses.learn(1, "a", 9092) is True
    assert addresses.learn(1, "a", 9092) is False
    assert addresses.learn(1, "b", 9092) is True  # moved
    assert addresses.learn(2, "b", 9093) is True
    assert addresses.upstream == {1: Endpoint("b", 9092), 2: Endpoint("b", 9093)}
    assert str(addresses.upstream[2]) == "b:9093"


def test_port_for_is_base_plus_node_id():
    addresses = AddressMap(advertise_host="h", broker_port_base=30000)
    assert addresses.port_for(0) == 30000
    assert addresses.port_for(42) == 30042
    assert addresses.port_for(35535) == 65535
    with pytest.raises(ValueError, match="35536"):
        addresses.port_for(35536)
    with pytest.raises(ValueError):
        addresses.port_for(-1)
    assert AddressMap(advertise_host="h", broker_port_base=0).port_for(65535) == 65535
    with pytest.raises(ValueError):
        AddressMap(advertise_host="h", broker_port_base=0).port_for(65536)


def test_node_id_past_the_port_range_is_refused_while_rewriting():
    cls = load_response_schema(apis.METADATA, 12)
    entry = item_cls(cls, "brokers")
    response = dataclasses.replace(sample(cls), brokers=(entry(node_id=30000, host="x", port=1),))
    with pytest.raises(ValueError, match="port scheme"):
        rewrite_addresses(response, amap())


def test_may_name_brokers():
    addresses = amap()
    assert not addresses.may_name_brokers(b"anything " + UPSTREAM_HOST.encode())
    addresses.learn(1, UPSTREAM_HOST, 9092)
    assert addresses.may_name_brokers(b"\x00\x20" + UPSTREAM_HOST.encode() + b"\x00")
    assert not addresses.may_name_brokers(b"upstream-broker")
    assert not addresses.may_name_brokers(ADVERTISE.encode())
    # Within a block of several frames only the given frame counts.
    host = UPSTREAM_HOST.encode()
    block = b"frame one " + host + b" frame two"
    assert addresses.may_name_brokers_in(block, 0, 10 + len(host))
    assert not addresses.may_name_brokers_in(block, 10 + len(host), len(block))
    assert not addresses.may_name_brokers_in(block, 0, 10 + len(host) - 1)


# ------------------------------------------------------------ ApiVersions


@pytest.mark.parametrize("version", versions(apis.API_VERSIONS))
def test_cap_api_versions(version):
    cls = load_response_schema(apis.API_VERSIONS, version)
    entry = item_cls(cls, "api_keys")
    produce_max = apis.DECODABLE[apis.PRODUCE][1]
    advertised = (
        entry(api_key=apis.PRODUCE, min_version=0, max_version=produce_max + 5),
        entry(api_key=apis.FETCH, min_version=4, max_version=5),
        entry(api_key=30000, min_version=0, max_version=99),  # unknown to kio: left alone
        entry(api_key=apis.END_TXN, min_version=apis.DECODABLE[apis.END_TXN][1] + 1, max_version=40),
    )
    response = wire(apis.API_VERSIONS, version, dataclasses.replace(sample(cls), api_keys=advertised))
    capped = cap_api_versions(response)
    decoded = wire(apis.API_VERSIONS, version, capped)
    assert [(k.api_key, k.min_version, k.max_version) for k in decoded.api_keys] == [
        (apis.PRODUCE, 0, produce_max),
        (apis.FETCH, 4, 5),
        (30000, 0, 99),
        # EndTxn only in versions kio cannot decode: not advertised at all
    ]
    assert decoded.error_code == response.error_code


def test_extra_caps_lower_the_advertised_max_but_never_raise_it():
    cls = load_response_schema(apis.API_VERSIONS, 3)
    entry = item_cls(cls, "api_keys")
    advertised = (
        entry(api_key=apis.FETCH, min_version=4, max_version=16),
        entry(api_key=apis.METADATA, min_version=0, max_version=9),
        entry(api_key=30000, min_version=0, max_version=99),
    )
    response = dataclasses.replace(sample(cls), api_keys=advertised)
    capped = cap_api_versions(response, {apis.FETCH: 15, apis.METADATA: 12, 30000: 7})
    assert [(k.api_key, k.max_version) for k in capped.api_keys] == [(apis.FETCH, 15), (apis.METADATA, 9), (30000, 7)]
    assert STREAMING_VERSION_CAPS == {apis.FETCH: 15}


def test_cap_api_versions_of_an_empty_or_error_response():
    cls = load_response_schema(apis.API_VERSIONS, 3)
    empty = dataclasses.replace(sample(cls), api_keys=())
    assert cap_api_versions(empty) is empty
