"""Record batch headers and the partitions around them, read in place.

Tracing at level `records` must not decode records on the proxy: a Produce
request or Fetch response is walked structurally, each partition's records
region is located (start, end) in the frame without copying or decompressing
it, and each record batch's fixed 61-byte header is read with one
`struct.unpack_from`. The records themselves are copied raw into the trace's
side files and decoded by the analysis (kproxy.protocol.record_views).

Every walker here raises `ScanError` on a structure it cannot follow; the
caller then traces the partitions as unknown (the frame itself is forwarded
untouched either way).
"""

from __future__ import annotations

import struct
import uuid
from collections.abc import Mapping
from typing import Any

from kproxy.protocol.compression import CompressionError, codec_name

_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
BATCH_HEADER_SIZE = _BATCH_HEADER.size  # 61
_LOG_OVERHEAD = 12  # base_offset + batch_length, not counted by batch_length
_TRANSACTIONAL = 0x10
_CONTROL = 0x20
_MARKERS = {0: "abort", 1: "commit"}

PRODUCE_FLEXIBLE_FROM = 9
FETCH_FLEXIBLE_FROM = 12
FETCH_TOPIC_ID_FROM = 13
PRODUCE_TOPIC_ID_FROM = 13


class ScanError(ValueError):
    """A frame whose structure the scan cannot follow."""


class _Cursor:
    __slots__ = ("data", "pos")

    def __init__(self, data: bytes | memoryview, pos: int) -> None:
        self.data = data
        self.pos = pos

    def int_(self, size: int) -> int:
        end = self.pos + size
        if end > len(self.data):
            raise ScanError("past the end of the frame")
        value = int.from_bytes(self.data[self.pos : end], "big", signed=True)
        self.pos = end
        return value

    def uvarint(self) -> int:
        value = shift = 0
        data = self.data
        while True:
            if self.pos >= len(data):
                raise ScanError("varint past the end of the frame")
            b = data[self.pos]
            self.pos += 1
            value |= (b & 0x7F) << shift
            if not b & 0x80:
                return value
            shift += 7
            if shift > 63:
                raise ScanError("varint too long")

    def skip(self, size: int) -> None:
        self.pos += size
        if self.pos > len(self.data):
            raise ScanError("past the end of the frame")

    def tagged(self) -> None:
        for _ in range(self.uvarint()):
            self.uvarint()
            self.skip(self.uvarint())

    def length(self, flexible: bool, width: int) -> int:
        return self.uvarint() - 1 if flexible else self.int_(width)

    def text(self, flexible: bool) -> str | None:
        n = self.length(flexible, 2)
        if n < 0:
            return None
        start = self.pos
        self.skip(n)
        return bytes(self.data[start : self.pos]).decode("utf-8", "replace")

    def topic(self, by_id: bool, flexible: bool, topic_names: Mapping[uuid.UUID, str] | None) -> str:
        if by_id:
            start = self.pos
            self.skip(16)
            topic_id = uuid.UUID(bytes=bytes(self.data[start : self.pos]))
            return (topic_names or {}).get(topic_id) or str(topic_id)
        return self.text(flexible) or ""

    def records(self, flexible: bool) -> tuple[int, int] | None:
        n = self.length(flexible, 4)
        if n < 0:
            return None
        start = self.pos
        self.skip(n)
        return start, self.pos


def _zigzag(cur: _Cursor) -> int:
    v = cur.uvarint()
    return (v >> 1) ^ -(v & 1)


def _marker(data: bytes | memoryview, pos: int, end: int) -> str:
    """The control type of a control batch's first record (markers are never compressed)."""
    cur = _Cursor(data, pos)
    try:
        _zigzag(cur)  # record length
        cur.skip(1)  # attributes
        _zigzag(cur)  # timestamp delta
        _zigzag(cur)  # offset delta
        if _zigzag(cur) < 4 or cur.pos + 4 > end:
            return "unknown"
        cur.skip(2)  # version
        return _MARKERS.get(cur.int_(2), "unknown")
    except ScanError:
        return "unknown"


def _codec(attributes: int) -> str:
    try:
        return codec_name(attributes)
    except CompressionError:
        return "unknown"


def scan_batches(
    data: bytes | memoryview, start: int, end: int, crcs: list[int | None] | None = None
) -> list[dict[str, Any]]:
    """The header of every complete magic-2 batch in data[start:end] (a truncated tail is skipped, as clients do).

    With `crcs`, appends each complete batch's CRC-32C from its header (None
    for an older message set, which has none there), and returns with
    `crcs` ending in the offset (from start) where the complete batches end.
    """
    batches = []
    pos = start
    unpack = _BATCH_HEADER.unpack_from
    while pos + _LOG_OVERHEAD <= end:
        length = int.from_bytes(data[pos + 8 : pos + 12], "big", signed=True)
        batch_end = pos + _LOG_OVERHEAD + length
        if length < 14:
            raise ScanError(f"batch length {length} at {pos - start}")
        if batch_end > end:
            break  # cut at the fetch size
        if data[pos + 16] == 2 and pos + BATCH_HEADER_SIZE <= batch_end:
            (base_offset, _, _, _, crc, attributes, last_delta, _, _, pid, epoch, seq, count) = unpack(data, pos)
            if crcs is not None:
                crcs.append(crc)
            control = bool(attributes & _CONTROL)
            batches.append(
                {
                    "base_offset": base_offset,
                    "batch_length": length,
                    "record_count": count,
                    "last_offset_delta": last_delta,
                    "producer_id": pid,
                    "producer_epoch": epoch,
                    "base_sequence": seq,
                    "compression": _codec(attributes),
                    "transactional": bool(attributes & _TRANSACTIONAL),
                    "control": control,
                    "marker": _marker(data, pos + BATCH_HEADER_SIZE, batch_end) if control else None,
                }
            )
        elif crcs is not None:
            crcs.append(None)
        pos = batch_end
    if crcs is not None:
        crcs.append(pos - start)
    return batches


# The Produce walkers run once per Produce request and response in the trace
# writer at level `records` (hundreds per second at a modest rate),
# so they read fields with local indexing and struct rather than through
# _Cursor's method calls: a third of the writer's time per event went there.
_I16 = struct.Struct(">h").unpack_from
_I32 = struct.Struct(">i").unpack_from
_PARTITION_RESPONSE = struct.Struct(">ihq").unpack_from  # index, error code, base offset
_I64 = struct.Struct(">q").unpack_from


def _uvarint(data: bytes | memoryview, pos: int) -> tuple[int, int]:
    """(value, next position) of the unsigned varint at pos."""
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value, pos
        shift += 7
        if shift > 63:
            raise ScanError("varint too long")


def _skip_tagged(data: bytes | memoryview, pos: int) -> int:
    count, pos = _uvarint(data, pos)
    for _ in range(count):
        _, pos = _uvarint(data, pos)
        size, pos = _uvarint(data, pos)
        pos += size
    return pos


def _length(data: bytes | memoryview, pos: int, flexible: bool, unpack: Any) -> tuple[int, int]:
    """(length, next position) of an array, string or bytes length field (-1: null)."""
    if flexible:
        b = data[pos]
        if b < 0x80:
            return b - 1, pos + 1
        value, pos = _uvarint(data, pos)
        return value - 1, pos
    return unpack(data, pos)[0], pos + (4 if unpack is _I32 else 2)


def _topic_at(
    data: bytes | memoryview, pos: int, by_id: bool, flexible: bool, topic_names: Mapping[uuid.UUID, str] | None
) -> tuple[str, int]:
    if by_id:
        end = pos + 16
        if end > len(data):
            raise ScanError("past the end of the frame")
        topic_id = uuid.UUID(bytes=bytes(data[pos:end]))
        return (topic_names or {}).get(topic_id) or str(topic_id), end
    n, pos = _length(data, pos, flexible, _I16)
    if n < 0:
        return "", pos
    end = pos + n
    if end > len(data):
        raise ScanError("past the end of the frame")
    return bytes(data[pos:end]).decode("utf-8", "replace"), end


def produce_request_partitions(
    version: int, frame: bytes | memoryview, body: int, topic_names: Mapping[uuid.UUID, str] | None = None
) -> list[tuple[str, int, tuple[int, int] | None]]:
    """(topic, partition, records span) of a Produce request whose body starts at `body`."""
    try:
        return _produce_request_partitions(version, frame, body, topic_names)
    except (IndexError, struct.error):
        raise ScanError("past the end of the frame") from None


def _produce_request_partitions(
    version: int, data: bytes | memoryview, pos: int, topic_names: Mapping[uuid.UUID, str] | None
) -> list[tuple[str, int, tuple[int, int] | None]]:
    flexible = version >= PRODUCE_FLEXIBLE_FROM
    by_id = version >= PRODUCE_TOPIC_ID_FROM
    size = len(data)
    if version >= 3:
        n, pos = _length(data, pos, flexible, _I16)  # transactional id
        pos += max(n, 0)
    pos += 6  # acks, timeout
    out = []
    topics, pos = _length(data, pos, flexible, _I32)
    for _ in range(max(0, topics)):
        topic, pos = _topic_at(data, pos, by_id, flexible, topic_names)
        partitions, pos = _length(data, pos, flexible, _I32)
        for _ in range(max(0, partitions)):
            index = _I32(data, pos)[0]
            n, pos = _length(data, pos + 4, flexible, _I32)
            if n < 0:
                span = None
            else:
                span = (pos, pos + n)
                pos += n
                if pos > size:
                    raise ScanError("past the end of the frame")
            out.append((topic, index, span))
            if flexible:
                pos = _skip_tagged(data, pos)
        if flexible:
            pos = _skip_tagged(data, pos)
    if pos > size:
        raise ScanError("past the end of the frame")
    return out


def produce_response_partitions(
    version: int, frame: bytes | memoryview, topic_names: Mapping[uuid.UUID, str] | None = None
) -> list[dict[str, Any]]:
    """topic, partition, error_code, base_offset, log_start_offset of a whole Produce response frame (prefix included)."""
    try:
        return _produce_response_partitions(version, frame, topic_names, False)
    except (IndexError, struct.error):
        raise ScanError("past the end of the frame") from None


def produce_response_error_codes(version: int, frame: bytes | memoryview) -> list[int]:
    """The distinct non-zero error codes of a whole Produce response frame, in order of first appearance.

    The same walk as produce_response_partitions without building a partition:
    the trace at level `headers` wants only these, for every Produce response.
    """
    try:
        return _produce_response_partitions(version, frame, None, True)
    except (IndexError, struct.error):
        raise ScanError("past the end of the frame") from None


def _produce_response_partitions(
    version: int, data: bytes | memoryview, topic_names: Mapping[uuid.UUID, str] | None, codes_only: bool
) -> list[Any]:
    # The common cases read inline (a one-byte compact length, no tagged
    # fields): this runs for every Produce response a tracing proxy forwards.
    flexible = version >= PRODUCE_FLEXIBLE_FROM
    by_id = version >= PRODUCE_TOPIC_ID_FROM
    pos = 8
    if flexible:
        pos = pos + 1 if data[pos] == 0 else _skip_tagged(data, pos)
    out: list[Any] = []
    topics, pos = _length(data, pos, flexible, _I32)
    for _ in range(max(0, topics)):
        if codes_only:
            if by_id:
                pos += 16
            else:
                n, pos = _length(data, pos, flexible, _I16)
                pos += max(n, 0)
            topic = ""
        else:
            topic, pos = _topic_at(data, pos, by_id, flexible, topic_names)
        partitions, pos = _length(data, pos, flexible, _I32)
        for _ in range(max(0, partitions)):
            index, error_code, base_offset = _PARTITION_RESPONSE(data, pos)
            pos += 22  # index, error code, base offset, log append time
            log_start = None
            if version >= 5:
                if not codes_only:
                    log_start = _I64(data, pos)[0]
                pos += 8
            if version >= 8:
                errors, pos = _length(data, pos, flexible, _I32)
                for _ in range(max(0, errors)):
                    n, pos = _length(data, pos + 4, flexible, _I16)  # batch index, message
                    pos += max(n, 0)
                    if flexible:
                        pos = _skip_tagged(data, pos)
                n, pos = _length(data, pos, flexible, _I16)  # error message
                pos += max(n, 0)
            if flexible:
                pos = pos + 1 if data[pos] == 0 else _skip_tagged(data, pos)
            if codes_only:
                if error_code and error_code not in out:
                    out.append(error_code)
            else:
                out.append(
                    {"topic": topic, "partition": index, "error_code": error_code, "base_offset": base_offset,
                     "log_start_offset": log_start}
                )
        if flexible:
            pos = pos + 1 if data[pos] == 0 else _skip_tagged(data, pos)
    if pos > len(data):
        raise ScanError("past the end of the frame")
    return out


def fetch_response_partitions(
    version: int, frame: bytes | memoryview, topic_names: Mapping[uuid.UUID, str] | None = None
) -> tuple[list[int], list[tuple[dict[str, Any], tuple[int, int] | None]]]:
    """Error codes, and per partition its fields and records span, of a whole Fetch response frame (prefix included)."""
    flexible = version >= FETCH_FLEXIBLE_FROM
    codes: list[int] = []

    def note(code: int) -> None:
        if code and code not in codes:
            codes.append(code)

    cur = _Cursor(frame, 8)
    if flexible:
        cur.tagged()
    cur.skip(4)  # throttle
    if version >= 7:
        note(cur.int_(2))
        cur.skip(4)  # session id
    out = []
    for _ in range(max(0, cur.length(flexible, 4))):
        topic = cur.topic(version >= FETCH_TOPIC_ID_FROM, flexible, topic_names)
        for _ in range(max(0, cur.length(flexible, 4))):
            index = cur.int_(4)
            error_code = cur.int_(2)
            note(error_code)
            high_watermark = cur.int_(8)
            last_stable = cur.int_(8)
            log_start = cur.int_(8) if version >= 5 else None
            n = cur.length(flexible, 4)
            aborted = None
            if n >= 0:
                aborted = []
                for _ in range(n):
                    aborted.append({"producer_id": cur.int_(8), "first_offset": cur.int_(8)})
                    if flexible:
                        cur.tagged()
            if version >= 11:
                cur.skip(4)  # preferred read replica
            span = cur.records(flexible)
            if flexible:
                cur.tagged()
            out.append(
                (
                    {"topic": topic, "partition": index, "error_code": error_code, "high_watermark": high_watermark,
                     "last_stable_offset": last_stable, "log_start_offset": log_start,
                     "aborted_transactions": aborted},
                    span,
                )
            )
        if flexible:
            cur.tagged()
    return codes, out
