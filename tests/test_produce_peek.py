"""The cheap Produce peeks agree with kio's full decode, in every version."""

from __future__ import annotations

import datetime
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.index import load_request_schema
from kio.static.primitive import Records

from kproxy.protocol import apis
from kproxy.protocol.codec import DecodeError, decode_request, encode_request, parse_request_header
from kproxy.protocol.framing import FrameBuffer, frame
from kproxy.protocol.produce_peek import produce_acks, produce_transactional_id

LOW, HIGH = apis.DECODABLE[apis.PRODUCE]
VERSIONS = [pytest.param(v, id=f"v{v}") for v in range(LOW, HIGH + 1)]

transactional_ids = st.none() | st.text(max_size=40) | st.sampled_from(["txn-1", "\u00fcber-\u4e8b\u52a1", "\U0001f600"])
client_ids = st.none() | st.text(max_size=20)


def produce_request(version: int, transactional_id, acks: int, records: bytes = b"\x00" * 8):
    module = __import__(f"kio.schema.produce.v{version}.request", fromlist=["x"])
    topic_key = {"topic_id": __import__("uuid").UUID(int=7)} if version >= 13 else {"name": "topic"}
    return module.ProduceRequest(
        transactional_id=transactional_id,
        acks=acks,
        timeout=datetime.timedelta(milliseconds=1500),
        topic_data=(module.TopicProduceData(
            **topic_key,
            partition_data=(module.PartitionProduceData(index=0, records=Records(records)),),
        ),),
    )


@pytest.mark.parametrize("version", VERSIONS)
def test_peeks_agree_with_kio(version):
    @settings(max_examples=40, deadline=None)
    @given(transactional_ids, st.sampled_from([-1, 0, 1]), client_ids, st.binary(max_size=32))
    def check(transactional_id, acks, client_id, records):
        wire = encode_request(produce_request(version, transactional_id, acks, records), 11, client_id)
        payload = wire[4:]
        header = parse_request_header(payload)
        decoded = decode_request(header, payload)
        assert produce_transactional_id(payload, 0, header) == decoded.transactional_id == transactional_id
        assert produce_acks(payload, 0, header) == decoded.acks == acks

    check()


@pytest.mark.parametrize("version", VERSIONS)
def test_peeks_inside_a_block_of_frames(version):
    """The shell peeks frames in place, at their offset inside a received block."""
    first = encode_request(produce_request(version, None, 1), 1, "c")
    second = encode_request(produce_request(version, "tx-\u00e9", -1), 2, None)
    block, offsets = FrameBuffer().feed(first + second)
    found = []
    for offset in offsets:
        header = parse_request_header(block, offset + 4)
        found.append((produce_transactional_id(block, offset + 4, header), produce_acks(block, offset + 4, header)))
    assert found == [(None, 1), ("tx-\u00e9", -1)]


@pytest.mark.parametrize("version", [0, 1, 2])
def test_versions_kio_cannot_decode(version):
    """Produce v0-2 has no transactional id; acks is the first body field."""
    head = struct.pack(">hhih", apis.PRODUCE, version, 5, 3) + b"cli"
    body = struct.pack(">hi", 0, 1000) + b"\x00\x00\x00\x00"
    payload = head + body
    header = parse_request_header(payload)
    assert header.body_offset == -1
    assert produce_transactional_id(payload, 0, header) is None
    assert produce_acks(payload, 0, header) == 0
    null_client = struct.pack(">hhih", apis.PRODUCE, version, 5, -1) + struct.pack(">h", -1)
    assert produce_acks(frame(null_client), 4, parse_request_header(frame(null_client), 4)) == -1


@pytest.mark.parametrize("version", VERSIONS)
def test_truncated_body_raises_decode_error(version):
    payload = encode_request(produce_request(version, "a-long-transactional-id", 1), 1, "c")[4:]
    header = parse_request_header(payload)
    cut_in_id = payload[: header.body_offset + 5]
    with pytest.raises(DecodeError):
        produce_transactional_id(cut_in_id, 0, header)
    with pytest.raises(DecodeError):
        produce_acks(cut_in_id, 0, header)
    id_end = payload.index(b"a-long-transactional-id") + len("a-long-transactional-id")
    with pytest.raises(DecodeError):
        produce_acks(payload[: id_end + 1], 0, header)
    assert produce_acks(payload[: id_end + 2], 0, header) == 1
