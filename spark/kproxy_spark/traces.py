"""Load proxy traces and flatten them to one row per record.

Traces are read with the explicit schema from kproxy.obs.trace_schema, never
inferred: inference would scan every file twice and would silently change
types when a field happens to be null in a whole file.
"""

from __future__ import annotations

from pathlib import Path

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from kproxy.obs.trace_schema import spark_schema

# A request that never reached the broker cannot have written or ended anything.
NOT_DELIVERED = ("dropped", "refused", "answered")

# Columns that identify one request/response exchange: request and response
# events share them.
EXCHANGE = ("proxy_id", "conn_id", "correlation_id", "copy")


def _files(directory: Path, suffix: str) -> list[str]:
    return sorted(str(p) for p in directory.rglob(f"*{suffix}") if p.is_file())


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
    directory = Path(directory)
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


def _partitions_with_records(text: bytes, api, direction, directory: Path, source: str) -> tuple[bytes, bool]:  # noqa: ANN001
    """A partitions text with `records` decoded from the side file where it points at one, and whether
    it is a Fetch response's that carries no record at all (nothing to read but offsets and entries)."""
    import orjson

    from kproxy.obs.trace_segments import json_default

    parts = orjson.loads(text)
    decoded = False
    for part in parts:
        if part.get("records_file") and part.get("records") is None:
            part["records"] = _side_records(part, api, direction, directory, source)
            decoded = True
    empty = api == "fetch" and direction == "response" and not any(
        part.get("records") or part.get("batches") or part.get("records_file") for part in parts)
    return (orjson.dumps(parts, default=json_default) if decoded else text), empty


def _side_records(part: dict, api, direction, directory: Path, source: str):  # noqa: ANN001, ANN202
    from kproxy.protocol.record_views import side_records

    path = directory / part["records_file"]
    offset, length = part["records_offset"], part["records_length"]
    with open(path, "rb") as f:
        f.seek(offset)
        raw = f.read(length)
    if len(raw) != length:
        raise ValueError(f"{path}: {length} bytes at offset {offset} referenced by {source}, only {len(raw)} there")
    return side_records(raw, api, direction, part)


def _resolve_partitions(n: int, cells: dict, source: str, kept: set | None) -> None:
    """Fill in the side records of one segment's partitions texts (each distinct text decoded once);
    with `kept` (lean), null the repeats of record-free Fetch responses already in `kept`."""
    texts = cells.get("partitions")
    if texts is None:
        return
    directory = Path(source).parent
    api, direction = cells.get("api") or [None] * n, cells.get("direction") or [None] * n
    rule, upstream = cells.get("rule") or [None] * n, cells.get("upstream_partitions") or [None] * n
    done: dict = {}
    for i, text in enumerate(texts):
        if text is None:
            continue
        key = (api[i], direction[i], text)
        resolved = done.get(key)
        if resolved is None:
            resolved = done[key] = _partitions_with_records(text, api[i], direction[i], directory, source)
        text, empty = resolved
        if kept is not None and empty and rule[i] is None and upstream[i] is None:
            if text in kept:
                text = None
            else:
                kept.add(text)
        texts[i] = text


def _segment_batches(index_batches, lean: bool = False):  # noqa: ANN001, ANN202 - runs on the executors (mapInArrow)
    from kproxy.obs.trace_segments import cells_to_arrow, read_segment_cells

    # Repeats are looked for within a task (up to 16 MB of segments): enough
    # for a consumer that polls thousands of times a second, and bounded by
    # the distinct record-free texts of the task.
    kept: set | None = set() if lean else None
    for index in index_batches:
        for path, offset, length in zip(*(index.column(c).to_pylist() for c in ("path", "offset", "length"))):
            n, cells = read_segment_cells(path, offset, length)
            _resolve_partitions(n, cells, path, kept)
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
    from pyspark.sql import types as T

    from kproxy.obs.trace_schema import EVENT, spark_type
    from kproxy.obs.trace_segments import COLUMNS, segment_index

    index = [(path, offset, length) for path in files for offset, length in segment_index(path)]
    flat = T.StructType(
        [T.StructField(f.name, T.StringType() if kind == "json" else spark_type(f.type), True)
         for f, (_, kind) in zip(EVENT, COLUMNS, strict=True)]
    )
    if not index:
        return spark.createDataFrame([], spark_schema())
    slices = min(len(index), max(1, -(-sum(length for _, _, length in index) // _SEGMENT_BYTES_PER_TASK)))
    segments = spark.createDataFrame(index, "path string, offset long, length long").repartition(slices)
    events = segments.mapInArrow(lambda batches: _segment_batches(batches, lean), flat)
    return events.select(*[
        F.from_json(f.name, spark_type(f.type)).alias(f.name) if kind == "json" else F.col(f.name)
        for f, (_, kind) in zip(EVENT, COLUMNS, strict=True)
    ])


def _decode_side_partitions(partitions, source, api, direction):  # noqa: ANN001, ANN202 - runs on the executors
    """A version-3 event's partitions with `records` decoded from the raw batches in its side file."""
    from urllib.parse import unquote, urlparse

    directory = Path(unquote(urlparse(source).path)).parent
    out = []
    for row in partitions:
        part = row.asDict(recursive=True)
        if part.get("records_file") and part.get("records") is None:
            part["records"] = _side_records(part, api, direction, directory, source)
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


def _with_coalesced_ids(traces: DataFrame) -> DataFrame:
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
    events = _with_coalesced_ids(traces).where(F.col("partitions").isNotNull())
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
    value, control, producer_id."""
    events = _with_coalesced_ids(traces).where(F.col("upstream_partitions").isNotNull())
    parts = events.select(*EXCHANGE, "mono_ns", "client_id", "rule", "action", "partitions",
                          F.explode("upstream_partitions").alias("u"))
    delivered = F.get(F.filter(F.coalesce(F.col("partitions"), F.array()),
                               lambda p: (p["topic"] == F.col("u.topic")) & (p["partition"] == F.col("u.partition"))), 0)
    kept = F.coalesce(delivered["records"], F.array())
    removed = F.filter(F.col("u.records"), lambda r: ~F.exists(kept, lambda k: k["offset"] == r["offset"]))
    rows = parts.select(*EXCHANGE, "mono_ns", "client_id", "rule", "action", F.col("u.topic").alias("topic"),
                        F.col("u.partition").alias("partition"), F.explode(removed).alias("r"))
    return rows.select(
        *EXCHANGE, "mono_ns", "client_id", "rule", "action", "topic", "partition",
        F.col("r.offset").alias("offset"), F.col("r.key").alias("key"), F.col("r.value").alias("value"),
        F.col("r.control").alias("control"), F.col("r.producer_id").alias("producer_id"),
        F.col("r.key").cast("long").alias("key_long"), F.col("r.value").cast("long").alias("value_long"),
    )


def trace_partitions(traces: DataFrame) -> DataFrame:
    """One row per partition per event (Produce response offsets and errors, Fetch metadata)."""
    events = _with_coalesced_ids(traces).where(F.col("partitions").isNotNull())
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


def _delivered() -> "F.Column":
    """Whether the request reached the broker. A `held` request is traced
    when the hold ends and it is delivered late on the client's connection;
    the broker's answer (response_ns) is what shows it arrived (a held
    request the client's hang-up cut off is delivered as a ghost copy,
    traced on its own)."""
    outcome = F.coalesce(F.col("outcome"), F.lit("delivered"))
    return ~outcome.isin(*NOT_DELIVERED) & ((outcome != "held") | F.col("response_ns").isNotNull())


def exchanges(traces: DataFrame) -> DataFrame:
    """One row per request event, joined with its response event when traced.

    Adds response_ns, response_error_code, response_error_codes,
    latency_ms / upstream_latency_ms (from the response), `delivered` and
    `delivery_ns`: when the request reached the broker, taken as the response
    time minus the upstream latency because a delayed request's own event
    time is its arrival, not its delivery.
    """
    events = _with_coalesced_ids(traces)
    requests = events.where(F.col("direction") == "request").drop("latency_ms", "upstream_latency_ms")
    responses = events.where(F.col("direction") == "response").select(
        *EXCHANGE,
        F.col("mono_ns").alias("response_ns"),
        F.col("error_code").alias("response_error_code"),
        F.col("error_codes").alias("response_error_codes"),
        "latency_ms",
        "upstream_latency_ms",
    )
    joined = requests.join(responses, list(EXCHANGE), "left")
    return joined.withColumn("delivered", _delivered()).withColumn(
        "delivery_ns",
        F.coalesce(
            (F.col("response_ns") - F.col("upstream_latency_ms") * 1e6).cast("long"),
            F.col("mono_ns"),
        ),
    )


def _producer_key(tid: str, pid: str, epoch: str) -> list["F.Column"]:
    # The synthetic transaction numbers are counted per (transactional id,
    # producer id, epoch); nulls become sentinels so the key always joins.
    return [
        F.coalesce(F.col(tid), F.lit("")).alias("txn_id"),
        F.coalesce(F.col(pid), F.lit(-1)).cast("long").alias("txn_pid"),
        F.coalesce(F.col(epoch), F.lit(-1)).cast("int").alias("txn_epoch"),
    ]


TXN_KEY = ("txn_id", "txn_pid", "txn_epoch")


def closed_in_flight(traces: DataFrame) -> DataFrame:
    """Requests a connection left without an answer when it closed (close
    events' `in_flight`): the exchange key, `state` (where the request was)
    and `lost_reason`, e.g. 'lost: connection closed (client_closed)'."""
    closes = _with_coalesced_ids(traces).where((F.col("direction") == "close") & F.col("in_flight").isNotNull())
    entries = closes.select("proxy_id", "close_reason", F.explode("in_flight").alias("r"))
    return entries.select(
        "proxy_id", F.col("r.conn_id").alias("conn_id"), F.col("r.correlation_id").alias("correlation_id"),
        F.coalesce(F.col("r.copy"), F.lit(0)).alias("copy"), F.col("r.state").alias("state"),
        F.concat(F.lit("lost: connection closed ("), F.coalesce("close_reason", F.lit("no reason given")),
                 F.lit(")")).alias("lost_reason"),
    ).dropDuplicates(list(EXCHANGE))


def produce_attempts(traces: DataFrame) -> DataFrame:
    """One row per record per Produce request event (copies included), with
    the partition's answer: response_error, landed_offset and a status of
    ok | error | not-delivered | lost (its connection closed with it in
    flight: `lost_reason`) | no-response."""
    records = trace_records(traces).where((F.col("api") == "produce") & (F.col("direction") == "request"))
    responses = trace_partitions(traces).where(
        (F.col("api") == "produce") & (F.col("direction") == "response")
    ).select(
        *EXCHANGE,
        "topic",
        "partition",
        F.coalesce("partition_error_code", "error_code").alias("response_error"),
        F.col("base_offset").alias("response_base_offset"),
        F.col("mono_ns").alias("response_ns"),
        F.col("upstream_latency_ms").alias("response_upstream_ms"),
    )
    joined = records.join(responses, [*EXCHANGE, "topic", "partition"], "left").join(
        closed_in_flight(traces).select(*EXCHANGE, "lost_reason"), list(EXCHANGE), "left")
    delivered = _delivered()
    status = (
        F.when(delivered & (F.col("response_error") == 0), "ok")
        .when(F.col("response_error") != 0, "error")
        .when(F.col("outcome").isin(*NOT_DELIVERED), "not-delivered")
        .when(F.col("lost_reason").isNotNull(), "lost")
        .when(~delivered, "not-delivered")
        .otherwise("no-response")
    )
    return joined.select(
        *EXCHANGE,
        "mono_ns",
        "wall_time",
        "transactional_id",
        *_producer_key("transactional_id", "event_producer_id", "event_producer_epoch"),
        "producer_id",
        "txn_client",
        "txn_broker",
        "hazard",
        "rule",
        "action",
        "outcome",
        "topic",
        "partition",
        "record_index",
        "key",
        "value",
        F.col("key").cast("long").alias("key_long"),
        F.col("value").cast("long").alias("value_long"),
        "transactional",
        "response_error",
        status.alias("status"),
        F.when(F.col("response_error").isNull(), F.col("lost_reason")).alias("lost_reason"),
        F.when(
            delivered & (F.col("response_error") == 0) & (F.col("response_base_offset") >= 0),
            F.col("response_base_offset") + F.col("record_index"),
        ).alias("landed_offset"),
        F.coalesce(
            (F.col("response_ns") - F.col("response_upstream_ms") * 1e6).cast("long"), F.col("mono_ns")
        ).alias("delivery_ns"),
    )


def fetched_records(traces: DataFrame, isolation: str = "auto") -> DataFrame:
    """Records (data and control) returned by Fetch responses, with a
    `read_committed` flag.

    The trace carries no isolation level, so it is inferred: brokers send an
    aborted-transactions list (possibly empty) only to read_committed
    fetches. isolation="auto" uses that tell when any fetch in the trace
    carries a list, and otherwise assumes read_committed (the workload's
    default); "read_committed" / "read_uncommitted" force it.
    """
    records = trace_records(traces).where(
        (F.col("api") == "fetch") & (F.col("direction") == "response") & F.col("offset").isNotNull()
    )
    if isolation == "read_committed":
        flag = F.lit(True)
    elif isolation == "read_uncommitted":
        flag = F.lit(False)
    elif isolation == "auto":
        has_lists = records.where(F.col("aborted_transactions").isNotNull()).limit(1).count() > 0
        flag = F.col("aborted_transactions").isNotNull() if has_lists else F.lit(True)
    else:
        raise ValueError(f"isolation must be auto, read_committed or read_uncommitted, not {isolation!r}")
    return records.withColumn("read_committed", flag).withColumn(
        "key_long", F.col("key").cast("long")
    ).withColumn("value_long", F.col("value").cast("long"))


def end_txns(traces: DataFrame) -> DataFrame:
    """Every EndTxn request with its response, delivery time and producer key."""
    # Both sides filtered before the join: the request side alone would still
    # shuffle every response (a spinning consumer's Fetches) into it.
    return exchanges(traces.where(F.col("api") == "end_txn")).select(
        *EXCHANGE,
        "mono_ns",
        "delivery_ns",
        "transactional_id",
        *_producer_key("transactional_id", "producer_id", "producer_epoch"),
        "txn_client",
        "txn_broker",
        "end_txn_commit",
        "hazard",
        "rule",
        "action",
        "outcome",
        "delivered",
        "response_error_code",
        "response_ns",
    )


END_TXN_ATTRIBUTION = (
    "conn_id",
    "correlation_id",
    "copy",
    "txn_client",
    "txn_broker",
    "end_txn_commit",
    "hazard",
    "rule",
    "action",
    "outcome",
)


def deciding_end_txns(traces: DataFrame, ends: DataFrame | None = None) -> DataFrame:
    """Per producer and broker-side transaction number, the EndTxn that ended
    it: the first one delivered whose response (if any) was not an error.
    Columns: TXN_KEY and txn_broker prefixed `decided_`, then
    END_TXN_ATTRIBUTION prefixed `end_`. `ends`: end_txns(traces), when the
    caller already holds it."""
    candidates = (end_txns(traces) if ends is None else ends).where(
        F.col("delivered")
        & F.col("txn_broker").isNotNull()
        & (F.col("response_error_code").isNull() | (F.col("response_error_code") == 0))
    )
    first = Window.partitionBy(*TXN_KEY, "txn_broker").orderBy("delivery_ns", "mono_ns", "copy")
    chosen = candidates.withColumn("_n", F.row_number().over(first)).where(F.col("_n") == 1)
    return chosen.select(
        *[F.col(c).alias(f"decided_{c}") for c in TXN_KEY],
        F.col("txn_broker").alias("decided_txn_broker"),
        *[F.col(c).alias(f"end_{c}") for c in END_TXN_ATTRIBUTION],
    )


def landings(
    traces: DataFrame,
    isolation: str = "auto",
    attempts: DataFrame | None = None,
    fetched: DataFrame | None = None,
    ends: DataFrame | None = None,
) -> DataFrame:
    """Every record known to be in a partition's log, once per (topic,
    partition, offset): acknowledged by a Produce response or returned by a
    Fetch. Carries the producing request's numbers, hazard and rule when the
    Produce was traced, and `fate`: committed | aborted | unknown.

    Fate comes first from the log itself (the next transaction marker of the
    record's producer in that partition, or an aborted-transactions entry
    covering it), then from the EndTxn that ended the record's broker-side
    transaction, and is `committed` for non-transactional records.
    """
    # Callers that already hold produce_attempts / fetched_records / end_txns
    # (kept) pass them in, so the plan is not rebuilt from the raw events.
    if attempts is None:
        attempts = produce_attempts(traces)
    if fetched is None:
        fetched = fetched_records(traces, isolation)
    attempts = attempts.where(F.col("landed_offset").isNotNull())
    produced = attempts.select(
        "topic",
        "partition",
        F.col("landed_offset").alias("offset"),
        "key",
        "value",
        "producer_id",
        "transactional",
        *TXN_KEY,
        "txn_client",
        "txn_broker",
        F.col("hazard").alias("produce_hazard"),
        F.col("rule").alias("produce_rule"),
        F.col("action").alias("produce_action"),
        F.col("conn_id").alias("produce_conn_id"),
        F.col("correlation_id").alias("produce_correlation_id"),
        F.col("copy").alias("produce_copy"),
        F.col("delivery_ns").alias("produce_delivery_ns"),
        F.lit(False).alias("seen_in_fetch"),
    )
    read = fetched.where(F.col("control").isNull()).select(
        "topic", "partition", "offset", "key", "value", "producer_id", "transactional",
        F.lit(True).alias("seen_in_fetch"),
    )
    both = produced.unionByName(read, allowMissingColumns=True)
    attributes = [c for c in produced.columns if c not in ("topic", "partition", "offset", "seen_in_fetch")]
    log = both.groupBy("topic", "partition", "offset").agg(
        *[F.first(c, ignorenulls=True).alias(c) for c in attributes],
        F.max("seen_in_fetch").alias("seen_in_fetch"),
    )
    if ends is None:
        ends = end_txns(traces)
    return _with_fates(log, fetched, traces, deciding_end_txns(traces, ends), ends)


def _marker_fates(log: DataFrame, fetched: DataFrame, traces: DataFrame) -> DataFrame:
    # One sort per (topic, partition, producer) instead of a range join: each
    # record looks forward to its producer's next marker and back to the last
    # boundary (marker or aborted-transaction start).
    points = log.select("topic", "partition", "producer_id", "offset", F.lit(1).alias("kind"), F.lit(None).cast("string").alias("control"))
    markers = fetched.where(F.col("control").isNotNull()).select(
        "topic", "partition", "producer_id", "offset", F.lit(2).alias("kind"), "control"
    ).dropDuplicates(["topic", "partition", "producer_id", "offset"])
    starts = (
        trace_partitions(traces)
        .where((F.col("api") == "fetch") & (F.col("direction") == "response") & F.col("aborted_transactions").isNotNull())
        .select("topic", "partition", F.explode("aborted_transactions").alias("a"))
        .select(
            "topic",
            "partition",
            F.col("a.producer_id").alias("producer_id"),
            F.col("a.first_offset").alias("offset"),
            F.lit(0).alias("kind"),
            F.lit(None).cast("string").alias("control"),
        )
        .dropDuplicates()
    )
    timeline = points.unionByName(markers).unionByName(starts)
    ordered = Window.partitionBy("topic", "partition", "producer_id").orderBy("offset", "kind")
    behind = ordered.rowsBetween(Window.unboundedPreceding, -1)
    # "The first marker at or after this row" is asked as "the last marker
    # up to this row" in the reversed order: Spark computes a frame that
    # starts at the current row afresh for every row (quadratic in a
    # producer's records), a frame from the partition's start in one pass.
    ahead = (
        Window.partitionBy("topic", "partition", "producer_id")
        .orderBy(F.col("offset").desc(), F.col("kind").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    next_marker = F.last(F.when(F.col("kind") == 2, F.col("control")), ignorenulls=True).over(ahead)
    last_boundary = F.last(F.when(F.col("kind") != 1, F.col("kind")), ignorenulls=True).over(behind)
    fate = (
        F.when(next_marker == "commit", "committed")
        .when(next_marker == "abort", "aborted")
        .when(last_boundary == 0, "aborted")
    )
    return (
        timeline.withColumn("marker_fate", fate)
        .withColumn("next_marker_fate", F.when(next_marker == "commit", "committed").when(next_marker == "abort", "aborted"))
        .where(F.col("kind") == 1)
        .select("topic", "partition", "offset", "marker_fate", "next_marker_fate")
    )


def _next_end_txns(log: DataFrame, ends: DataFrame) -> DataFrame:
    """For each traced transactional record, the first EndTxn of its producer
    delivered to the broker after the record's Produce: the one the broker
    applies to it, whatever transaction the client meant that EndTxn for.

    One sort per producer (records and EndTxns on one timeline) instead of a
    range join. Columns: topic, partition, offset, then END_TXN_ATTRIBUTION
    prefixed `end_`.
    """
    ends = ends.where(
        F.col("delivered")
        & (F.col("response_error_code").isNull() | (F.col("response_error_code") == 0))
    )
    attribution = F.struct(*[F.col(c).alias(c) for c in END_TXN_ATTRIBUTION])
    records = log.where(F.col("produce_delivery_ns").isNotNull() & F.col("txn_id").isNotNull()).select(
        *TXN_KEY, "topic", "partition", "offset",
        F.col("produce_delivery_ns").alias("t"), F.lit(0).alias("kind"), F.lit(None).alias("end"),
    )
    end_points = ends.select(
        *TXN_KEY, F.lit(None).cast("string").alias("topic"), F.lit(None).cast("int").alias("partition"),
        F.lit(None).cast("long").alias("offset"), F.col("delivery_ns").alias("t"), F.lit(1).alias("kind"),
        attribution.alias("end"),
    )
    timeline = records.unionByName(end_points, allowMissingColumns=True)
    # The first EndTxn at or after each record, asked in the reversed order
    # as the last one up to it: one pass instead of a frame per row (see
    # _marker_fates). EndTxns delivered at the same instant are taken in
    # order of their attribution, so the choice does not depend on row order.
    ahead = (
        Window.partitionBy(*TXN_KEY)
        .orderBy(F.col("t").desc(), F.col("kind").desc(), F.col("end").desc())
        .rowsBetween(Window.unboundedPreceding, Window.currentRow)
    )
    nxt = timeline.withColumn("next_end", F.last("end", ignorenulls=True).over(ahead)).where(F.col("kind") == 0)
    return nxt.select(
        "topic", "partition", "offset", *[F.col(f"next_end.{c}").alias(f"end_{c}") for c in END_TXN_ATTRIBUTION]
    )


def _with_fates(log: DataFrame, fetched: DataFrame, traces: DataFrame, deciders: DataFrame,
                ends: DataFrame) -> DataFrame:
    marked = log.join(_marker_fates(log, fetched, traces), ["topic", "partition", "offset"], "left")
    by_order = marked.join(_next_end_txns(log, ends), ["topic", "partition", "offset"], "left")
    # Records only seen in a Fetch (no traced Produce) fall back to the EndTxn
    # that ended their broker-side transaction number.
    decided = by_order.join(
        deciders.select(
            *[F.col(f"decided_{c}") for c in (*TXN_KEY, "txn_broker")],
            *[F.col(f"end_{c}").alias(f"num_end_{c}") for c in END_TXN_ATTRIBUTION],
        ),
        [F.col(c) == F.col(f"decided_{c}") for c in (*TXN_KEY, "txn_broker")],
        "left",
    ).drop(*[f"decided_{c}" for c in (*TXN_KEY, "txn_broker")])
    for c in END_TXN_ATTRIBUTION:
        use_order = F.col("end_end_txn_commit").isNotNull()
        decided = decided.withColumn(
            f"end_{c}", F.when(use_order, F.col(f"end_{c}")).otherwise(F.col(f"num_end_{c}"))
        ).drop(f"num_end_{c}")
    end_fate = F.when(F.col("end_end_txn_commit"), "committed").when(~F.col("end_end_txn_commit"), "aborted")
    transactional = F.coalesce(
        F.col("transactional"), F.col("txn_broker").isNotNull() | (F.col("txn_id") != "")
    )
    # The EndTxn the broker applied (delivery order) decides a traced record;
    # the log's markers decide the rest. On a broker that writes a marker for
    # every transaction both agree; where it does not (a stale EndTxn ended
    # the transaction early, later records get no marker of their own) the
    # producer's next marker would belong to a later transaction.
    fate = F.coalesce(
        end_fate,
        F.col("marker_fate"),
        F.when(~transactional, F.lit("committed")),
        F.lit("unknown"),
    )
    return decided.withColumn("fate", fate).withColumn(
        "fate_source",
        F.when(end_fate.isNotNull(), "end_txn")
        .when(F.col("marker_fate").isNotNull(), "marker")
        .when(~transactional, "non-transactional")
        .otherwise(None),
    ).withColumn("key_long", F.col("key").cast("long")).withColumn("value_long", F.col("value").cast("long"))
