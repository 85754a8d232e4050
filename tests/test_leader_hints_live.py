"""Leader hints in Produce responses (KIP-951) are rewritten by a running proxy.

A scripted broker answers the proxy's broker discovery with one broker, then
answers a client's Produce v10 twice: once with NOT_LEADER_OR_FOLLOWER and
node endpoints naming itself (the proxy must point them at its own listener
for that node, or the client would leave the proxy), once plainly (that
answer must pass byte for byte, undecoded).
"""

from __future__ import annotations

import dataclasses
import socket
import struct

from kio.schema.errors import ErrorCode
from kio.schema.produce.v10 import response as produce_v10
from kio.static.primitive import i32

from kproxy.protocol import apis
from kproxy.protocol.codec import decode_response, encode_response
from kproxy.protocol.framing import FrameBuffer
from tests.fixtures.scripted import ScriptedUpstream
from tests.test_cut_through import read_exactly
from tests.test_proxy_bad_input import raw_connect, request_frame
from tests.test_response_faults import produce_response

NODE_ID = 7
# Produce v10 body: null transactional id, acks=-1, timeout, no topics, no tagged fields.
PRODUCE_BODY = b"\x00" + b"\x00" + struct.pack(">hi", -1, 30000) + b"\x01" + b"\x00"


def metadata_v1_response(corr: int, port: int) -> bytes:
    from kio.schema.metadata.v1.response import MetadataResponse, MetadataResponseBroker

    value = MetadataResponse(
        brokers=(MetadataResponseBroker(node_id=i32(NODE_ID), host="127.0.0.1", port=i32(port), rack=None),),
        controller_id=i32(NODE_ID), topics=(),
    )
    return encode_response(value, corr)


def produce_v10_response(corr: int, port: int, hinted: bool) -> bytes:
    value = produce_response(10, {"orders": [(0, 6 if hinted else 0, -1 if hinted else 42)]})
    if hinted:
        value = dataclasses.replace(value, node_endpoints=(
            produce_v10.NodeEndpoint(node_id=i32(NODE_ID), host="127.0.0.1", port=i32(port), rack=None),
        ))
    return encode_response(value, corr)


class ScriptedBroker(ScriptedUpstream):
    def __init__(self) -> None:
        self.sent: list[bytes] = []  # the Produce responses, as the broker sent them
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        frames = FrameBuffer()
        produced = 0
        while data := conn.recv(65536):
            block, offsets = frames.feed(data)
            for start in offsets:
                api_key, _version, corr = struct.unpack_from(">hhi", block, start + 4)
                if api_key == apis.METADATA:
                    conn.sendall(metadata_v1_response(corr, self.port))
                elif api_key == apis.PRODUCE:
                    answer = produce_v10_response(corr, self.port, hinted=produced == 0)
                    produced += 1
                    self.sent.append(answer)
                    conn.sendall(answer)


def read_frame(s: socket.socket) -> bytes:
    size = read_exactly(s, 4)
    return size + read_exactly(s, struct.unpack(">i", size)[0])


def test_produce_leader_hints_point_at_the_proxy_and_plain_answers_pass_untouched(proxy_factory) -> None:
    with ScriptedBroker() as upstream:
        proxy = proxy_factory(upstream=upstream.address)
        s = raw_connect(proxy.bootstrap)
        s.sendall(request_frame(apis.PRODUCE, 10, 1, b"\x00" + PRODUCE_BODY))
        hinted = decode_response(apis.PRODUCE, 10, read_frame(s)[4:])
        s.sendall(request_frame(apis.PRODUCE, 10, 2, b"\x00" + PRODUCE_BODY))
        plain = read_frame(s)
        s.close()
    (endpoint,) = hinted.node_endpoints
    assert hinted.responses[0].partition_responses[0].error_code == ErrorCode.not_leader_or_follower
    assert int(endpoint.node_id) == NODE_ID
    assert int(endpoint.port) != upstream.port, "the client was told the broker's own address"
    with socket.create_connection(("127.0.0.1", int(endpoint.port)), timeout=5):
        pass  # the proxy listens where it told the client to go
    assert plain == upstream.sent[1]
