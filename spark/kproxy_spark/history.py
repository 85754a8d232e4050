"""Load a client history (JSON Lines, Jepsen-style operations) and flatten it.

The history format is the contract described in docs/analysis-checks.md and
DESIGN.md. Micro-op values are heterogeneous JSON arrays (``["send", k, v]``,
``["send", k, [offset, v]]``, ``["poll", {"k": [[o, v], ...]}]``), so the
operation's ``value`` is kept as raw JSON text and taken apart with Spark SQL
JSON functions here (the wire checks' sends). The history pass makes its own
input from the same text in Python, packed per operation and key
(kproxy_spark.checks.op_events): cheaper than these functions' three parses
and a row per micro-op.
"""

from __future__ import annotations

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.types import (
    ArrayType,
    LongType,
    MapType,
    StringType,
    StructField,
    StructType,
)

# A string-typed field that holds a JSON array or object keeps the raw JSON
# text, which is what lets one schema read every kind of operation.
HISTORY_SCHEMA = StructType(
    [
        StructField("index", LongType()),
        StructField("time", LongType()),
        StructField("process", LongType()),
        StructField("type", StringType()),
        StructField("f", StringType()),
        StructField("value", StringType()),
        StructField("error", StringType()),
    ]
)

_RAW_ARRAY = ArrayType(StringType())
_MOP_ARRAYS = ArrayType(ArrayType(StringType()))
_LONG_ARRAY = ArrayType(LongType())
_POLL_MAP = MapType(StringType(), ArrayType(ArrayType(LongType())))

#: Operation functions that carry send/poll micro-ops.
DATA_FS = ("send", "poll", "txn")
#: Operation functions that change what a process reads.
MEMBERSHIP_FS = ("assign", "subscribe")


def load_history(spark: SparkSession, path: str) -> DataFrame:
    """Read a JSON Lines history into one row per operation.

    Columns: index, time, process, type, f, value (raw JSON text), error.
    Lines that are not JSON objects are dropped rather than failing the run.
    """
    return (
        spark.read.schema(HISTORY_SCHEMA)
        .option("mode", "DROPMALFORMED")
        .json(path)
        .where(F.col("type").isNotNull() & F.col("f").isNotNull())
    )


def _integer_key(text: Column) -> Column:
    """The key as a long; a key that is not an integer fails the job.

    A null would silently drop the key's micro-ops from every check, and an
    aborted read on it would come out VALID. `kproxy analyze` refuses such a
    local history before Spark starts; this guards histories Spark opens
    itself (URLs, spark-submit).
    """
    key = text.try_cast("long")
    return F.when(key.isNull() & text.isNotNull(), F.raise_error(
        F.concat(F.lit("history key is not an integer (kproxy history import numbers named keys): "), text)
    )).otherwise(key)


def flatten_mops(ops: DataFrame, carry: tuple[str, ...] = ()) -> DataFrame:
    """One row per send micro-op and per polled record.

    Columns: index, time, process, type, f, mop_index, mop ('send'|'poll'),
    key, offset (null when unknown), value, pos (the record's position in its
    poll list for that key; 0 for sends), then the ``carry`` columns of the
    operation. A poll that returned nothing for a key yields no row; an
    invoked ``["poll"]`` yields none either.
    """
    mops = (
        ops.where(F.col("f").isin(*DATA_FS))
        .select(
            "index", "time", "process", "type", "f", *carry,
            # One parse of the value: each micro-op's elements stay raw JSON text.
            F.posexplode(F.from_json("value", _MOP_ARRAYS)).alias("mop_index", "parts"),
        )
        .withColumn("mop", F.get("parts", 0))
    )
    base = ["index", "time", "process", "type", "f", "mop_index", "mop", *carry]

    sends = mops.where(F.col("mop") == "send")
    send_arg = F.get(sends["parts"], 2)
    pair = F.from_json(send_arg, _LONG_ARRAY)
    is_pair = F.trim(send_arg).startswith("[")
    sends = sends.select(
        *base,
        _integer_key(F.get(sends["parts"], 1)).alias("key"),
        F.when(is_pair, F.get(pair, 0)).alias("offset"),
        F.when(is_pair, F.get(pair, 1)).otherwise(send_arg.try_cast("long")).alias("value"),
        F.lit(0).alias("pos"),
    )

    polls = (
        mops.where((F.col("mop") == "poll") & (F.size("parts") > 1))
        .select(*base, F.explode(F.from_json(F.get("parts", 1), _POLL_MAP)).alias("key_text", "pairs"))
        .select(*base, _integer_key(F.col("key_text")).alias("key"), F.posexplode("pairs").alias("pos", "pair"))
        .select(
            *base,
            "key",
            F.get("pair", 0).alias("offset"),
            F.get("pair", 1).alias("value"),
            F.col("pos").cast("int").alias("pos"),
        )
    )
    return sends.unionByName(polls)


def sends(mops: DataFrame) -> DataFrame:
    """Completed send micro-ops (any completion type: ok, info or fail)."""
    return mops.where((F.col("mop") == "send") & (F.col("type") != "invoke"))


def polled(mops: DataFrame) -> DataFrame:
    """Records returned by completed polls (any completion type)."""
    return mops.where((F.col("mop") == "poll") & (F.col("type") != "invoke") & F.col("value").isNotNull())


def key_partitions(ops: DataFrame) -> DataFrame:
    """Where each key lives, from ``create`` ops: key, topic, partition, index, time."""
    parts = F.from_json("value", _RAW_ARRAY)
    return ops.where((F.col("f") == "create") & (F.col("type") == "ok")).select(
        F.get(parts, 0).try_cast("long").alias("key"),
        F.get_json_object("value", "$[1]").alias("topic"),
        F.get(parts, 2).try_cast("int").alias("partition"),
        "index",
        "time",
    )
