"""Size-prefixed framing: frames come out whole, in order, byte for byte."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kproxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES, FrameBuffer, FrameError, frame, split_frames

payloads = st.lists(st.binary(max_size=64), max_size=6)


def run(chunks: list[bytes], max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> tuple[list[bytes], bytes, FrameBuffer]:
    """Feed chunks; return (frame payloads, concatenated blocks, buffer)."""
    buffer = FrameBuffer(max_frame_bytes)
    frames: list[bytes] = []
    forwarded = bytearray()
    for chunk in chunks:
        block, offsets = buffer.feed(chunk)
        assert (not block) == (not offsets)  # a block is never a partial frame
        frames.extend(split_frames(block, offsets))
        forwarded += block
    return frames, bytes(forwarded), buffer


def cut(stream: bytes, points: list[int]) -> list[bytes]:
    edges = [0, *sorted(set(points)), len(stream)]
    return [stream[a:b] for a, b in zip(edges, edges[1:])]


@given(payloads)
@settings(max_examples=60)
def test_split_at_every_byte_boundary(messages):
    stream = b"".join(frame(m) for m in messages)
    for point in range(len(stream) + 1):
        frames, forwarded, buffer = run([stream[:point], stream[point:]])
        assert frames == messages
        assert forwarded == stream
        assert buffer.pending == 0
        buffer.check_eof()


@given(payloads, st.data())
@settings(max_examples=100)
def test_any_chunking_gives_the_same_frames_and_bytes(messages, data):
    stream = b"".join(frame(m) for m in messages)
    points = data.draw(st.lists(st.integers(0, len(stream)), max_size=12))
    frames, forwarded, buffer = run(cut(stream, points))
    assert frames == messages
    assert forwarded == stream
    buffer.check_eof()


@given(payloads)
@settings(max_examples=30)
def test_byte_by_byte(messages):
    stream = b"".join(frame(m) for m in messages)
    frames, forwarded, _ = run([stream[i : i + 1] for i in range(len(stream))])
    assert frames == messages and forwarded == stream


def test_a_frame_is_released_only_when_complete():
    buffer = FrameBuffer()
    data = frame(b"hello")
    assert buffer.feed(data[:3]) == (b"", [])
    assert buffer.pending == 3
    assert buffer.feed(data[3:-1]) == (b"", [])
    assert buffer.feed(data[-1:] + frame(b"x")[:2]) == (data, [0])
    assert buffer.pending == 2


def test_empty_frame_and_empty_chunk():
    frames, forwarded, _ = run([b"", frame(b""), b"", frame(b"a")])
    assert frames == [b"", b"a"]
    assert forwarded == frame(b"") + frame(b"a")


def test_frame_prefixes_the_length():
    assert frame(b"abc") == b"\x00\x00\x00\x03abc"


@pytest.mark.parametrize("split", [0, 2, 4])
def test_negative_length(split):
    stream = frame(b"ok") + (-1).to_bytes(4, "big", signed=True) + b"rest"
    buffer = FrameBuffer()
    with pytest.raises(FrameError) as info:
        buffer.feed(stream[: 6 + split])
        buffer.feed(stream[6 + split :])
    assert info.value.reason == "negative_length"


@pytest.mark.parametrize("chunks", [1, 3])
def test_oversized_length_with_a_custom_limit(chunks):
    stream = frame(b"x" * 16) + frame(b"y" * 17)
    buffer = FrameBuffer(max_frame_bytes=16)
    with pytest.raises(FrameError) as info:
        for piece in cut(stream, [len(stream) * i // chunks for i in range(1, chunks)]):
            buffer.feed(piece)
    assert info.value.reason == "frame_too_large"
    assert "16" in str(info.value)


def test_limit_is_inclusive():
    frames, _, _ = run([frame(b"z" * 16)], max_frame_bytes=16)
    assert frames == [b"z" * 16]


def test_default_limit_is_kafkas_100_mib():
    buffer = FrameBuffer()
    with pytest.raises(FrameError) as info:
        buffer.feed((100 * 1024 * 1024 + 1).to_bytes(4, "big"))
    assert info.value.reason == "frame_too_large"
    assert FrameBuffer().feed((100 * 1024 * 1024).to_bytes(4, "big")) == (b"", [])


@given(st.binary(min_size=1, max_size=40), st.data())
@settings(max_examples=50)
def test_truncated_at_eof(payload, data):
    stream = frame(payload)
    keep = data.draw(st.integers(1, len(stream) - 1))
    _, _, buffer = run([frame(b"whole"), stream[:keep]])
    with pytest.raises(FrameError) as info:
        buffer.check_eof()
    assert info.value.reason == "truncated_frame"


def test_a_large_frame_in_small_chunks_is_assembled_once():
    payload = bytes(range(256)) * 64
    stream = frame(payload)
    frames, forwarded, _ = run([stream[i : i + 7] for i in range(0, len(stream), 7)])
    assert frames == [payload] and forwarded == stream
