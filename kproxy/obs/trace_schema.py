"""The trace event schema, defined once.

The trace writer (kproxy.obs.trace) emits events with exactly these fields,
in this order (a segment file's columns and the fast path's rows follow it);
the Spark jobs (spark/) read traces with `spark_schema()`, built from the same
definition. docs/traces.md describes each field. Bump SCHEMA_VERSION on any
change that is not a pure addition of a nullable field.

Types are a tiny neutral vocabulary so this module imports nothing heavy:
"string", "long", "int", "double", "boolean", ("array", T) and
("struct", FIELDS) where FIELDS is a tuple of Field.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

SCHEMA_VERSION = 6
# Versions the readers still accept: 1 had no close events, 2 carried decoded
# records in the event, 3 carries batch headers and points at the raw batches
# in a side file, 4 has 3's fields and adds the fixed-layout segment file
# (kproxy/obs/trace_segments.py: columns in EVENT order, nested fields as
# JSON text) beside JSON Lines and Parquet, 5 has 4's fields and lets a
# segment store a nested column's repeated texts once (a dictionary block).
# Nullable fields added since (isolation_level, group_id, a partition's
# fetch_offset and committed_offset) kept version 5: a file written before
# them lacks them, and every reader reads them as null. 6 has 5's fields and
# adds `repeats` and its companions: an event may stand for several
# identical idle Fetch exchanges (kproxy/obs/trace_fold.py), which changes
# what counting events means, so a version-5 reader must refuse it.
READABLE_VERSIONS = (1, 2, 3, 4, 5, 6)


def unreadable_version(version: Any) -> str | None:
    """Why a trace written under schema `version` cannot be read here, or None if it can.

    A newer writer's trace may lay out or mean its fields differently: reading
    it as an older one would be silently wrong, so every reader refuses it.
    """
    if type(version) is int and version in READABLE_VERSIONS:
        return None
    return (f"trace schema version {version!r} is not one this kproxy reads (it reads versions "
            f"{', '.join(map(str, READABLE_VERSIONS))}); read it with the kproxy that wrote it, or a newer one")


@dataclass(frozen=True)
class Field:
    name: str
    type: Any
    doc: str


ABORTED_TXN = (
    Field("producer_id", "long", "producer whose transaction was aborted"),
    Field("first_offset", "long", "first offset of the aborted transaction"),
)

RECORD = (
    Field("offset", "long", "absolute offset; null in a Produce request (not assigned yet)"),
    Field("key", "string", "record key: UTF-8 text, or 'b64:' + base64 when not valid UTF-8; null if none"),
    Field("value", "string", "record value, encoded like key"),
    Field("control", "string", "'commit' or 'abort' for a control record (transaction marker), 'unknown' for a control record of another type, else null"),
    Field("producer_id", "long", "producer id of the record's batch"),
    Field("producer_epoch", "int", "producer epoch of the record's batch"),
    Field("sequence", "int", "base sequence + offset delta (idempotent producers), else -1"),
    Field("transactional", "boolean", "the record's batch is transactional"),
)

BATCH = (
    Field("base_offset", "long", "batch base offset (0-based in a Produce request, absolute in a Fetch response)"),
    Field("batch_length", "int", "batch length field (bytes after the length field)"),
    Field("record_count", "int", "record count from the batch header"),
    Field("last_offset_delta", "int", "last offset delta"),
    Field("producer_id", "long", "producer id (-1: none)"),
    Field("producer_epoch", "int", "producer epoch"),
    Field("base_sequence", "int", "base sequence (-1: none)"),
    Field("compression", "string", "none, gzip, snappy, lz4, zstd or unknown"),
    Field("transactional", "boolean", "transactional attribute"),
    Field("control", "boolean", "control attribute (a transaction marker batch)"),
    Field("marker", "string", "control batches: 'commit', 'abort' or 'unknown'; else null"),
)

PARTITION = (
    Field("topic", "string", "topic name (or topic id as text when only the id is on the wire)"),
    Field("partition", "int", "partition index"),
    Field("error_code", "int", "partition error code (responses)"),
    Field("base_offset", "long", "Produce response: offset assigned to the first record"),
    Field("high_watermark", "long", "Fetch response: high watermark"),
    Field("last_stable_offset", "long", "Fetch response: last stable offset"),
    Field("log_start_offset", "long", "log start offset where the response carries it"),
    Field("aborted_transactions", ("array", ("struct", ABORTED_TXN)), "Fetch response: aborted transactions list"),
    Field("compression", "string", "codec of the first batch: none, gzip, snappy, lz4, zstd"),
    Field("records", ("array", ("struct", RECORD)), "records, decompressed, with absolute offsets where known; "
          "version 3: null on disk, filled by readers from the side file"),
    Field("batches", ("array", ("struct", BATCH)), "version 3: the header of every complete record batch, read in place"),
    Field("records_file", "string", "version 3: side file (name in the event file's directory) holding the raw record batches"),
    Field("records_offset", "long", "version 3: where they start in records_file"),
    Field("records_length", "long", "version 3: their length in bytes"),
    Field("fetch_offset", "long", "Fetch request: the offset it asked to read from (an incremental fetch "
          "session request lists only the partitions whose position changed)"),
    Field("committed_offset", "long", "OffsetCommit and TxnOffsetCommit request: the offset it commits"),
)

IN_FLIGHT = (
    Field("conn_id", "long", "connection the request arrived on (a ghost link's entries name their client's)"),
    Field("correlation_id", "int", "the client's correlation id"),
    Field("copy", "int", "0 for the original; 1..n for a duplicate copy on a ghost link"),
    Field("api", "string", "API name"),
    Field("api_key", "int", "API key"),
    Field("api_version", "int", "API version"),
    Field("state", "string", "where the request was: not_sent, delayed, held, dropped, awaiting_broker, responding, "
          "response_unsent, response_dropped (docs/traces.md)"),
)

EVENT = (
    Field("schema_version", "int", "SCHEMA_VERSION of the writer"),
    Field("wall_time", "double", "Unix time in seconds when the event happened"),
    Field("mono_ns", "long", "monotonic clock in nanoseconds (orders events of one proxy process)"),
    Field("proxy_id", "string", "id of the proxy instance (random per process unless set)"),
    Field("conn_id", "long", "client connection id, unique within a proxy instance; ghost deliveries use their own"),
    Field("client_addr", "string", "client host:port"),
    Field("broker_id", "int", "upstream broker node id the connection is bound to (-1: bootstrap)"),
    Field("direction", "string", "'request' (client to broker), 'response' (broker to client) or 'close' (the connection closed)"),
    Field("api", "string", "API name, e.g. produce, fetch, end_txn"),
    Field("api_key", "int", "API key"),
    Field("api_version", "int", "API version"),
    Field("correlation_id", "int", "the client's correlation id (the proxy's own on ghost deliveries)"),
    Field("client_id", "string", "client id from the request header"),
    Field("size", "long", "frame size in bytes, without the 4-byte length prefix"),
    Field("latency_ms", "double", "responses: time from request arrival to response sent to client"),
    Field("upstream_latency_ms", "double", "responses: time from delivery to the broker to its response"),
    Field("error_code", "int", "responses: first non-zero error code found, else 0"),
    Field("error_codes", ("array", "int"), "responses: every distinct non-zero error code found"),
    Field("transactional_id", "string", "transactional id, when the request carries or implies one"),
    Field("producer_id", "long", "producer id, when known"),
    Field("producer_epoch", "int", "producer epoch, when known"),
    Field("txn_client", "long", "client-side synthetic transaction number at arrival"),
    Field("txn_broker", "long", "broker-side synthetic transaction number at delivery"),
    Field("hazard", "string", "hazard kind at delivery: stale_end_txn, late_produce, fenced; else null"),
    Field("end_txn_commit", "boolean", "EndTxn: true for commit, false for abort"),
    Field("rule", "string", "id of the fault rule applied, else null"),
    Field("action", "string", "fault action applied, else null"),
    Field("outcome", "string", "delivered, delayed, held, duplicated, dropped, answered (by the proxy), refused (guard), ghost, rewritten"),
    Field("copy", "int", "0 for the original; 1..n for duplicates delivered by the proxy"),
    Field("partitions", ("array", ("struct", PARTITION)), "level 'records': per-partition records and offsets "
          "(Produce, Fetch responses), positions (Fetch requests), committed offsets and their errors "
          "(OffsetCommit, TxnOffsetCommit); else null"),
    Field("close_reason", "string", "close events: why the connection closed (see docs/traces.md); else null"),
    Field("in_flight", ("array", ("struct", IN_FLIGHT)), "close events: requests the client had no answer to when it closed; else null"),
    Field("upstream_partitions", ("array", ("struct", PARTITION)),
          "level 'records', a Fetch response a rule rewrote: the partitions as the broker sent them; else null"),
    Field("isolation_level", "int", "Fetch request v4+: 0 read_uncommitted, 1 read_committed; else null"),
    Field("group_id", "string", "request of a group API (OffsetCommit, TxnOffsetCommit, AddOffsetsToTxn, "
          "OffsetFetch, JoinGroup, SyncGroup, Heartbeat, LeaveGroup, ConsumerGroupHeartbeat): its group id; else null"),
    Field("repeats", "int", "a folded idle Fetch exchange (its request and its response): how many identical "
          "exchanges in a row the event stands for, 2 or more, the last of which it is; null: one"),
    Field("first_wall_time", "double", "a folded exchange: wall_time of the first exchange's event of the same direction"),
    Field("first_mono_ns", "long", "a folded exchange: mono_ns of the first exchange's event of the same direction"),
    Field("first_correlation_id", "int", "a folded exchange: the first exchange's correlation id (they run up to "
          "correlation_id one by one)"),
    Field("repeat_latencies_ms", ("array", "double"), "a folded exchange's response: latency_ms of each exchange "
          "it stands for, in order (the last equals latency_ms)"),
    Field("repeat_upstream_latencies_ms", ("array", "double"), "a folded exchange's response: upstream_latency_ms "
          "of each exchange it stands for, in order; null when each equals its latency_ms (requests forwarded on "
          "arrival)"),
)

FIELD_NAMES = tuple(f.name for f in EVENT)


def _spark_type(t: Any):  # noqa: ANN202 - pyspark imported lazily
    from pyspark.sql import types as T

    simple = {
        "string": T.StringType(),
        "long": T.LongType(),
        "int": T.IntegerType(),
        "double": T.DoubleType(),
        "boolean": T.BooleanType(),
    }
    if isinstance(t, str):
        return simple[t]
    kind, inner = t
    if kind == "array":
        return T.ArrayType(_spark_type(inner), True)
    if kind == "struct":
        return T.StructType([T.StructField(f.name, _spark_type(f.type), True) for f in inner])
    raise ValueError(f"unknown schema type {t!r}")


def spark_type(t: Any):  # noqa: ANN201 - pyspark imported lazily
    """The Spark type of one schema type (a field's `type`)."""
    return _spark_type(t)


def spark_schema():  # noqa: ANN201
    """The explicit Spark schema for reading traces."""
    return _spark_type(("struct", EVENT))


def arrow_schema():  # noqa: ANN201
    """The same schema as a pyarrow schema (Parquet traces)."""
    import pyarrow as pa

    simple = {"string": pa.string(), "long": pa.int64(), "int": pa.int32(), "double": pa.float64(), "boolean": pa.bool_()}

    def conv(t: Any):  # noqa: ANN202
        if isinstance(t, str):
            return simple[t]
        kind, inner = t
        if kind == "array":
            return pa.list_(conv(inner))
        return pa.struct([pa.field(f.name, conv(f.type)) for f in inner])

    return pa.schema([pa.field(f.name, conv(f.type)) for f in EVENT])
