"""Load proxy traces and flatten them to one row per record.

Traces are read with the explicit schema from kproxy.obs.trace_schema, never
inferred: inference would scan every file twice and would silently change
types when a field happens to be null in a whole file.
"""

from __future__ import annotations

import gzip
import io
import os
import zlib
from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F

from kproxy.obs.trace_schema import spark_schema

# A request that never reached the broker cannot have written or ended anything.
NOT_DELIVERED = ("dropped", "refused", "answered")

# Columns that identify one request/response exchange: request and response
# events share them.
EXCHANGE = ("proxy_id", "conn_id", "correlation_id", "copy")


def _files(directory: Path, suffix: str) -> list[str]:
    # Absolute: executors open segment files by these names, and on a
    # cluster an executor's working directory is not the driver's.
    return sorted(str(p.absolute()) for p in directory.rglob(f"*{suffix}") if p.is_file())


def load_traces(spark: SparkSession, directory: str | Path, *, lean: bool = False) -> DataFrame:
    """Every trace event in `directory` (segments, JSONL and/or Parquet, rotated files included).

    `lean` (the analysis): a Fetch response of a segment file whose
    partitions carry no record and repeat, text for text, those of a
    response read before it gets null `partitions`. Every event stays (the
    counts and latencies are the same); what the checks read from a Fetch
    response's partitions (its records, and the aborted-transactions
    entries and last stable offset beside them, entry by entry) is all
    still there once. An idle consumer of a broker that answers an empty
    Fetch at once repeats the same response thousands of times a second
    (docs/traces.md, "Repeated texts").
    """
    from kproxy_spark.inputs import is_remote, local_path

    if is_remote(directory):
        return load_remote_traces(spark, str(directory), lean=lean)
    directory = Path(local_path(directory))
    if not directory.is_dir():
        raise FileNotFoundError(f"trace directory not found: {directory}")
    schema = spark_schema()
    frames: list[DataFrame] = []
    # Rotated files a user compressed (or recorded test data) read as they are.
    jsonl = _files(directory, ".jsonl") + _files(directory, ".jsonl.gz")
    if jsonl:
        # PERMISSIVE: a proxy killed mid-write leaves a torn last line; it
        # parses to an all-null row, dropped below, instead of failing the run.
        frames.append(spark.read.schema(schema).option("mode", "PERMISSIVE").json(jsonl))
    parquet = _files(directory, ".parquet")
    if parquet:
        frames.append(spark.read.schema(schema).parquet(*parquet))
    if frames:
        # Side files are named relative to the event file that references them.
        frames = [frame.withColumn(_SOURCE, F.input_file_name()) for frame in frames]
        traces = frames[0]
        for frame in frames[1:]:
            traces = traces.unionByName(frame)
        # A torn last line of a killed writer parses to an all-null row; drop it.
        frames = [with_side_records(traces.where(F.col("direction").isNotNull()))]
    segments = _files(directory, ".events")
    if segments:
        # Side records are decoded as the segments are read.
        frames.append(load_segments(spark, segments, lean=lean))
    if not frames:
        return spark.createDataFrame([], schema)
    traces = frames[0]
    for frame in frames[1:]:
        traces = traces.unionByName(frame)
    return traces


_SOURCE = "_trace_file"

# Bytes of segments per task when reading segment files (the traces' cached
# partitions: every scan of them runs a task per partition). A segment is one
# flush batch of the writer (up to 512 events): 16 MB is thousands of events
# with records, or tens of thousands of an idle consumer's Fetches.
_SEGMENT_BYTES_PER_TASK = 16 * 1024 * 1024


#: Side-file regions a reader keeps decoded: a Produce response points at its request's region, a few
#: events later (kproxy.obs.trace_records.ProduceResponseRecords), and is read from it, not decoded again.
_DECODED_REGIONS = 1024


class _Sides:
    """Side files as a trace's partitions reference them (`read` and `where` by the subclass), and the
    records of each region, each region decoded once."""

    def __init__(self, seen=None) -> None:  # noqa: ANN001 - a SeenBatches, imported on the executors
        from kproxy.protocol.record_views import SeenBatches

        self._decoded: dict[tuple[str, int, int], list | None] = {}
        self._seen = SeenBatches() if seen is None else seen

    def where(self, name: str) -> str:
        raise NotImplementedError

    def read(self, name: str, offset: int, length: int) -> bytes:
        raise NotImplementedError

    def records(self, part: dict, api, direction, source: str):  # noqa: ANN001, ANN201
        """The `records` of a partition that points into a side file (record_views.side_records)."""
        from kproxy.protocol.record_views import side_batch_records, side_batches

        region = name, offset, length = part["records_file"], part["records_offset"], part["records_length"]
        if region in self._decoded:
            batches = self._decoded[region]
        else:
            raw = self.read(name, offset, length)
            if len(raw) != length:
                raise ValueError(f"{self.where(name)}: {length} bytes at offset {offset} referenced by {source}, "
                                 f"only {len(raw)} there")
            batches = side_batches(raw, api, direction, part, self._seen)
            if len(self._decoded) >= _DECODED_REGIONS:
                self._decoded.clear()
            self._decoded[region] = batches
        return side_batch_records(batches, api, direction, part, self._seen)


class _LocalSides(_Sides):
    """The side files of one local trace directory, opened by name as they are referenced and kept
    open until `close` (a segment points into its side file hundreds of times: an open and a close
    per read cost a sixth of decoding it)."""

    def __init__(self, directory: Path, seen=None) -> None:  # noqa: ANN001
        super().__init__(seen)
        self.directory = directory
        self._open: dict[str, int] = {}

    def where(self, name: str) -> str:
        return str(self.directory / name)

    def read(self, name: str, offset: int, length: int) -> bytes:
        fd = self._open.get(name)
        if fd is None:
            fd = self._open[name] = os.open(self.directory / name, os.O_RDONLY)
        return os.pread(fd, length, offset)

    def close(self) -> None:
        for fd in self._open.values():
            os.close(fd)
        self._open.clear()

    def __enter__(self) -> _LocalSides:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class _LoadedSides(_Sides):
    """The side files of one remote trace file, read whole by Spark in the same task (load_remote_traces)."""

    def __init__(self, directory: str, contents: dict[str, bytes]) -> None:
        super().__init__()
        self.directory, self.contents = directory, contents

    def where(self, name: str) -> str:
        return f"{self.directory}/{name}"

    def read(self, name: str, offset: int, length: int) -> bytes:
        content = self.contents.get(name)
        if content is None:
            # The writer only points at the side file it writes beside its trace file (docs/traces.md).
            raise FileNotFoundError(f"{self.where(name)}: side file not found beside the trace file that references "
                                    "it (a remote trace file is read with its own side file, <name>.records)")
        return content[offset : offset + length]


def _partitions_with_records(text: bytes, api, direction, sides: _Sides, source: str) -> tuple[bytes, bool]:
    """A partitions text with `records` decoded from the side file where it points at one, and whether
    it is a Fetch response's that carries no record at all (nothing to read but offsets and entries)."""
    import orjson

    from kproxy.obs.trace_segments import json_default

    parts = orjson.loads(text)
    decoded = False
    for part in parts:
        if part.get("records_file") and part.get("records") is None:
            part["records"] = sides.records(part, api, direction, source)
            decoded = True
    empty = api == "fetch" and direction == "response" and not any(
        part.get("records") or part.get("batches") or part.get("records_file") for part in parts)
    return (orjson.dumps(parts, default=json_default) if decoded else text), empty


def _resolve_partitions(n: int, cells: dict, source: str, kept: set | None, sides=None, seen=None) -> None:
    """Fill in the side records of one segment's partitions texts (each distinct text decoded once);
    with `kept` (lean), null the repeats of record-free Fetch responses already in `kept`. The side
    files are `source`'s local neighbours unless `sides` holds them; `seen` (a SeenBatches) holds the
    batches the task decoded before, when the sides are opened here."""
    texts = cells.get("partitions")
    if texts is None:
        return
    if sides is None:
        with _LocalSides(Path(source).parent, seen) as local:
            _resolve_partitions(n, cells, source, kept, local)
        return
    api, direction = cells.get("api") or [None] * n, cells.get("direction") or [None] * n
    rule, upstream = cells.get("rule") or [None] * n, cells.get("upstream_partitions") or [None] * n
    done: dict = {}
    for i, text in enumerate(texts):
        if text is None:
            continue
        key = (api[i], direction[i], text)
        resolved = done.get(key)
        if resolved is None:
            resolved = done[key] = _partitions_with_records(text, api[i], direction[i], sides, source)
        text, empty = resolved
        if kept is not None and empty and rule[i] is None and upstream[i] is None:
            if text in kept:
                text = None
            else:
                kept.add(text)
        texts[i] = text


def _segment_batches(index_batches, lean: bool = False):  # noqa: ANN001, ANN202 - runs on the executors (mapInArrow)
    from kproxy.obs.trace_segments import cells_to_arrow, read_segment_cells
    from kproxy.protocol.record_views import SeenBatches

    # Repeats are looked for within a task (up to 16 MB of segments): enough
    # for a consumer that polls thousands of times a second, and bounded by
    # the distinct record-free texts of the task.
    kept: set | None = set() if lean else None
    # So are batches decoded before: a record's Fetches are in the segments after its Produce.
    seen = SeenBatches()
    for index in index_batches:
        for path, offset, length in zip(*(index.column(c).to_pylist() for c in ("path", "offset", "length"))):
            n, cells = read_segment_cells(path, offset, length)
            _resolve_partitions(n, cells, path, kept, seen=seen)
            yield cells_to_arrow(n, cells)


def load_segments(spark: SparkSession, files: list[str], *, lean: bool = False) -> DataFrame:
    """Events of segment trace files (kproxy/obs/trace_segments.py), read and decoded on the executors.

    The driver only walks segment heads to list (file, offset, length); the
    executors read each segment, check its checksum, decode the side records
    its partitions point at (once per distinct partitions text) and turn it
    into Arrow (nested fields as JSON text), and Spark parses the nested
    fields with the schema's own types. A file cut short by a killed proxy
    ends at its last complete segment; a damaged segment fails the analysis,
    naming the file and offset. `lean`: see load_traces.
    """
    from kproxy.obs.trace_segments import segment_index
    from kproxy_spark.session import rows_frame

    index = [(path, offset, length) for path in files for offset, length in segment_index(path)]
    if not index:
        return spark.createDataFrame([], spark_schema())
    slices = min(len(index), max(1, -(-sum(length for _, _, length in index) // _SEGMENT_BYTES_PER_TASK)))
    segments = rows_frame(spark, index, [("path", "string"), ("offset", "int64"), ("length", "int64")])
    segments = segments.repartition(slices)
    return _typed_events(segments.mapInArrow(lambda batches: _segment_batches(batches, lean), _flat_schema()))


def _flat_schema():  # a StructType
    """The events as the executors hand them over: the schema's columns, nested ones as JSON text."""
    from pyspark.sql import types as T

    from kproxy.obs.trace_schema import EVENT, spark_type
    from kproxy.obs.trace_segments import COLUMNS

    return T.StructType(
        [T.StructField(f.name, T.StringType() if kind == "json" else spark_type(f.type), True)
         for f, (_, kind) in zip(EVENT, COLUMNS, strict=True)]
    )


def _typed_events(flat: DataFrame) -> DataFrame:
    """Flat events with their nested columns parsed by Spark with the schema's own types."""
    from kproxy.obs.trace_schema import EVENT, spark_type
    from kproxy.obs.trace_segments import COLUMNS

    return flat.select(*[
        F.from_json(f.name, spark_type(f.type)).alias(f.name) if kind == "json" else F.col(f.name)
        for f, (_, kind) in zip(EVENT, COLUMNS, strict=True)
    ])


# The trace files of a directory (side files, .records, hold no events), and a file's name without them.
TRACE_SUFFIXES = (".events", ".jsonl", ".jsonl.gz", ".parquet")
_TRACE_OR_SIDE = r"\.(events|jsonl\.gz|jsonl|parquet|records)$"

# Events per Arrow batch when a remote JSON Lines or Parquet file is handed over.
_REMOTE_EVENTS_PER_BATCH = 4096


def load_remote_traces(spark: SparkSession, uri: str, *, lean: bool = False) -> DataFrame:
    """load_traces for a directory on a Hadoop file system (hdfs://, s3a://, viewfs://, ...).

    The driver lists it through Hadoop (kproxy_spark.inputs); the executors
    read each trace file whole with Spark's binaryFile reader, together with
    its own side file (`<name>.records`, the only one its events point at),
    and hand its events over as load_segments does, nested fields as JSON
    text that Spark parses with the schema's types. Python on an executor
    cannot open a Hadoop URI, so a side file travels with its trace file
    (one shuffle of the trace's bytes) instead of being opened by name.
    """
    from kproxy_spark.inputs import require

    files = [name for name, _ in require(spark, uri, "directory", "trace directory").files()]
    if not any(name.endswith(TRACE_SUFFIXES) for name in files):
        return spark.createDataFrame([], spark_schema())
    glob = "*.{" + ",".join(suffix.lstrip(".") for suffix in (*TRACE_SUFFIXES, ".records")) + "}"
    raw = (spark.read.format("binaryFile").option("recursiveFileLookup", "true").option("pathGlobFilter", glob)
           .load(uri).select("path", "content"))
    paired = raw.withColumn("_stem", F.regexp_replace("path", _TRACE_OR_SIDE, ""))
    flat = paired.groupBy("_stem").applyInArrow(lambda table: _remote_file_events(table, lean), _flat_schema())
    return _typed_events(flat)


def _remote_file_events(table, lean: bool):  # runs on the executors (applyInArrow)
    """One trace file's events (with any files of the same name, i.e. its side file) as one Arrow table."""
    import pyarrow as pa

    from kproxy.obs.trace_segments import cells_to_arrow
    from kproxy_spark.inputs import base_name

    files = table.select(["path", "content"]).to_pylist()
    directory = files[0]["path"].rsplit("/", 1)[0]
    sides = _LoadedSides(directory, {base_name(f["path"]): f["content"] for f in files
                                     if f["path"].endswith(".records")})
    batches = [batch for f in files if not f["path"].endswith(".records")
               for batch in _remote_batches(f["path"], f["content"], sides, lean)]
    return pa.Table.from_batches(batches) if batches else pa.Table.from_batches([cells_to_arrow(0, {})])


def _remote_batches(path: str, content: bytes, sides: _LoadedSides, lean: bool):
    if path.endswith(".events"):
        return _segment_content_batches(path, content, sides, lean)
    events = _parquet_events(content) if path.endswith(".parquet") else _jsonl_events(path, content)
    return _event_batches(events, path, sides)


def _segment_content_batches(path: str, content: bytes, sides: _LoadedSides, lean: bool):
    """A segment file's events, segment by segment, as _segment_batches reads a local one."""
    from kproxy.obs.trace_segments import SegmentError, SegmentFile, cells_to_arrow
    from kproxy_spark.inputs import with_uri

    kept: set | None = set() if lean else None
    try:
        segments = SegmentFile(path, data=content)
        for index in range(len(segments.segments)):
            n, columns = segments.columns_of(index)
            cells = dict(zip((name for name, _ in segments.columns), columns))
            _resolve_partitions(n, cells, path, kept, sides)
            yield cells_to_arrow(n, cells)
    except SegmentError as exc:
        raise SegmentError(with_uri(str(exc), path)) from None


def _jsonl_events(path: str, content: bytes):
    """A JSON Lines trace file's events; lines that are not JSON objects with a direction are left out,
    as reading a local file leaves out the all-null rows Spark makes of them (a killed writer's torn line)."""
    import orjson

    from kproxy.obs.trace_files import TraceFileError

    if path.endswith(".gz"):
        try:
            content = gzip.decompress(content)
        except (OSError, EOFError, zlib.error) as exc:
            raise TraceFileError(f"{path}: not a readable gzip-compressed trace: {exc}") from None
    for line in content.split(b"\n"):
        try:
            event = orjson.loads(line)
        except orjson.JSONDecodeError:
            continue
        if type(event) is dict and event.get("direction") is not None:
            yield event


def _parquet_events(content: bytes):
    """A Parquet trace file's events (a column an older writer lacked reads as null)."""
    import pyarrow.parquet as pq

    for event in pq.read_table(io.BytesIO(content)).to_pylist():
        if event.get("direction") is not None:
            yield event


def _event_batches(events, source: str, sides: _LoadedSides):
    """Events as flat Arrow batches (nested fields as JSON text), side records filled in."""
    from itertools import islice

    import orjson

    from kproxy.obs.trace_segments import COLUMNS, cells_to_arrow, json_default

    events = iter(events)
    while chunk := list(islice(events, _REMOTE_EVENTS_PER_BATCH)):
        cells = {}
        for name, kind in COLUMNS:
            values = [event.get(name) for event in chunk]
            if kind == "json":
                values = [None if v is None else orjson.dumps(v, default=json_default) for v in values]
            cells[name] = values
        _resolve_partitions(len(chunk), cells, source, None, sides)
        yield cells_to_arrow(len(chunk), cells)


def _decode_side_partitions(partitions, source, api, direction):  # noqa: ANN001, ANN202 - runs on the executors
    """A version-3 event's partitions with `records` decoded from the raw batches in its side file."""
    from urllib.parse import unquote, urlparse

    out = []
    with _LocalSides(Path(unquote(urlparse(source).path)).parent) as sides:
        for row in partitions:
            part = row.asDict(recursive=True)
            if part.get("records_file") and part.get("records") is None:
                part["records"] = sides.records(part, api, direction, source)
            out.append(part)
    return out


def with_side_records(traces: DataFrame) -> DataFrame:
    """Fill version-3 partitions' `records` from their side files, as version 2 carried them inline.

    For JSON Lines and Parquet traces (segment files are decoded as they are
    read, load_segments). The proxy only copied each partition's raw record
    batches to a side file; decompressing (cramjam) and decoding them
    happens here, on the executors, in parallel over the events that have
    any. Events without (version 2, headers-level, other APIs) pass through
    untouched, so everything downstream (trace_records and its users) reads
    both versions alike. One pass over the source: the events that need no
    decoding hand the Python function a null (a union of two filtered scans
    parsed every JSON line twice).
    """
    if _SOURCE not in traces.columns:
        return traces
    partitions_type = traces.schema["partitions"].dataType
    decode = F.udf(lambda partitions, source, api, direction: None if partitions is None
                   else _decode_side_partitions(partitions, source, api, direction), partitions_type)
    needs = F.coalesce(
        F.exists("partitions", lambda p: p["records_file"].isNotNull() & p["records"].isNull()), F.lit(False)
    )
    decoded = decode(F.when(needs, F.col("partitions")), F.when(needs, F.col(_SOURCE)), "api", "direction")
    columns = [F.coalesce(decoded, F.col("partitions")).alias(c) if c == "partitions" else F.col(c)
               for c in traces.columns if c != _SOURCE]
    return traces.select(*columns)


def with_coalesced_ids(traces: DataFrame) -> DataFrame:
    """Fill the exchange key so joins never meet nulls (nulls never join)."""
    return traces.fillna({"proxy_id": "", "copy": 0})


def trace_records(traces: DataFrame) -> DataFrame:
    """One row per record per event, with the event's columns.

    Columns: the event's own columns except `partitions`, then topic,
    partition, partition_error_code, base_offset, high_watermark,
    last_stable_offset, aborted_transactions, record_index (position within
    the partition of this event), offset, key, value, control,
    producer_id / producer_epoch (the record batch's, falling back to the
    event's), sequence, transactional, and the event's own producer id and
    epoch as event_producer_id / event_producer_epoch.
    """
    events = with_coalesced_ids(traces).where(F.col("partitions").isNotNull())
    event_columns = [c for c in traces.columns
                     if c not in ("partitions", "upstream_partitions", "producer_id", "producer_epoch")]
    parts = events.select(
        *event_columns,
        F.col("producer_id").alias("event_producer_id"),
        F.col("producer_epoch").alias("event_producer_epoch"),
        F.explode("partitions").alias("p"),
        "upstream_partitions",
    ).withColumn("u", _upstream_of(F.col("p")))
    flagged = F.transform(F.col("p.records"), lambda r: F.struct(
        r.alias("r"),
        _listed_aborted(r, F.col("p")).alias("listed_aborted"),
        F.when(F.col("u").isNotNull(), _listed_aborted(r, F.col("u"))).alias("upstream_listed_aborted"),
        _past_lso(r, F.col("p")).alias("past_lso"),
        F.when(F.col("u").isNotNull(), _past_lso(r, F.col("u"))).alias("upstream_past_lso"),
    ))
    records = parts.select(
        *event_columns,
        "event_producer_id",
        "event_producer_epoch",
        F.col("p.topic").alias("topic"),
        F.col("p.partition").alias("partition"),
        F.col("p.error_code").alias("partition_error_code"),
        F.col("p.base_offset").alias("base_offset"),
        F.col("p.high_watermark").alias("high_watermark"),
        F.col("p.last_stable_offset").alias("last_stable_offset"),
        F.col("p.aborted_transactions").alias("aborted_transactions"),
        F.col("u").isNotNull().alias("rewritten"),
        F.posexplode(flagged).alias("record_index", "f"),
    )
    return records.select(
        *[c for c in records.columns if c != "f"],
        F.col("f.r.offset").alias("offset"),
        F.col("f.r.key").alias("key"),
        F.col("f.r.value").alias("value"),
        F.col("f.r.control").alias("control"),
        F.coalesce("f.r.producer_id", "event_producer_id").alias("producer_id"),
        F.coalesce("f.r.producer_epoch", "event_producer_epoch").alias("producer_epoch"),
        F.col("f.r.sequence").alias("sequence"),
        F.col("f.r.transactional").alias("transactional"),
        F.col("f.listed_aborted").alias("listed_aborted"),
        F.col("f.upstream_listed_aborted").alias("upstream_listed_aborted"),
        F.col("f.past_lso").alias("past_lso"),
        F.col("f.upstream_past_lso").alias("upstream_past_lso"),
    )


def _upstream_of(part: Column) -> Column:
    """The same topic-partition in the event's upstream_partitions (the
    broker's response before a rule rewrote it), or null."""
    same = F.filter(F.coalesce(F.col("upstream_partitions"), F.array()),
                    lambda u: (u["topic"] == part["topic"]) & (u["partition"] == part["partition"]))
    return F.get(same, 0)


def _listed_aborted(record: Column, part: Column) -> Column:
    """Whether a read_committed client drops this data record by the
    response's aborted-transactions list, as Kafka's consumers do: an entry
    (producer, first offset) marks the producer aborted from that offset on,
    until the producer's ABORT marker in the response."""
    entries = F.coalesce(part["aborted_transactions"], F.array())
    aborts = F.filter(part["records"], lambda m: m["control"] == "abort")
    return record["control"].isNull() & F.exists(entries, lambda a: (
        (a["producer_id"] == record["producer_id"])
        & (a["first_offset"] <= record["offset"])
        & ~F.exists(aborts, lambda m: (m["producer_id"] == record["producer_id"])
                    & (m["offset"] >= a["first_offset"]) & (m["offset"] < record["offset"]))
    ))


def _past_lso(record: Column, part: Column) -> Column:
    """A data record at or beyond the response's own last stable offset
    (exclusive: everything below it is decided)."""
    lso = part["last_stable_offset"]
    return record["control"].isNull() & (lso >= 0) & (record["offset"] >= lso)


def rule_removed_records(traces: DataFrame) -> DataFrame:
    """Records a rule took out of a Fetch response: in the broker's response
    (upstream_partitions) but not in the one the client got. Columns: the
    exchange, mono_ns, client_id, rule, action, topic, partition, offset, key,
    value, control, producer_id, and read_committed: the broker's own answer
    carried an aborted-transactions list, which brokers send only to
    read_committed fetches."""
    events = with_coalesced_ids(traces).where(F.col("upstream_partitions").isNotNull())
    parts = events.select(*EXCHANGE, "mono_ns", "client_id", "rule", "action", "partitions",
                          F.explode("upstream_partitions").alias("u"))
    delivered = F.get(F.filter(F.coalesce(F.col("partitions"), F.array()),
                               lambda p: (p["topic"] == F.col("u.topic")) & (p["partition"] == F.col("u.partition"))), 0)
    kept = F.coalesce(delivered["records"], F.array())
    removed = F.filter(F.col("u.records"), lambda r: ~F.exists(kept, lambda k: k["offset"] == r["offset"]))
    rows = parts.select(*EXCHANGE, "mono_ns", "client_id", "rule", "action", F.col("u.topic").alias("topic"),
                        F.col("u.partition").alias("partition"),
                        F.col("u.aborted_transactions").isNotNull().alias("read_committed"),
                        F.explode(removed).alias("r"))
    return rows.select(
        *EXCHANGE, "mono_ns", "client_id", "rule", "action", "topic", "partition", "read_committed",
        F.col("r.offset").alias("offset"), F.col("r.key").alias("key"), F.col("r.value").alias("value"),
        F.col("r.control").alias("control"), F.col("r.producer_id").alias("producer_id"),
        F.col("r.key").cast("long").alias("key_long"), F.col("r.value").cast("long").alias("value_long"),
    )


def trace_partitions(traces: DataFrame) -> DataFrame:
    """One row per partition per event (Produce response offsets and errors, Fetch metadata)."""
    events = with_coalesced_ids(traces).where(F.col("partitions").isNotNull())
    event_columns = [c for c in traces.columns if c not in ("partitions", "upstream_partitions")]
    parts = events.select(*event_columns, F.explode("partitions").alias("p"))
    return parts.select(
        *event_columns,
        F.col("p.topic").alias("topic"),
        F.col("p.partition").alias("partition"),
        F.col("p.error_code").alias("partition_error_code"),
        F.col("p.base_offset").alias("base_offset"),
        F.col("p.high_watermark").alias("high_watermark"),
        F.col("p.last_stable_offset").alias("last_stable_offset"),
        F.col("p.aborted_transactions").alias("aborted_transactions"),
    )
