"""Record batches and codecs: round-trips, control markers, truncation and corruption."""

from __future__ import annotations

import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from kio.records.readers import read_batch as kio_read_batch

from kproxy.protocol.compression import (
    CODECS,
    CompressionError,
    codec_id,
    codec_name,
    compress,
    decompress,
    with_codec,
    xerial_snappy_compress,
)
from kproxy.protocol.records import (
    Record,
    RecordBatch,
    RecordDecodeError,
    batch_tuples,
    decode_batches,
    encode_batch,
    make_batch,
    make_control_batch,
    scan_batches,
)

payloads = st.one_of(st.none(), st.binary(max_size=64))
headers = st.lists(st.tuples(st.text(max_size=8), payloads), max_size=3).map(tuple)


@st.composite
def batches(draw: st.DrawFn, codecs: tuple[str, ...] = CODECS) -> RecordBatch:
    base_offset = draw(st.integers(0, 2**40))
    base_ts = draw(st.integers(1000, 2**42))
    n = draw(st.integers(1, 6))
    deltas = sorted(draw(st.lists(st.integers(0, 1000), min_size=n, max_size=n, unique=True)))
    records = [
        Record(
            offset=base_offset + d,
            timestamp=base_ts + draw(st.integers(-1000, 10**6)),
            key=draw(payloads),
            value=draw(payloads),
            headers=draw(headers),
        )
        for d in deltas
    ]
    return make_batch(
        records,
        compression=draw(st.sampled_from(codecs)),
        producer_id=draw(st.integers(-1, 2**62)),
        producer_epoch=draw(st.integers(-1, 2**15 - 1)),
        base_sequence=draw(st.integers(-1, 2**31 - 1)),
        partition_leader_epoch=draw(st.integers(-1, 2**31 - 1)),
        transactional=draw(st.booleans()),
    )


@pytest.mark.parametrize("codec", CODECS)
@given(data=st.binary(max_size=4096))
@settings(max_examples=40, deadline=None)
def test_every_codec_round_trips(codec: str, data: bytes) -> None:
    assert decompress(codec, compress(codec, data)) == data


@given(data=st.binary(max_size=100_000), chunk=st.integers(1, 40_000))
@settings(max_examples=30, deadline=None)
def test_xerial_framed_snappy_decodes_like_raw_snappy(data: bytes, chunk: int) -> None:
    framed = xerial_snappy_compress(data, chunk_size=chunk)
    assert framed.startswith(b"\x82SNAPPY\x00")
    assert decompress("snappy", framed) == data


def test_codec_attribute_bits_follow_kafka_numbering() -> None:
    assert [codec_id(c) for c in CODECS] == [0, 1, 2, 3, 4]
    assert codec_name(0x0013) == "lz4"  # transactional flag does not disturb the codec bits
    assert with_codec(0x0031, "zstd") == 0x0034
    with pytest.raises(CompressionError, match="brotli"):
        codec_id("brotli")
    with pytest.raises(CompressionError, match="id 7"):
        codec_name(7)


@pytest.mark.parametrize("codec", CODECS[1:])
def test_garbage_is_a_compression_error(codec: str) -> None:
    with pytest.raises(CompressionError, match=codec):
        decompress(codec, b"\xff" * 40)


@given(batch=batches())
@settings(max_examples=150, deadline=None)
def test_batches_round_trip_with_every_codec(batch: RecordBatch) -> None:
    raw = encode_batch(batch)
    assert decode_batches(raw) == [batch]
    assert decode_batches(raw)[0].compression == batch.compression


@given(batch=batches(), codec=st.sampled_from(CODECS))
@settings(max_examples=60, deadline=None)
def test_compression_override_changes_only_the_codec(batch: RecordBatch, codec: str) -> None:
    (decoded,) = decode_batches(encode_batch(batch, compression=codec))
    assert decoded.compression == codec
    assert decoded.records == batch.records
    assert decoded.is_transactional == batch.is_transactional


@given(batch=batches(codecs=("none",)))
@settings(max_examples=40, deadline=None)
def test_uncompressed_batches_are_read_by_kio_with_a_valid_crc(batch: RecordBatch) -> None:
    # kio checks the CRC32C and the batch length independently of our decoder.
    theirs, size = kio_read_batch(encode_batch(batch), 0)
    assert size == len(encode_batch(batch))
    assert [r.key for r in theirs.records] == [r.key for r in batch.records]
    assert [r.offset for r in theirs.records] == [r.offset for r in batch.records]


@pytest.mark.parametrize("kind", ["commit", "abort"])
def test_control_batches_are_recognised(kind: str) -> None:
    batch = make_control_batch(kind, offset=42, timestamp=1_700_000_000_000, producer_id=9, producer_epoch=3)
    (decoded,) = decode_batches(encode_batch(batch))
    assert decoded == batch
    assert decoded.is_control and decoded.is_transactional
    assert decoded.control_type == kind
    assert decoded.records[0].offset == 42
    assert decoded.producer_id == 9 and decoded.producer_epoch == 3


def test_data_batches_have_no_control_type() -> None:
    batch = make_batch([Record(0, 0, b"\x00\x00\x00\x01", b"v")], transactional=True)
    assert not batch.is_control
    assert batch.control_type is None


def test_sequences_follow_offsets_and_wrap_like_kafka() -> None:
    records = [Record(10, 0, None, b"a"), Record(11, 0, None, b"b")]
    assert [make_batch(records, base_sequence=2**31 - 1).sequence_of(r) for r in records] == [2**31 - 1, 0]
    assert make_batch(records).sequence_of(records[1]) == -1


@given(first=batches(), second=batches(), cut=st.integers(1, 10_000))
@settings(max_examples=80, deadline=None)
def test_a_truncated_trailing_batch_is_ignored(first: RecordBatch, second: RecordBatch, cut: int) -> None:
    tail = encode_batch(second)
    cut = min(cut, len(tail) - 1)
    assert decode_batches(encode_batch(first) + tail[:cut]) == [first]


def test_several_batches_decode_in_order() -> None:
    a = make_batch([Record(0, 1, b"a", b"1"), Record(1, 2, b"b", b"2")], compression="gzip")
    b = make_control_batch("commit", offset=2, timestamp=3, producer_id=1, producer_epoch=0)
    c = make_batch([Record(3, 4, b"c", b"3")], compression="zstd")
    assert decode_batches(encode_batch(a) + encode_batch(b) + encode_batch(c)) == [a, b, c]
    assert decode_batches(b"") == [] and decode_batches(None) == []


def test_a_writable_buffer_decodes_as_its_bytes() -> None:
    # A frame gathered by the proxy is a bytearray; kio's readers refuse a writable buffer.
    batch = make_batch([Record(5, 1, b"k", b"v", (("h", b"x"),))], producer_id=3, base_sequence=7)
    raw = encode_batch(batch)
    assert decode_batches(bytearray(raw)) == decode_batches(memoryview(bytearray(raw))) == [batch]
    ((header, records),) = batch_tuples(bytearray(raw))
    assert header[0] == 5 and header[9] == 3 and header[11] == 7
    assert records == [(0, 0, b"k", b"v", (("h", b"x"),))]


def _legacy_v1_message(offset: int, key: bytes, value: bytes) -> bytes:
    # crc, magic 1, attributes, timestamp, key, value (the CRC is not checked when skipping).
    body = struct.pack(">Ibbq", 0, 1, 0, 0) + struct.pack(">i", len(key)) + key + struct.pack(">i", len(value)) + value
    return struct.pack(">qi", offset, len(body)) + body


def test_legacy_message_sets_are_skipped() -> None:
    batch = make_batch([Record(5, 1, b"k", b"v")])
    data = _legacy_v1_message(3, b"old", b"msg") + encode_batch(batch) + _legacy_v1_message(6, b"x", b"y")
    assert decode_batches(data) == [batch]
    assert [s.magic for s in scan_batches(data)] == [1, 2, 1]


def test_crc_mismatch_is_a_decode_error() -> None:
    raw = bytearray(encode_batch(make_batch([Record(0, 0, b"k", b"value")])))
    raw[-3] ^= 0x01  # a byte inside the value "value"
    with pytest.raises(RecordDecodeError, match="CRC32C"):
        decode_batches(bytes(raw))
    # Without the CRC check the flipped byte is just a different value.
    assert decode_batches(bytes(raw), verify_crc=False)[0].records[0].value != b"value"


def test_impossible_length_is_a_decode_error() -> None:
    raw = bytearray(encode_batch(make_batch([Record(0, 0, b"k", b"v")])))
    raw[8:12] = struct.pack(">i", -5)
    with pytest.raises(RecordDecodeError, match="impossible length -5"):
        decode_batches(bytes(raw))


def test_unknown_magic_is_a_decode_error() -> None:
    raw = bytearray(encode_batch(make_batch([Record(0, 0, b"k", b"v")])))
    raw[16] = 7
    with pytest.raises(RecordDecodeError, match="unknown magic 7"):
        decode_batches(bytes(raw))


def test_undecompressable_records_are_a_decode_error() -> None:
    batch = make_batch([Record(0, 0, b"k", b"v" * 100)], compression="lz4")
    raw = bytearray(encode_batch(batch))
    raw[61:65] = b"\x00\x00\x00\x00"  # break the LZ4 frame magic
    with pytest.raises(RecordDecodeError, match="lz4"):
        decode_batches(bytes(raw), verify_crc=False)


def test_record_count_larger_than_the_records_is_a_decode_error() -> None:
    raw = bytearray(encode_batch(make_batch([Record(0, 0, b"k", b"v")])))
    raw[57:61] = struct.pack(">i", 3)
    with pytest.raises(RecordDecodeError, match="base offset 0"):
        decode_batches(bytes(raw), verify_crc=False)


@given(noise=st.binary(min_size=1, max_size=300))
@settings(max_examples=200, deadline=None)
def test_arbitrary_bytes_decode_or_raise_record_decode_error(noise: bytes) -> None:
    try:
        decode_batches(noise, verify_crc=False)
    except RecordDecodeError:
        pass


@given(batch=batches(), position=st.integers(0, 10_000), flip=st.integers(1, 255))
@settings(max_examples=150, deadline=None)
def test_corrupted_batches_never_raise_anything_but_record_decode_error(
    batch: RecordBatch, position: int, flip: int
) -> None:
    raw = bytearray(encode_batch(batch))
    raw[position % len(raw)] ^= flip
    for verify in (True, False):
        try:
            decode_batches(bytes(raw), verify_crc=verify)
        except RecordDecodeError:
            pass
