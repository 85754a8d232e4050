"""Record batch compression codecs, as Kafka names and numbers them.

The codec of a magic-2 record batch lives in the low three bits of its
attributes. All codec work is delegated to cramjam; the only framing handled
here is the xerial snappy framing that the Java client writes (librdkafka and
the Java client both read plain snappy blocks, so that is what we write).
"""

from __future__ import annotations

import struct

import cramjam

CODECS: tuple[str, ...] = ("none", "gzip", "snappy", "lz4", "zstd")

# Attribute bits 0-2 hold the codec id; the id is the codec's index in CODECS.
CODEC_MASK = 0x07

_XERIAL_MAGIC = b"\x82SNAPPY\x00"
# magic, then int32 version and int32 minimum compatible version.
_XERIAL_HEADER_SIZE = len(_XERIAL_MAGIC) + 8
_CHUNK_LENGTH = struct.Struct(">i")


class CompressionError(ValueError):
    """Data could not be (de)compressed with the named codec, or the codec is unknown."""


def codec_id(codec: str) -> int:
    """Attribute bits for a codec name."""
    try:
        return CODECS.index(codec)
    except ValueError:
        raise CompressionError(f"unknown compression codec {codec!r}; expected one of {', '.join(CODECS)}") from None


def codec_name(attributes: int) -> str:
    """Codec name from record batch attributes (only the low three bits are read)."""
    ident = attributes & CODEC_MASK
    if ident >= len(CODECS):
        raise CompressionError(f"unknown compression codec id {ident} in batch attributes 0x{attributes:04x}")
    return CODECS[ident]


def with_codec(attributes: int, codec: str) -> int:
    """Attributes with the codec bits replaced."""
    return (attributes & ~CODEC_MASK) | codec_id(codec)


def compress(codec: str, data: bytes | memoryview) -> bytes:
    """Compress `data` the way a Kafka producer would for `codec`."""
    codec_id(codec)
    if codec == "none":
        return bytes(data)
    try:
        if codec == "gzip":
            return bytes(cramjam.gzip.compress(data))
        if codec == "snappy":
            return bytes(cramjam.snappy.compress_raw(data))
        if codec == "lz4":
            # Magic-2 batches use the standard LZ4 frame format.
            return bytes(cramjam.lz4.compress(data))
        return bytes(cramjam.zstd.compress(data))
    except cramjam.CompressionError as exc:
        raise CompressionError(f"{codec} compression failed: {exc}") from exc


def decompress(codec: str, data: bytes | memoryview) -> bytes:
    """Decompress a batch's records section written with `codec`."""
    codec_id(codec)
    if codec == "none":
        return bytes(data)
    try:
        if codec == "gzip":
            return bytes(cramjam.gzip.decompress(data))
        if codec == "snappy":
            return _snappy_decompress(data)
        if codec == "lz4":
            return bytes(cramjam.lz4.decompress(data))
        return bytes(cramjam.zstd.decompress(data))
    except cramjam.DecompressionError as exc:
        raise CompressionError(f"{codec} data does not decompress: {exc}") from exc


def _snappy_decompress(data: bytes | memoryview) -> bytes:
    view = memoryview(data)
    if view[: len(_XERIAL_MAGIC)] != _XERIAL_MAGIC:
        return bytes(cramjam.snappy.decompress_raw(view))
    # xerial framing: header, then chunks of int32 length + raw snappy block.
    out = bytearray()
    pos = _XERIAL_HEADER_SIZE
    while pos < len(view):
        if pos + 4 > len(view):
            raise CompressionError("xerial snappy data ends inside a chunk length")
        (length,) = _CHUNK_LENGTH.unpack_from(view, pos)
        pos += 4
        if length < 0 or pos + length > len(view):
            raise CompressionError(f"xerial snappy chunk of {length} bytes overruns the data")
        out += cramjam.snappy.decompress_raw(view[pos : pos + length])
        pos += length
    return bytes(out)


def xerial_snappy_compress(data: bytes | memoryview, chunk_size: int = 32 * 1024) -> bytes:
    """Snappy in the xerial framing the Java client writes (for tests and replays)."""
    out = bytearray(_XERIAL_MAGIC)
    out += struct.pack(">ii", 1, 1)
    view = memoryview(data)
    for start in range(0, len(view), chunk_size):
        block = bytes(cramjam.snappy.compress_raw(view[start : start + chunk_size]))
        out += _CHUNK_LENGTH.pack(len(block))
        out += block
    return bytes(out)
