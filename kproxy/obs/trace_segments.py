"""The fixed-layout trace format: columnar segments, packed with the standard library.

Why not JSON Lines: a JSON line per event made the writer thread build a
~30-key dict and serialise ~600 bytes for every frame (docs/performance.md,
"Tracing cost"). Here the proxy hands over one row per event (a list in
`trace_schema.EVENT` order) and the writer packs each flush batch column by
column: numbers as machine arrays, strings as a per-segment dictionary plus
int32 codes, nested fields (partitions, in-flight lists, error codes) as one
JSON blob per cell. That is C-level work per column rather than Python work
per field, and ~100 bytes per header-level event.

Why not Arrow IPC or Parquet: pyarrow is a ~100 MB dependency of the
analysis (the `analysis` extra), not of the proxy, and a Parquet file is
unreadable until its footer is written. These segments need only `array`,
`struct` and `zlib`, and every complete segment stays readable after a kill.
The analysis converts them (`segment_to_arrow`) on its executors.

File layout (little-endian):

    magic  b"KPTRACE1"
    u32    header length, then a JSON header:
           {"format": "kproxy-trace-segments", "schema_version": N,
            "columns": [[name, kind], ...]}
    then segments, each written with one write() per flush batch:
    magic  b"SEG1"
    u32    payload length
    u32    CRC-32 of the payload
    payload: u32 row count, then one block per column in header order:
      u8 tag: 0 every cell null (no data); 1 no null; 2 with nulls
      kinds long/int/double/boolean ("q"/"i"/"d"/"b" arrays):
          tag 2 first has one byte per row (1: present), then the values
          (0 where null)
      kind string: u32 dictionary size, u32 byte length of each entry,
          the UTF-8 entries, then one int32 code per row (-1: null)
      kind json: int32 byte length per row (-1: null), then the JSON texts;
          or (tag 3, version 5) dictionary-encoded like a string column:
          u32 dictionary size, u32 byte length of each entry, the entries,
          then one int32 code per row (-1: null). The writer uses it when a
          text repeats within the segment: an idle consumer's Fetch
          responses carry the same partitions text hundreds of times.

Kinds come from `trace_schema.EVENT`: a field of an array or struct type is
stored as its JSON text (the same text a JSONL trace holds for it).

A reader reads segments in order and stops at a segment that runs past the
end of the file (a kill between segments or mid-write): everything up to the
last complete segment is readable. A complete segment whose checksum does not
match is corruption, reported with the file and byte offset. A file whose
header names a schema version this kproxy does not read (a newer writer's)
is refused, naming the file and the version, by every reader here.
"""

from __future__ import annotations

import logging
import struct
import zlib
from array import array
from collections.abc import Generator, Iterator, Sequence
from pathlib import Path
from typing import Any

import orjson

from kproxy.obs.trace_schema import EVENT, SCHEMA_VERSION, unreadable_version
from kproxy.protocol.record_views import payload_text

log = logging.getLogger(__name__)

FORMAT = "kproxy-trace-segments"
SUFFIX = ".events"
FILE_MAGIC = b"KPTRACE1"
SEGMENT_MAGIC = b"SEG1"
_U32 = struct.Struct("<I")
_SEGMENT_HEAD = struct.Struct("<4sII")
_TYPECODE = {"long": "q", "int": "i", "double": "d", "boolean": "b"}
# array typecode sizes are platform-defined; these must be the on-disk widths.
assert array("q").itemsize == 8 and array("i").itemsize == 4 and array("d").itemsize == 8 and array("I").itemsize == 4


class SegmentError(ValueError):
    """A trace segment file is corrupt (beyond a torn last segment)."""


def column_kind(field_type: Any) -> str:
    return field_type if isinstance(field_type, str) else "json"


COLUMNS: tuple[tuple[str, str], ...] = tuple((f.name, column_kind(f.type)) for f in EVENT)


def file_header(schema_version: int = SCHEMA_VERSION, columns: Sequence[tuple[str, str]] = COLUMNS) -> bytes:
    header = orjson.dumps({"format": FORMAT, "schema_version": schema_version, "columns": [list(c) for c in columns]})
    return FILE_MAGIC + _U32.pack(len(header)) + header


def json_default(value: Any) -> Any:
    """orjson's fallback for trace values: keys and values are text or
    "b64:..." by schema (docs/traces.md); raw bytes from a caller that did
    not encode them are encoded here rather than losing the event."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        return payload_text(bytes(value))
    raise TypeError(f"not serialisable in a trace: {type(value).__name__}")


def _text(value: Any) -> bytes:
    if isinstance(value, str):
        return value.encode("utf-8", "surrogatepass")
    if isinstance(value, (bytes, bytearray, memoryview)):
        return json_default(value).encode("utf-8")
    raise TypeError(f"a string field holds a {type(value).__name__}")


def _json_cell(value: Any, dumps: Any = orjson.dumps) -> bytes | None:
    if value is None:
        return None
    if not value and type(value) is list:
        return b"[]"  # error_codes of almost every response
    try:
        return dumps(value)
    except TypeError:
        return dumps(value, default=json_default)


def _dictionary_block(out: list[bytes], tag: bytes, entries: dict, texts: list[bytes], cells: Sequence) -> None:
    """A dictionary-encoded block: `tag`, the entries' count, lengths and `texts`,
    then one int32 code per cell (its entry's index; -1 for None)."""
    out.append(tag)
    out.append(_U32.pack(len(texts)))
    out.append(array("I", map(len, texts)).tobytes())
    out.append(b"".join(texts))
    if len(entries) == 1 and None not in cells:
        out.append(bytes(4 * len(cells)))  # every code 0: one text (a proxy id, an outcome) in every row
        return
    index = {value: i for i, value in enumerate(entries)}
    index[None] = -1
    out.append(array("i", map(index.__getitem__, cells)).tobytes())


# Cells of a JSON column serialised between two steps of encode_segment_steps.
_JSON_CELLS_PER_STEP = 8
# A batch this small (a lightly loaded proxy's, 100 ms of it) is encoded in
# one step, about a step's work: stepping it paid a generator resumption and
# a look at the loop per column, more than the columns themselves.
_ROWS_ENCODED_AT_ONCE = 32


def _encode_column(kind: str, cells: tuple, out: list[bytes]) -> None:
    """Append one string or number column's block to `out` (JSON columns: _encode_json_column)."""
    # Each branch does C-level passes over the column (array(), map(),
    # dict.fromkeys()); Python-level work per cell only where it must.
    nulls = cells.count(None)  # by identity, in C
    if nulls == len(cells):
        out.append(b"\x00")
        return
    if kind == "string":
        entries = dict.fromkeys(cells)
        entries.pop(None, None)
        _dictionary_block(out, b"\x01", entries, [_text(value) for value in entries], cells)
        return
    code = _TYPECODE[kind]
    if not nulls:
        out.append(b"\x01")
        first = cells[0]
        if cells.count(first) == len(cells):
            # One value in every row (the schema version, an API's key and
            # version, a broker id): repeated in C, not converted per cell.
            out.append((array(code, (first,)) * len(cells)).tobytes())
        else:
            out.append(array(code, cells).tobytes())
        return
    # array() itself refuses a cell that is not a number of the column's kind (TypeError).
    out.append(b"\x02")
    out.append(bytes([c is not None for c in cells]))
    out.append(array(code, [0 if c is None else c for c in cells]).tobytes())


def _encode_json_column(cells: tuple, out: list[bytes]) -> Iterator[None]:
    """Append one JSON column's block to `out`; yields between pieces of its serialising."""
    nulls = cells.count(None)
    if nulls == len(cells):
        out.append(b"\x00")
        return
    if nulls + cells.count([]) == len(cells):
        # Only empty lists besides nulls (the error codes of a batch of
        # answers without errors): one dictionary entry, no text per cell.
        _dictionary_block(out, b"\x03", {b"[]": None}, [b"[]"], [None if c is None else b"[]" for c in cells])
        return
    # Serialising the cells is the one long pass of a segment (the
    # partitions of a `records` event): done in pieces.
    blobs: list[bytes | None] = []
    entries: dict[bytes | None, None] = {}
    for start in range(0, len(cells), _JSON_CELLS_PER_STEP):
        chunk = list(map(_json_cell, cells[start : start + _JSON_CELLS_PER_STEP]))
        blobs.extend(chunk)
        entries.update(dict.fromkeys(chunk))  # hashing the texts is as long a pass as making them
        yield
    entries.pop(None, None)
    if len(entries) < len(blobs) - blobs.count(None):
        # Repeated texts (an idle consumer's Fetch responses within one
        # flush batch: the same partitions, offsets and aborted lists)
        # are stored once, as strings are.
        _dictionary_block(out, b"\x03", entries, list(entries), blobs)
        return
    out.append(b"\x01")
    out.append(array("i", [-1 if b is None else len(b) for b in blobs]).tobytes())
    out.append(b"".join([b for b in blobs if b is not None]))


def encode_segment_steps(
    rows: Sequence[Sequence[Any]], columns: Sequence[tuple[str, str]] = COLUMNS
) -> Generator[None, None, bytes]:
    """encode_segment in small steps: yields between columns and between pieces of a long one.

    The trace writer encodes on the proxy's event loop, in its idle time, and
    a request that arrives meanwhile waits at most for the current step (tens
    of microseconds), not for a whole segment (about 0.5 ms for 100 `records`
    events). Returns the segment; raises as encode_segment does.
    """
    out = [_U32.pack(len(rows))]
    if rows:
        stepped = len(rows) > _ROWS_ENCODED_AT_ONCE
        for (_, kind), cells in zip(columns, zip(*rows), strict=True):
            if kind != "json":
                _encode_column(kind, cells, out)
            elif stepped:
                yield from _encode_json_column(cells, out)
            else:
                run_steps(_encode_json_column(cells, out))
            if stepped:
                yield
    payload = b"".join(out)
    return _SEGMENT_HEAD.pack(SEGMENT_MAGIC, len(payload), zlib.crc32(payload)) + payload


def encode_segment(rows: Sequence[Sequence[Any]], columns: Sequence[tuple[str, str]] = COLUMNS) -> bytes:
    """One segment (magic, length, checksum, payload) holding `rows`, each a sequence in `columns` order.

    Raises TypeError, ValueError or OverflowError when a cell does not fit its column.
    """
    return run_steps(encode_segment_steps(rows, columns))


def run_steps(steps: Generator[None, None, Any]) -> Any:
    """Run a step generator to the end at once; its return value."""
    while True:
        try:
            next(steps)
        except StopIteration as done:
            return done.value


def encode_rows_checked_steps(
    rows: list[list[Any]], columns: Sequence[tuple[str, str]] = COLUMNS
) -> Generator[None, None, tuple[bytes, int]]:
    """Encode a batch in steps (see encode_segment_steps); a row that does not fit is logged and left out.

    Returns (segment, rows kept).
    """
    try:
        return (yield from encode_segment_steps(rows, columns)), len(rows)
    except (TypeError, ValueError, OverflowError):
        pass
    good = []
    for row in rows:
        try:
            encode_segment([row], columns)
        except (TypeError, ValueError, OverflowError) as exc:
            log.error("trace event dropped, does not fit the schema: %s", exc)
        else:
            good.append(row)
        yield
    return ((yield from encode_segment_steps(good, columns)), len(good)) if good else (b"", 0)


# ---- reading ----------------------------------------------------------------


class SegmentFile:
    """A segment trace file opened for reading: its header and the (offset, length) of each complete segment."""

    def __init__(self, path: Path | str, data: bytes | None = None) -> None:
        self.path = Path(path)
        self.data = self.path.read_bytes() if data is None else data
        self.torn = 0  # bytes after the last complete segment (a kill mid-write)
        data = self.data
        if len(data) < len(FILE_MAGIC) + 4:
            # A kill right after the file was created: nothing was written yet.
            if FILE_MAGIC.startswith(data[: len(FILE_MAGIC)]):
                self.schema_version, self.columns, self.segments, self.torn = SCHEMA_VERSION, COLUMNS, [], len(data)
                return
            raise SegmentError(f"{self.path}:0: not a kproxy trace segment file")
        if data[: len(FILE_MAGIC)] != FILE_MAGIC:
            raise SegmentError(f"{self.path}:0: not a kproxy trace segment file (bad magic)")
        (size,) = _U32.unpack_from(data, len(FILE_MAGIC))
        start = len(FILE_MAGIC) + 4
        if start + size > len(data):
            self.schema_version, self.columns, self.segments, self.torn = SCHEMA_VERSION, COLUMNS, [], len(data)
            return
        self.schema_version, self.columns = _parse_header(data[start : start + size], self.path, start)
        self.segments: list[tuple[int, int]] = []
        pos = start + size
        while pos < len(data):
            if pos + _SEGMENT_HEAD.size > len(data):
                break
            magic, length, crc = _SEGMENT_HEAD.unpack_from(data, pos)
            if magic != SEGMENT_MAGIC:
                raise SegmentError(f"{self.path}:{pos}: expected a segment, found {magic!r}")
            body = pos + _SEGMENT_HEAD.size
            if body + length > len(data):
                break
            if zlib.crc32(memoryview(data)[body : body + length]) != crc:
                raise SegmentError(f"{self.path}:{pos}: segment checksum mismatch")
            self.segments.append((body, length))
            pos = body + length
        self.torn = len(data) - pos

    def columns_of(self, index: int) -> tuple[int, list[list[Any]]]:
        """Row count and the decoded cells of each column of one segment (JSON cells still as text)."""
        offset, length = self.segments[index]
        return decode_payload(memoryview(self.data)[offset : offset + length], self.columns, f"{self.path}:{offset}")

    def rows(self) -> Iterator[dict[str, Any]]:
        """Every event, as dicts keyed by field name (nested fields parsed).

        Every field of the schema is there: one the file's writer did not
        have yet (a nullable field added since, without a version bump) is null.
        """
        names = [name for name, _ in self.columns]
        kinds = [kind for _, kind in self.columns]
        missing = [name for name, _ in COLUMNS if name not in names]
        names += missing
        loads = orjson.loads
        for i in range(len(self.segments)):
            n, cols = self.columns_of(i)
            for c, kind in enumerate(kinds):
                if kind == "json":
                    cols[c] = [None if v is None else loads(v) for v in cols[c]]
                elif kind == "boolean":
                    cols[c] = [None if v is None else bool(v) for v in cols[c]]
            cols.extend([None] * n for _ in missing)
            for row in zip(*cols):
                yield dict(zip(names, row))


def _parse_header(text: bytes, path: Path, start: int) -> tuple[int, tuple[tuple[str, str], ...]]:
    """A file header's schema version and columns; a SegmentError if it is malformed or of a version
    this kproxy does not read. `start`: the header's offset in the file, for the message."""
    try:
        header = orjson.loads(text)
        if header.get("format") != FORMAT:
            raise ValueError(f"format is {header.get('format')!r}")
        version = header["schema_version"]
        columns = tuple((str(name), str(kind)) for name, kind in header["columns"])
    except (orjson.JSONDecodeError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise SegmentError(f"{path}:{start}: bad trace segment header: {exc}") from exc
    problem = unreadable_version(version)
    if problem is not None:
        raise SegmentError(f"{path}: {problem}")
    for name, kind in columns:
        if kind not in ("string", "json", *_TYPECODE):
            raise SegmentError(f"{path}:{start}: column {name!r} has unknown kind {kind!r}")
    return version, columns


def _dictionary_cells(payload: memoryview, pos: int, n: int, text: Any) -> tuple[list[Any], int]:
    """A dictionary-encoded block (string columns, and json columns with tag 3): the
    entries, each made by `text` from its bytes, looked up by n int32 codes (-1: null).
    Returns the cells and the position after the block."""
    (size,) = _U32.unpack_from(payload, pos)
    pos += 4
    lengths = array("I")
    lengths.frombytes(payload[pos : pos + 4 * size])
    pos += 4 * size
    entries = []
    for length in lengths:
        entries.append(text(payload[pos : pos + length]))
        pos += length
    codes = array("i")
    codes.frombytes(payload[pos : pos + 4 * n])
    pos += 4 * n
    entries.append(None)  # code -1
    return [entries[c] for c in codes], pos


def decode_payload(payload: memoryview, columns: Sequence[tuple[str, str]], where: str = "") -> tuple[int, list[list[Any]]]:
    """Decode a segment payload into per-column lists (JSON cells as bytes, booleans as 0/1)."""
    try:
        (n,) = _U32.unpack_from(payload, 0)
        pos = 4
        out: list[list[Any]] = []
        for _name, kind in columns:
            tag = payload[pos]
            pos += 1
            if tag == 0:
                out.append([None] * n)
                continue
            if tag not in (1, 2) and not (tag == 3 and kind == "json"):
                raise SegmentError(f"{where}: column {_name!r}: unknown block tag {tag}")
            if kind == "string":
                cells, pos = _dictionary_cells(payload, pos, n, lambda b: str(b, "utf-8", "surrogatepass"))
                out.append(cells)
            elif tag == 3:  # json, dictionary-encoded
                cells, pos = _dictionary_cells(payload, pos, n, bytes)
                out.append(cells)
            elif kind == "json":
                lengths = array("i")
                lengths.frombytes(payload[pos : pos + 4 * n])
                pos += 4 * n
                cells: list[Any] = []
                for length in lengths:
                    if length < 0:
                        cells.append(None)
                    else:
                        cells.append(bytes(payload[pos : pos + length]))
                        pos += length
                out.append(cells)
            else:
                code = _TYPECODE[kind]
                valid = None
                if tag == 2:
                    valid = payload[pos : pos + n]
                    pos += n
                values = array(code)
                width = values.itemsize
                values.frombytes(payload[pos : pos + width * n])
                pos += width * n
                cells = values.tolist()
                if valid is not None:
                    cells = [v if ok else None for v, ok in zip(cells, valid)]
                out.append(cells)
        if pos != len(payload):
            raise SegmentError(f"{where}: {len(payload) - pos} bytes left over after the last column")
        return n, out
    except (struct.error, ValueError, IndexError) as exc:
        if isinstance(exc, SegmentError):
            raise
        raise SegmentError(f"{where}: malformed segment: {exc}") from exc


def iter_segment_events(path: Path | str) -> Iterator[dict[str, Any]]:
    """Events of one segment file, up to its last complete segment (a torn tail is skipped with a warning)."""
    seg = SegmentFile(path)
    if seg.torn:
        log.warning("%s: skipping %d bytes after the last complete segment (killed mid-write?)", seg.path, seg.torn)
    yield from seg.rows()


def segment_to_arrow(seg: SegmentFile, index: int):  # noqa: ANN201 - pyarrow imported lazily (analysis extra)
    """One segment as a flat pyarrow RecordBatch: nested fields as their JSON text (parse with the schema's types)."""
    import pyarrow as pa

    n, cols = seg.columns_of(index)
    arrow_type = {"long": pa.int64(), "int": pa.int32(), "double": pa.float64(), "boolean": pa.bool_(),
                  "string": pa.string(), "json": pa.string()}
    arrays = []
    for (_name, kind), cells in zip(seg.columns, cols):
        if kind == "json":
            cells = [None if c is None else c.decode("utf-8") for c in cells]
        elif kind == "boolean":
            cells = [None if c is None else bool(c) for c in cells]
        arrays.append(pa.array(cells, type=arrow_type[kind]))
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in seg.columns])


def segment_index(path: Path | str) -> list[tuple[int, int]]:
    """(offset, length) of each complete segment's payload, walking the segment heads only.

    For the analysis's driver: it reads the file header and a few bytes per
    segment, and the executors read, check and decode the payloads
    (`read_segment_cells`). A file cut short (killed proxy) ends at its last
    complete segment; a file of a schema version this kproxy does not read
    is refused here, before any segment is read.
    """
    path = Path(path)
    with open(path, "rb") as f:
        size = f.seek(0, 2)
        f.seek(0)
        head = f.read(len(FILE_MAGIC) + 4)
        if len(head) < len(FILE_MAGIC) + 4:
            if FILE_MAGIC.startswith(head[: len(FILE_MAGIC)]):
                return []
            raise SegmentError(f"{path}:0: not a kproxy trace segment file")
        if head[: len(FILE_MAGIC)] != FILE_MAGIC:
            raise SegmentError(f"{path}:0: not a kproxy trace segment file (bad magic)")
        (header_size,) = _U32.unpack_from(head, len(FILE_MAGIC))
        pos = len(head) + header_size
        if pos > size:
            return []  # killed while writing the header: nothing was written after it
        _parse_header(f.read(header_size), path, len(head))
        out = []
        while pos + _SEGMENT_HEAD.size <= size:
            f.seek(pos)
            magic, length, _crc = _SEGMENT_HEAD.unpack(f.read(_SEGMENT_HEAD.size))
            if magic != SEGMENT_MAGIC:
                raise SegmentError(f"{path}:{pos}: expected a segment, found {magic!r}")
            body = pos + _SEGMENT_HEAD.size
            if body + length > size:
                break
            out.append((body, length))
            pos = body + length
        return out


def read_segment_cells(path: Path | str, offset: int, length: int) -> tuple[int, dict[str, list[Any]]]:
    """One segment of a file: its row count and each column's cells by name (JSON cells as UTF-8 bytes).

    Checks the segment's checksum: damage is a SegmentError naming the file
    and the segment's offset; so is a file of a schema version this kproxy
    does not read.
    """
    path = Path(path)
    start = offset - _SEGMENT_HEAD.size
    with open(path, "rb") as f:
        f.seek(start)
        data = f.read(_SEGMENT_HEAD.size + length)
        f.seek(0)
        head = f.read(len(FILE_MAGIC) + 4)
        (header_size,) = _U32.unpack_from(head, len(FILE_MAGIC))
        _version, file_columns = _parse_header(f.read(header_size), path, len(head))
    magic, stored_length, crc = _SEGMENT_HEAD.unpack_from(data, 0)
    payload = memoryview(data)[_SEGMENT_HEAD.size :]
    if magic != SEGMENT_MAGIC or stored_length != length or len(payload) != length:
        raise SegmentError(f"{path}:{start}: not the segment the index named")
    if zlib.crc32(payload) != crc:
        raise SegmentError(f"{path}:{start}: segment checksum mismatch")
    n, cols = decode_payload(payload, file_columns, f"{path}:{start}")
    return n, dict(zip((name for name, _ in file_columns), cols))


def cells_to_arrow(n: int, by_name: dict[str, list[Any]], columns: Sequence[tuple[str, str]] = COLUMNS):  # noqa: ANN201
    """A flat pyarrow RecordBatch of `n` rows with exactly `columns` (by name; missing ones null); JSON stays text."""
    import pyarrow as pa

    arrow_type = {"long": pa.int64(), "int": pa.int32(), "double": pa.float64(), "boolean": pa.bool_(),
                  "string": pa.string(), "json": pa.string()}
    arrays = []
    for name, kind in columns:
        cells = by_name.get(name)
        if cells is None:
            arrays.append(pa.nulls(n, type=arrow_type[kind]))
            continue
        if kind == "json":
            # Built from the bytes and checked as UTF-8 in C: no str per cell.
            arrays.append(pa.array(cells, type=pa.binary()).cast(pa.string()))
            continue
        if kind == "boolean":
            cells = [None if c is None else bool(c) for c in cells]
        arrays.append(pa.array(cells, type=arrow_type[kind]))
    return pa.RecordBatch.from_arrays(arrays, names=[name for name, _ in columns])
