"""Reading traces back: the files of a trace directory, in order, and their events.

Files are ordered per proxy id by their sequence number (the order the writer
opened them in; a restarted proxy with the same id continues the sequence),
then by start time; events inside a file are in write order. Events of
different proxies are not interleaved: order them by `wall_time` if needed.

Version-3 events point at their raw record batches in a side file
(`records_file`, `records_offset`, `records_length`); the readers here decode
them into each partition's `records`, as version-2 events carried them. A
reference past the end of its side file is corruption and raises (the writer
hands side bytes to the kernel before the line that references them).

Segment files (`.events`, the default format; kproxy.obs.trace_segments)
are read up to their last complete segment: a kill mid-write leaves a torn
tail, skipped with a warning; a complete segment that fails its checksum is
corruption and raises.

A proxy killed mid-write can leave a JSONL file whose last line is torn (no
final newline): that line is skipped. Any other unparsable line is corruption
and raises. Rotated JSONL files compressed afterwards (`.jsonl.gz`, as
`gzip` or a log rotator leaves them) are read as they are, like the analysis
reads them; a damaged or cut-short gzip stream raises, naming the file. A Parquet file without its footer (the writer was killed before it
rotated or closed the file) cannot be read at all: it is skipped with a
warning unless `strict` is set.

An event, or a segment file's header, that names a schema version this
kproxy does not read (`trace_schema.READABLE_VERSIONS`; a newer writer's
trace) is refused with a TraceFileError naming the file and the version:
read as an older version, its fields could mean something else.
"""

from __future__ import annotations

import gzip
import logging
import re
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import orjson

from kproxy.obs.trace_schema import FIELD_NAMES, unreadable_version

log = logging.getLogger(__name__)

# The writer's names, and a rotated JSONL file compressed afterwards (`.jsonl.gz`).
TRACE_NAME = re.compile(
    r"^trace-(?P<proxy>.+)-(?P<stamp>\d{8}T\d{6})-(?P<seq>\d+)\.(?P<fmt>jsonl|jsonl\.gz|parquet|events)$"
)
_SUFFIXES = (".events", ".jsonl", ".jsonl.gz", ".parquet")


class TraceFileError(ValueError):
    """A trace file is corrupt beyond a torn last line."""


def _order_key(path: Path) -> tuple:
    m = TRACE_NAME.match(path.name)
    if m is None:  # a trace file renamed by hand: after the well-named ones, by name
        return (1, path.name, 0, "")
    return (0, m["proxy"], int(m["seq"]), m["stamp"])


def trace_files(directory: Path | str) -> list[Path]:
    """Every trace file (`trace-*.events`, `.jsonl`, `.jsonl.gz`, `.parquet`) in `directory`, in order."""
    directory = Path(directory)
    found = [
        p for p in directory.iterdir()
        if p.is_file() and p.name.startswith("trace-") and p.name.endswith(_SUFFIXES)
    ]
    return sorted(found, key=_order_key)


class EarlierTracesError(ValueError):
    """An output directory already holds a run's traces."""


def refuse_earlier_traces(out: Path) -> None:
    """Before a run that judges its own traces (`kproxy demo`, `kproxy
    test`) writes into OUT/traces: the analysis reads every file there, so
    an earlier run's traces (an --out used again) would be judged with this
    run's history. kproxy neither reuses nor deletes them."""
    traces = out / "traces"
    if traces.is_dir() and any(traces.iterdir()):
        raise EarlierTracesError(f"{out} holds the traces of an earlier run, which would be judged with this one: "
                                 f"choose another --out or remove {out}")


def iter_jsonl_events(path: Path) -> Iterator[dict]:
    """Events of one JSONL trace file (gzip-compressed if its name ends in `.gz`), skipping a torn final line."""
    data = _read_gzip(path) if path.name.endswith(".gz") else path.read_bytes()
    lines = data.split(b"\n")
    # After a final newline split() leaves b""; anything else there is a torn line.
    torn = lines.pop()
    if torn:
        log.warning("%s: skipping a torn last line (%d bytes)", path, len(torn))
    for number, line in enumerate(lines, start=1):
        if not line:
            continue
        yield read_event_line(line, f"{path}:{number}")


def read_event_line(line: bytes, where: str) -> Any:
    """One JSON Lines trace event, its schema version checked (TraceFileError naming `where`)."""
    try:
        event = orjson.loads(line)
    except orjson.JSONDecodeError as exc:
        raise TraceFileError(f"{where}: not a JSON trace event: {exc}") from exc
    if type(event) is dict:
        check_version(event.get("schema_version"), where)
    return event


def check_version(version: Any, where: str) -> None:
    """Refuse a trace whose schema version this reader cannot read (TraceFileError naming `where`)."""
    # An event without a version is not refused: nothing says which one it is.
    problem = None if version is None else unreadable_version(version)
    if problem is not None:
        raise TraceFileError(f"{where}: {problem}")


def _read_gzip(path: Path) -> bytes:
    # A torn line inside a complete stream is a killed writer's, compressed
    # as it was; a damaged or cut-short stream is the compressed file's own
    # damage, and nothing after it can be trusted.
    try:
        return gzip.decompress(path.read_bytes())
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFileError(f"{path}: not a readable gzip-compressed trace: {exc}") from exc


def iter_parquet_events(path: Path, *, strict: bool = False) -> Iterator[dict]:
    """Events of one Parquet trace file; a file without footer is skipped (or raises if strict)."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    try:
        parquet = pq.ParquetFile(path)
    except (pa.ArrowInvalid, OSError) as exc:
        if strict:
            raise TraceFileError(f"{path}: unreadable Parquet trace: {exc}") from exc
        log.warning("%s: skipping an unreadable Parquet trace (killed before close?): %s", path, exc)
        return
    # A file written before a nullable field was added lacks its column: null, as in a newer file.
    missing = dict.fromkeys(name for name in FIELD_NAMES if name not in parquet.schema_arrow.names)
    for batch in parquet.iter_batches():
        if "schema_version" in batch.schema.names:
            for version in batch.column("schema_version").unique().to_pylist():
                check_version(version, str(path))
        events = batch.to_pylist()
        if missing:
            for event in events:
                event.update(missing)
        yield from events


def iter_file_events(path: Path, *, strict: bool = False) -> Iterator[dict]:
    """Events of one trace file of any format (`.jsonl.gz` included), without side records."""
    if path.suffix == ".parquet":
        return iter_parquet_events(path, strict=strict)
    if path.suffix == ".events":
        return iter_events_file(path)
    return iter_jsonl_events(path)


def check_file_version(path: Path | str) -> None:
    """Raise TraceFileError if the trace file at `path` was written under a schema version this kproxy
    does not read; read nothing else.

    For a reader that parses the events itself (the analysis reads JSON Lines
    and Parquet with Spark): a writer writes one version per file, so a JSON
    Lines file's first event speaks for it; a Parquet file's version column
    is read alone; a segment file's header holds its version. A file that
    holds no event yet passes.
    """
    path = Path(path)
    if path.suffix == ".events":
        from kproxy.obs.trace_segments import SegmentError, segment_index

        try:
            segment_index(path)
        except SegmentError as exc:
            raise TraceFileError(str(exc)) from exc
        return
    if path.suffix == ".parquet":
        import pyarrow as pa
        import pyarrow.parquet as pq

        try:
            versions = pq.read_table(path, columns=["schema_version"]).column(0).unique().to_pylist()
        except (pa.ArrowInvalid, OSError, KeyError):
            return  # unreadable (no footer yet) or without versions: the reader reports what it finds
        for version in versions:
            check_version(version, str(path))
        return
    opener = gzip.open if path.name.endswith(".gz") else open
    try:
        with opener(path, "rb") as f:
            first = f.readline()
    except (OSError, EOFError, zlib.error) as exc:
        raise TraceFileError(f"{path}: not a readable trace: {exc}") from exc
    if first.endswith(b"\n"):
        read_event_line(first, f"{path}:1")


def iter_events_file(path: Path) -> Iterator[dict]:
    """Events of one segment file, up to its last complete segment."""
    from kproxy.obs.trace_segments import SegmentError, iter_segment_events

    try:
        yield from iter_segment_events(path)
    except SegmentError as exc:
        raise TraceFileError(str(exc)) from exc


def iter_trace_events(directory: Path | str, *, strict: bool = False, records: bool = True) -> Iterator[dict]:
    """Every event of every trace file in `directory`, files in `trace_files()` order.

    With `records` (the default) version-3 partitions get their `records`
    decoded from the side files; without, they keep null records.
    """
    sides = _SideFiles()
    try:
        for path in trace_files(directory):
            events = iter_file_events(path, strict=strict)
            for event in events:
                if records and event.get("partitions"):
                    fill_records(event, path.parent, sides)
                yield event
    finally:
        sides.close()


class _SideFiles:
    def __init__(self) -> None:
        self._open: dict[Path, Any] = {}

    def read(self, path: Path, offset: int, length: int) -> bytes:
        f = self._open.get(path)
        if f is None:
            try:
                f = self._open[path] = open(path, "rb")  # noqa: SIM115 - closed by close()
            except OSError as exc:
                raise TraceFileError(f"{path}: side file of the trace not readable: {exc}") from exc
        f.seek(offset)
        data = f.read(length)
        if len(data) != length:
            raise TraceFileError(f"{path}: {length} bytes at offset {offset} referenced, only {len(data)} there")
        return data

    def close(self) -> None:
        for f in self._open.values():
            f.close()
        self._open.clear()


def fill_records(event: dict, directory: Path, sides: _SideFiles) -> None:
    """Decode a version-3 event's side-file batches into its partitions' `records`."""
    from kproxy.protocol.record_views import side_records

    for part in event["partitions"]:
        name = part.get("records_file")
        if name and part.get("records") is None:
            raw = sides.read(directory / name, part["records_offset"], part["records_length"])
            part["records"] = side_records(raw, event.get("api"), event.get("direction"), part)


def export_jsonl(source: Path | str, out: Any, *, records: bool = True, compact: bool = False) -> int:
    """Write the events of a trace directory or of one trace file to `out` (a binary stream) as JSON Lines.

    Files in `trace_files()` order; with `records`, version-3 and later
    partitions get their records decoded from the side files; with
    `compact`, null fields are left out. Returns the number of events written.
    """
    source = Path(source)
    if source.is_dir():
        events = iter_trace_events(source, records=records)
    else:
        events = _file_events_with_records(source, records)
    written = 0
    dumps = orjson.dumps
    for event in events:
        if compact:
            event = {k: v for k, v in event.items() if v is not None}
        out.write(dumps(event) + b"\n")
        written += 1
    return written


def _file_events_with_records(path: Path, records: bool) -> Iterator[dict]:
    sides = _SideFiles()
    try:
        for event in iter_file_events(path, strict=True):
            if records and event.get("partitions"):
                fill_records(event, path.parent, sides)
            yield event
    finally:
        sides.close()
