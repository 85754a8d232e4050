"""Kafka record batches (message format v2, "magic 2"): decode and encode.

What crosses the wire in Produce requests and Fetch responses is a run of
concatenated batches. Each batch is a fixed 61-byte header, then a count and
the records, which are compressed as one block when the attributes name a
codec. kio reads uncompressed batches only and rounds record timestamps to
whole seconds, so the batch layer lives here, on kio's varint readers and
writers, with cramjam for the codecs and crc32c for the checksum.

Brokers may end a Fetch response in the middle of a batch (the response is
cut at the fetch size); that truncated tail is not an error and is skipped,
as clients do. Old magic 0/1 message sets are skipped too.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Iterator, Sequence
from dataclasses import dataclass

from crc32c import crc32c
from kio.serial.errors import DecodeError
from kio.serial.readers import read_signed_varint, read_signed_varlong
from kio.serial.writers import write_signed_varint, write_signed_varlong

from kproxy.protocol.compression import CompressionError, codec_name, compress, decompress, with_codec


class RecordDecodeError(ValueError):
    """Record batch bytes that are not a valid batch (not merely truncated)."""


# base_offset, batch_length, partition_leader_epoch, magic, crc, attributes,
# last_offset_delta, base_timestamp, max_timestamp, producer_id,
# producer_epoch, base_sequence, record count.
_BATCH_HEADER = struct.Struct(">qiibIhiqqqhii")
_LENGTH = struct.Struct(">i")
_PRE_CRC = struct.Struct(">qiibI")
_POST_CRC_HEADER = struct.Struct(">hiqqqhii")
_CONTROL_KEY = struct.Struct(">hh")
_CONTROL_VALUE = struct.Struct(">hi")

BATCH_HEADER_SIZE = _BATCH_HEADER.size  # 61
# base_offset + batch_length: the part of a batch its length does not count.
LOG_OVERHEAD = 12
_MAGIC_OFFSET = 16
_CRC_OFFSET = 17
_ATTRIBUTES_OFFSET = 21  # also where the CRC-covered part starts
# Kafka's smallest legal entry of any magic (a v0 message); a smaller length is corruption.
_MIN_ENTRY_LENGTH = 14

TRANSACTIONAL_FLAG = 0x10
CONTROL_FLAG = 0x20
LOG_APPEND_TIME_FLAG = 0x08

NO_PRODUCER_ID = -1
NO_SEQUENCE = -1
NO_TIMESTAMP = -1

CONTROL_TYPES = {0: "abort", 1: "commit"}


@dataclass(frozen=True, slots=True)
class Record:
    """One record with its absolute offset and timestamp (ms) resolved from the batch."""

    offset: int
    timestamp: int
    key: bytes | None
    value: bytes | None
    headers: tuple[tuple[str, bytes | None], ...] = ()


@dataclass(frozen=True, slots=True)
class RecordBatch:
    """A magic-2 record batch; derived fields (length, CRC, count) are computed on encode."""

    base_offset: int
    partition_leader_epoch: int
    attributes: int
    last_offset_delta: int
    base_timestamp: int
    max_timestamp: int
    producer_id: int
    producer_epoch: int
    base_sequence: int
    records: tuple[Record, ...]

    @property
    def compression(self) -> str:
        return codec_name(self.attributes)

    @property
    def is_transactional(self) -> bool:
        return bool(self.attributes & TRANSACTIONAL_FLAG)

    @property
    def is_control(self) -> bool:
        return bool(self.attributes & CONTROL_FLAG)

    @property
    def timestamp_type(self) -> str:
        return "log_append" if self.attributes & LOG_APPEND_TIME_FLAG else "create"

    @property
    def control_type(self) -> str | None:
        """'commit' or 'abort' for a transaction marker batch, else None."""
        if not self.is_control or not self.records:
            return None
        return control_type_of(self.records[0].key)

    @property
    def next_offset(self) -> int:
        return self.base_offset + self.last_offset_delta + 1

    def sequence_of(self, record: Record) -> int:
        """The producer sequence of a record; sequences wrap to 0 after int32 max, as Kafka's do."""
        if self.base_sequence < 0:
            return NO_SEQUENCE
        return (self.base_sequence + record.offset - self.base_offset) % (1 << 31)


def control_type_of(key: bytes | None) -> str | None:
    """'commit' or 'abort' from a control record key (int16 version, int16 type), else None."""
    if key is None or len(key) < _CONTROL_KEY.size:
        return None
    _version, kind = _CONTROL_KEY.unpack_from(key)
    return CONTROL_TYPES.get(kind)


@dataclass(frozen=True, slots=True)
class BatchSpan:
    """Where one batch (or legacy message) sits in a records buffer, read from its header only.

    `complete` is False for a truncated trailing entry; `attributes` is None
    when the entry is not magic 2 or too short to show them.
    """

    start: int
    end: int
    magic: int | None
    attributes: int | None
    complete: bool

    @property
    def is_control(self) -> bool:
        return self.attributes is not None and bool(self.attributes & CONTROL_FLAG)


def scan_batches(data: bytes | memoryview) -> Iterator[BatchSpan]:
    """Spans of the entries in `data`, cheaply, without decoding records or checking CRCs.

    The last span may be incomplete (truncated); nothing follows it. A length
    that cannot belong to any message format raises RecordDecodeError.
    """
    view = memoryview(data)
    size = len(view)
    pos = 0
    while pos < size:
        if size - pos <= _MAGIC_OFFSET:
            yield BatchSpan(pos, size, None, None, complete=False)
            return
        (length,) = struct.unpack_from(">i", view, pos + 8)
        if length < _MIN_ENTRY_LENGTH:
            raise RecordDecodeError(f"record batch at byte {pos} has impossible length {length}")
        magic = view[pos + _MAGIC_OFFSET]
        end = pos + LOG_OVERHEAD + length
        attributes = None
        if magic == 2 and size - pos >= _ATTRIBUTES_OFFSET + 2:
            (attributes,) = struct.unpack_from(">h", view, pos + _ATTRIBUTES_OFFSET)
        if end > size:
            yield BatchSpan(pos, size, magic, attributes, complete=False)
            return
        yield BatchSpan(pos, end, magic, attributes, complete=True)
        pos = end


def decode_batches(data: bytes | memoryview | None, *, verify_crc: bool = True) -> list[RecordBatch]:
    """Every complete magic-2 batch in `data`, records decompressed.

    A truncated trailing batch and magic 0/1 message sets are skipped. Invalid
    bytes (bad length, unknown magic, CRC mismatch, undecodable records) raise
    RecordDecodeError.
    """
    return [
        RecordBatch(
            base_offset=(base := header[0]),
            partition_leader_epoch=header[2],
            attributes=header[5],
            last_offset_delta=header[6],
            base_timestamp=(base_timestamp := header[7]),
            max_timestamp=header[8],
            producer_id=header[9],
            producer_epoch=header[10],
            base_sequence=header[11],
            records=tuple(
                Record(base + offset_delta, base_timestamp + timestamp_delta, key, value, headers)
                for offset_delta, timestamp_delta, key, value, headers in records
            ),
        )
        for header, records in batch_tuples(data, verify_crc=verify_crc)
    ]


#: One record of batch_tuples: (offset_delta, timestamp_delta, key, value, headers).
RecordTuple = tuple[int, int, "bytes | None", "bytes | None", tuple[tuple[str, "bytes | None"], ...]]


def batch_tuples(
    data: bytes | memoryview | None, *, verify_crc: bool = True, seen: dict | None = None
) -> list[tuple[tuple[int, ...], list[RecordTuple]]]:
    """decode_batches without its objects: each complete magic-2 batch as (header, records).

    header: the batch header's 13 fields in wire order (base_offset,
    batch_length, partition_leader_epoch, magic, crc, attributes,
    last_offset_delta, base_timestamp, max_timestamp, producer_id,
    producer_epoch, base_sequence, count); records: RecordTuple each. The
    same rules and errors as decode_batches, which builds on it; for readers
    of many small batches (the analysis reads every traced one), where the
    objects cost more than reading the bytes.

    seen: the records of batches decoded before, by the batch's bytes from its
    CRC on (what the CRC covers and the CRC: equal bytes decode and verify
    alike, whatever base offset and leader epoch a broker gave the batch); a
    batch found there is not decoded again, one not found is added. The caller
    bounds it. The records lists are shared: never change one.
    """
    if not data:
        return []
    view = memoryview(data).toreadonly()  # kio's readers refuse a writable buffer
    size = len(view)
    batches = []
    pos = 0
    # The entries' walk of scan_batches, inline: a span object per batch cost as much as its header.
    while pos < size - _MAGIC_OFFSET:
        (length,) = _LENGTH.unpack_from(view, pos + 8)
        if length < _MIN_ENTRY_LENGTH:
            raise RecordDecodeError(f"record batch at byte {pos} has impossible length {length}")
        magic = view[pos + _MAGIC_OFFSET]
        end = pos + LOG_OVERHEAD + length
        if end > size:
            break  # a truncated tail, as brokers cut a response at the fetch size
        if magic == 2:
            if seen is None:
                batches.append(_batch_tuple(view[pos:end], pos, verify_crc))
            else:
                key = view[pos + _CRC_OFFSET : end].tobytes()
                records = seen.get(key)
                if records is None:
                    header, records = _batch_tuple(view[pos:end], pos, verify_crc)
                    seen[key] = records
                else:
                    header = _BATCH_HEADER.unpack_from(view, pos)
                batches.append((header, records))
        elif magic not in (0, 1):
            raise RecordDecodeError(f"record batch at byte {pos} has unknown magic {magic}")
        pos = end
    return batches


def _batch_tuple(view: memoryview, at: int, verify_crc: bool) -> tuple[tuple[int, ...], list[RecordTuple]]:
    if len(view) < BATCH_HEADER_SIZE:
        raise RecordDecodeError(f"record batch at byte {at} is {len(view)} bytes, shorter than its header")
    header = _BATCH_HEADER.unpack_from(view)
    base_offset, attributes, count = header[0], header[5], header[12]
    if verify_crc and crc32c(view[_ATTRIBUTES_OFFSET:]) != header[4]:
        raise RecordDecodeError(f"record batch at byte {at} (base offset {base_offset}) fails its CRC32C check")
    if count < 0:
        raise RecordDecodeError(f"record batch at byte {at} has a negative record count {count}")
    try:
        codec = codec_name(attributes)
        body = view[BATCH_HEADER_SIZE:]
        if codec != "none":
            body = memoryview(decompress(codec, body))
        records = _decode_records(body, count)
    except (CompressionError, DecodeError, ValueError, UnicodeDecodeError) as exc:
        if isinstance(exc, RecordDecodeError):
            raise RecordDecodeError(f"record batch at byte {at} (base offset {base_offset}): {exc}") from None
        raise RecordDecodeError(f"record batch at byte {at} (base offset {base_offset}) has bad records: {exc}") from exc
    return header, records


def _read_bytes(buf: memoryview, pos: int, what: str) -> tuple[bytes | None, int]:
    length, n = read_signed_varint(buf, pos)
    pos += n
    if length < 0:
        if length != -1:
            raise RecordDecodeError(f"{what} has negative length {length}")
        return None, pos
    end = pos + length
    if end > len(buf):
        raise RecordDecodeError(f"{what} of {length} bytes runs past the end of the records")
    return bytes(buf[pos:end]), end


def _decode_records(buf: memoryview, count: int) -> list[RecordTuple]:
    records = []
    pos = 0
    size = len(buf)
    varint, varlong, read_bytes = read_signed_varint, read_signed_varlong, _read_bytes
    for _ in range(count):
        length, n = varint(buf, pos)
        pos += n
        record_end = pos + length
        if length < 0 or record_end > size:
            raise RecordDecodeError(f"record length {length} does not fit the batch")
        pos += 1  # record attributes: unused by every message format so far
        timestamp_delta, n = varlong(buf, pos)
        pos += n
        offset_delta, n = varint(buf, pos)
        pos += n
        key, pos = read_bytes(buf, pos, "record key")
        value, pos = read_bytes(buf, pos, "record value")
        header_count, n = varint(buf, pos)
        pos += n
        if header_count:
            if header_count < 0:
                raise RecordDecodeError(f"record has a negative header count {header_count}")
            headers = []
            for _ in range(header_count):
                name, pos = read_bytes(buf, pos, "header key")
                if name is None:
                    raise RecordDecodeError("record header has a null key")
                header_value, pos = read_bytes(buf, pos, "header value")
                headers.append((name.decode("utf-8"), header_value))
            headers = tuple(headers)
        else:
            headers = ()
        if pos != record_end:
            raise RecordDecodeError(f"record fields end at {pos}, its length says {record_end}")
        records.append((offset_delta, timestamp_delta, key, value, headers))
    if pos != size:
        raise RecordDecodeError(f"{size - pos} stray bytes after the last of {count} records")
    return records

def _write_bytes(out: io.BytesIO, value: bytes | None) -> None:
    if value is None:
        write_signed_varint(out, -1)
        return
    write_signed_varint(out, len(value))
    out.write(value)


def _encode_records(batch: RecordBatch) -> bytes:
    out = io.BytesIO()
    body = io.BytesIO()
    for record in batch.records:
        body.seek(0)
        body.truncate()
        body.write(b"\x00")
        write_signed_varlong(body, record.timestamp - batch.base_timestamp)
        write_signed_varint(body, record.offset - batch.base_offset)
        _write_bytes(body, record.key)
        _write_bytes(body, record.value)
        write_signed_varint(body, len(record.headers))
        for name, header_value in record.headers:
            _write_bytes(body, name.encode("utf-8"))
            _write_bytes(body, header_value)
        write_signed_varint(out, body.tell())
        out.write(body.getbuffer())
    return out.getvalue()


def encode_batch(batch: RecordBatch, compression: str | None = None) -> bytes:
    """The wire bytes of `batch`, with a valid CRC32C.

    `compression` overrides the codec named by the batch's attributes; the
    attributes written carry the codec actually used.
    """
    attributes = batch.attributes if compression is None else with_codec(batch.attributes, compression)
    body = compress(codec_name(attributes), _encode_records(batch))
    post_crc = (
        _POST_CRC_HEADER.pack(
            attributes,
            batch.last_offset_delta,
            batch.base_timestamp,
            batch.max_timestamp,
            batch.producer_id,
            batch.producer_epoch,
            batch.base_sequence,
            len(batch.records),
        )
        + body
    )
    # The length counts everything after itself: leader epoch, magic and CRC (9 bytes) plus the rest.
    pre_crc = _PRE_CRC.pack(batch.base_offset, len(post_crc) + 9, batch.partition_leader_epoch, 2, crc32c(post_crc))
    return pre_crc + post_crc


def encode_batches(batches: Sequence[RecordBatch]) -> bytes:
    return b"".join(encode_batch(b) for b in batches)


def make_batch(
    records: Sequence[Record],
    *,
    compression: str = "none",
    producer_id: int = NO_PRODUCER_ID,
    producer_epoch: int = -1,
    base_sequence: int = NO_SEQUENCE,
    partition_leader_epoch: int = -1,
    transactional: bool = False,
    control: bool = False,
) -> RecordBatch:
    """A batch around `records` with the derived header fields filled in as a producer would."""
    if not records:
        raise ValueError("a new record batch needs at least one record")
    base_offset = records[0].offset
    attributes = with_codec(0, compression)
    if transactional:
        attributes |= TRANSACTIONAL_FLAG
    if control:
        attributes |= CONTROL_FLAG
    return RecordBatch(
        base_offset=base_offset,
        partition_leader_epoch=partition_leader_epoch,
        attributes=attributes,
        last_offset_delta=max(r.offset for r in records) - base_offset,
        base_timestamp=records[0].timestamp,
        max_timestamp=max(r.timestamp for r in records),
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        base_sequence=base_sequence,
        records=tuple(records),
    )


def control_record(kind: str, offset: int, timestamp: int, coordinator_epoch: int = 0) -> Record:
    """A transaction marker record: 'commit' or 'abort'."""
    types = {name: code for code, name in CONTROL_TYPES.items()}
    if kind not in types:
        raise ValueError(f"control record kind must be 'commit' or 'abort', not {kind!r}")
    return Record(
        offset=offset,
        timestamp=timestamp,
        key=_CONTROL_KEY.pack(0, types[kind]),
        value=_CONTROL_VALUE.pack(0, coordinator_epoch),
    )


def make_control_batch(
    kind: str,
    *,
    offset: int,
    timestamp: int,
    producer_id: int,
    producer_epoch: int,
    coordinator_epoch: int = 0,
    partition_leader_epoch: int = -1,
) -> RecordBatch:
    """The marker batch a transaction coordinator writes to end a transaction."""
    return make_batch(
        [control_record(kind, offset, timestamp, coordinator_epoch)],
        producer_id=producer_id,
        producer_epoch=producer_epoch,
        partition_leader_epoch=partition_leader_epoch,
        transactional=True,
        control=True,
    )
