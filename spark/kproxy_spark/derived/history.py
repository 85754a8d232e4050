"""The operations of docs/history.md, derived from an identified trace
(kproxy_spark.derived.identity): what each client did and was told.

* **Transactions.** The records a transactional producer's Produce requests
  carried, grouped by the client-side synthetic transaction number (per
  transactional id, producer id and epoch), make one `txn` operation. It
  completes with what the client's own EndTxn asked and was answered:
  commit answered without error `ok`; abort answered without error `fail`
  (`aborted`); an error, no answer or no EndTxn `info`.
* **Other sends.** The records of one Produce request of any other producer
  make one `send` operation: `ok` when every record was acknowledged, else
  `info` (the wire cannot prove a write did not land).
* **A send's outcome** is the best answer the client got for that record
  over its retries (a retry carries the same identity): the offset of the
  first acknowledgement, else none. Copies the proxy made are not the client's.
* **Polls.** Each Fetch response that delivered records to the application
  is one `poll` by the process of its connection: its data records, less what
  a read_committed client drops by the aborted-transactions list and what
  lies below the offset the request asked from (when the trace carries it).
  Each consumer connection subscribes first to every key it ever reads, so
  a rebalance's skips are tolerated as Jepsen tolerates them.
* **create** ops pin each key to its topic-partition.

Times are nanoseconds since the first traced event, on one clock for every
proxy (each proxy's monotonic clock moved onto the wall clock it recorded).
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from pyspark.sql import Column, DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql.window import Window

from kproxy.protocol.errors import ERROR_NAMES
from kproxy.testing.client_ids import FINAL_READER
from kproxy_spark.derived.identity import Keys, partition_key
from kproxy_spark.history import HISTORY_SCHEMA
from kproxy_spark.session import rows_frame
from kproxy_spark.traces import EXCHANGE, with_coalesced_ids
from kproxy_spark.wire.landings import (
    TXN_KEY,
    end_txns,
    fetched_records,
    produce_attempts,
)
from kproxy_spark.wire.summary import trace_summary
from kproxy_spark.wire.views import WireParts


def clock_offsets(traces: DataFrame) -> tuple[dict[str, int], int]:
    """Per proxy id, what moves its monotonic nanoseconds onto the wall clock, and the first event's
    time on that clock (one small job)."""
    rows = traces.groupBy(F.coalesce("proxy_id", F.lit("")).alias("proxy_id")).agg(
        F.min((F.col("wall_time") * 1e9).cast("long") - F.col("mono_ns")).alias("offset"),
        F.min("mono_ns").alias("first")).collect()
    offsets = {r["proxy_id"]: int(r["offset"] or 0) for r in rows}
    start = min((int(r["first"] or 0) + offsets[r["proxy_id"]] for r in rows), default=0)
    return offsets, start


def _on_one_clock(mono: Column, offsets: Mapping[str, int]) -> Column:
    shift = F.create_map(*[x for proxy, off in offsets.items() for x in (F.lit(proxy), F.lit(off))])
    return mono + F.coalesce(F.element_at(shift, F.coalesce(F.col("proxy_id"), F.lit(""))), F.lit(0))


def _error_name(code: Column) -> Column:
    names = F.create_map(*[x for c, name in sorted(ERROR_NAMES.items()) for x in (F.lit(c), F.lit(name))])
    return F.coalesce(F.element_at(names, code), code.cast("string"))


def client_sends(attempts: DataFrame, offsets: Mapping[str, int]) -> DataFrame:
    """One row per record a client sent, over its retries: where and when, and what it was told.

    A record is named by its identity (key, value) when its producer is
    idempotent, else by the request and position that carried it (such a
    record has no identity before the answer gives it an offset).
    """
    own = attempts.where((F.col("copy") == 0) & F.col("key_long").isNotNull()).withColumn(
        "t", _on_one_clock(F.col("mono_ns"), offsets)).withColumn(
        "t_done", _on_one_clock(F.coalesce("response_ns", "mono_ns"), offsets))
    identity = F.when(F.col("value_long").isNotNull(), F.concat_ws(
        "/", F.lit("id"), *TXN_KEY, "key_long", "value_long")).otherwise(F.concat_ws(
            "/", F.lit("at"), *EXCHANGE, "topic", "partition", "record_index"))
    first = F.struct("t", "correlation_id")
    acked = F.col("status") == "ok"
    return own.withColumn("send_id", identity).groupBy("send_id").agg(
        F.min_by(F.struct(*EXCHANGE), first).alias("first_exchange"),
        F.min_by("txn_client", first).alias("txn_client"),
        *[F.first(c).alias(c) for c in (*TXN_KEY, "key_long", "transactional", "producer_id")],
        F.min_by("record_index", first).alias("record_index"),
        F.min("t").alias("t"),
        F.max("t_done").alias("t_done"),
        F.first("value_long", ignorenulls=True).alias("identity"),
        F.min_by(F.when(acked, F.col("landed_offset")), F.when(acked, first)).alias("offset"),
        F.max(acked).alias("acked"),
        F.max_by(F.when(F.col("status") == "error", F.col("response_error")),
                 F.when(F.col("status") == "error", first)).alias("last_error"),
        F.max_by("status", first).alias("last_status"),
    ).withColumn(
        # Not idempotent and never acknowledged: no identity, so a value of its own that nothing reads.
        "value", F.coalesce("identity", "offset", -1 - F.abs(F.xxhash64("send_id")) % F.lit(1 << 40)),
    )


def _send_mop(done: bool) -> Column:
    pair = F.concat(F.lit("["), F.col("offset").cast("string"), F.lit(","), F.col("value").cast("string"), F.lit("]"))
    argument = F.when(F.col("offset").isNotNull(), pair).otherwise(F.col("value").cast("string")) if done \
        else F.col("value").cast("string")
    return F.concat(F.lit('["send",'), F.col("key_long").cast("string"), F.lit(","), argument, F.lit("]"))


def _mop_list(sorted_mops: Column) -> Column:
    return F.concat(F.lit("["), F.array_join(F.transform(sorted_mops, lambda m: m["mop"]), ","), F.lit("]"))


def _send_ops(sends: DataFrame, group: list[Column | str], process: Column) -> DataFrame:
    """Invoke and completion text of one operation per group of sends (type and error left to the caller)."""
    mop = F.struct("t", "key_long", "record_index", _send_mop(False).alias("mop"))
    done = F.struct("t", "key_long", "record_index", _send_mop(True).alias("mop"))
    return sends.groupBy(*group).agg(
        F.first(process).alias("label"),
        F.min("t").alias("t_invoke"),
        F.max("t_done").alias("t_sends_done"),
        _mop_list(F.array_sort(F.collect_list(mop))).alias("invoke_value"),
        _mop_list(F.array_sort(F.collect_list(done))).alias("done_value"),
        F.min(F.col("acked").cast("int")).alias("all_acked"),
        F.first(F.when(~F.col("acked"), F.coalesce(_error_name(F.col("last_error")), F.col("last_status"))),
                ignorenulls=True).alias("send_error"),
    )


def transaction_ops(sends: DataFrame, ends: DataFrame, offsets: Mapping[str, int]) -> DataFrame:
    """One `txn` operation per client transaction, completed by the client's own EndTxn."""
    txn = [*TXN_KEY, "txn_client"]
    ops = _send_ops(sends.where(F.col("transactional") & F.col("txn_client").isNotNull()), txn,
                    F.concat_ws("/", F.lit("txn"), "txn_id", "txn_pid"))
    # The client's last EndTxn for the transaction (a retry repeats it); copies the proxy made are not the client's.
    last = Window.partitionBy(*txn).orderBy(F.col("mono_ns").desc())
    own_ends = ends.where((F.col("copy") == 0) & F.col("txn_client").isNotNull()).withColumn(
        "_n", F.row_number().over(last)).where(F.col("_n") == 1).select(
        *txn, "end_txn_commit", "response_error_code",
        _on_one_clock(F.col("response_ns"), offsets).alias("t_end"))
    joined = ops.join(own_ends, txn, "left")
    answered_ok = F.col("t_end").isNotNull() & (F.coalesce("response_error_code", F.lit(0)) == 0)
    kind = (F.when(answered_ok & F.col("end_txn_commit"), "ok")
            .when(answered_ok & ~F.col("end_txn_commit"), "fail").otherwise("info"))
    error = (F.when(answered_ok & F.col("end_txn_commit"), F.lit(None).cast("string"))
             .when(answered_ok, "aborted")
             .when(F.col("end_txn_commit").isNull(), "no-end-txn")
             .when(F.col("t_end").isNull(), "no-response")
             .otherwise(_error_name(F.col("response_error_code"))))
    return joined.select("label", "t_invoke", F.coalesce("t_end", "t_sends_done").alias("t_done"),
                         F.lit("txn").alias("f"), "invoke_value", "done_value", kind.alias("type"), error.alias("error"))


def plain_send_ops(sends: DataFrame) -> DataFrame:
    """One `send` operation per Produce request of a producer that is not transactional."""
    producer = F.when(F.col("producer_id") >= 0, F.concat_ws("/", F.lit("producer"), "first_exchange.proxy_id",
                                                             "producer_id")).otherwise(
        F.concat_ws("/", F.lit("conn"), "first_exchange.proxy_id", "first_exchange.conn_id"))
    ops = _send_ops(sends.where(~F.coalesce("transactional", F.lit(False))), ["first_exchange"], producer)
    ok = F.col("all_acked") == 1
    return ops.select("label", "t_invoke", F.col("t_sends_done").alias("t_done"), F.lit("send").alias("f"),
                      "invoke_value", "done_value", F.when(ok, "ok").otherwise("info").alias("type"),
                      F.when(~ok, F.coalesce("send_error", F.lit("no-response"))).alias("error"))


def fetch_positions(traces: DataFrame) -> DataFrame:
    """What each Fetch request asked: per partition the offset to read from, and the isolation level."""
    requests = with_coalesced_ids(traces).where(
        (F.col("api") == "fetch") & (F.col("direction") == "request") & F.col("partitions").isNotNull())
    return requests.select(*EXCHANGE, "mono_ns", "isolation_level", F.explode("partitions").alias("p")).select(
        *EXCHANGE, F.col("mono_ns").alias("asked_ns"), F.col("p.topic").alias("topic"),
        F.col("p.partition").alias("partition"),
        F.col("p.fetch_offset").alias("fetch_offset"), F.col("isolation_level").alias("asked_isolation"))


def delivered_reads(fetched: DataFrame, positions: DataFrame, offsets: Mapping[str, int]) -> DataFrame:
    """The data records each Fetch response delivered to its application (the client's own responses only).

    Where the request is traced with its position and isolation level, records below the position (a
    batch starts before it) are not delivered, and the level decides whether the aborted list drops records.
    """
    fetched = fetched.join(positions, [*EXCHANGE, "topic", "partition"], "left")
    committed = F.coalesce(F.col("asked_isolation") == 1, F.col("read_committed"))
    dropped = committed & F.coalesce("listed_aborted", F.lit(False))
    below = F.coalesce(F.col("offset") < F.col("fetch_offset"), F.lit(False))
    return fetched.where((F.col("copy") == 0) & F.col("control").isNull() & F.col("key_long").isNotNull()
                         & F.col("value_long").isNotNull() & ~dropped & ~below).select(
        *EXCHANGE, "client_id", "key_long", "value_long", "offset",
        _on_one_clock(F.col("mono_ns") - (F.coalesce("latency_ms", F.lit(0.0)) * 1e6).cast("long"),
                      offsets).alias("t_invoke"),
        _on_one_clock(F.col("mono_ns"), offsets).alias("t_done"),
    )


def poll_ops(reads: DataFrame) -> DataFrame:
    """One `poll` per Fetch response that delivered records, by its connection's process."""
    label = F.concat_ws("/", F.lit("consumer"), "proxy_id", "conn_id")
    per_key = reads.groupBy(*EXCHANGE, "key_long").agg(
        F.min("t_invoke").alias("t_invoke"), F.max("t_done").alias("t_done"),
        F.array_sort(F.collect_list(F.array("offset", "value_long"))).alias("pairs"))
    polls = per_key.groupBy(*EXCHANGE).agg(
        F.min("t_invoke").alias("t_invoke"), F.max("t_done").alias("t_done"),
        F.map_from_entries(F.collect_list(F.struct(F.col("key_long").cast("string"), "pairs"))).alias("read"))
    return polls.select(
        label.alias("label"), "t_invoke", "t_done", F.lit("poll").alias("f"),
        F.lit('[["poll"]]').alias("invoke_value"),
        F.concat(F.lit('[["poll",'), F.to_json("read"), F.lit("]]")).alias("done_value"),
        F.lit("ok").alias("type"), F.lit(None).cast("string").alias("error"))


def _final_reader(client_id: Column) -> Column:
    """The final reader of `kproxy test` (FINAL_READER), or of kproxy's own workload (`PREFIX-final-pN`)."""
    return F.coalesce((client_id == FINAL_READER) | client_id.rlike(r"-final-p\d+$"), F.lit(False))


def subscribe_ops(reads: DataFrame) -> DataFrame:
    """Each consumer connection subscribes, just before its first poll, to every key it reads; a final
    reader's (FINAL_READER client id) assigns them instead, which is how the report knows the history
    ends with final reads."""
    label = F.concat_ws("/", F.lit("consumer"), "proxy_id", "conn_id")
    return reads.groupBy(label.alias("label")).agg(
        (F.min("t_invoke") - 1).alias("t_invoke"), F.to_json(F.array_sort(F.collect_set("key_long"))).alias("keys"),
        F.max(_final_reader(F.col("client_id"))).alias("final"),
    ).select("label", "t_invoke", F.col("t_invoke").alias("t_done"),
             F.when(F.col("final"), "assign").otherwise("subscribe").alias("f"),
             F.col("keys").alias("invoke_value"), F.col("keys").alias("done_value"), F.lit("ok").alias("type"),
             F.lit(None).cast("string").alias("error"))


def rewind_ops(positions: DataFrame, keys: Keys, offsets: Mapping[str, int]) -> DataFrame:
    """A consumer that asks a partition again from before where it last asked was repositioned by its
    client (a seek: back to the committed offset after an aborted transaction, or a re-assignment). Each
    such Fetch gets a `subscribe` to that key just before it, so the checks explain the read that goes
    back as a re-assignment, as they do for a client-written history."""
    key = partition_key(keys, F.col("topic"), F.col("partition"))
    before = Window.partitionBy("proxy_id", "conn_id", "topic", "partition").orderBy("asked_ns", "correlation_id")
    asked = positions.where(F.col("copy") == 0).withColumn("previous", F.lag("fetch_offset").over(before))
    back = asked.where(F.col("fetch_offset") < F.col("previous")).select(
        F.concat_ws("/", F.lit("consumer"), "proxy_id", "conn_id").alias("label"),
        (_on_one_clock(F.col("asked_ns"), offsets) - 2).alias("t_invoke"),
        F.to_json(F.array(key)).alias("keys"), key.alias("key")).where(F.col("key").isNotNull())
    return back.select("label", "t_invoke", F.col("t_invoke").alias("t_done"), F.lit("subscribe").alias("f"),
                       F.col("keys").alias("invoke_value"), F.col("keys").alias("done_value"),
                       F.lit("ok").alias("type"), F.lit(None).cast("string").alias("error"))


def _rows(ops: DataFrame) -> DataFrame:
    """Each operation as its invoke row and its completion row; `phase` orders the two."""
    invoke = ops.select("label", F.col("t_invoke").alias("t"), F.lit(0).alias("phase"), "f",
                        F.lit("invoke").alias("type"), F.col("invoke_value").alias("value"),
                        F.lit(None).cast("string").alias("error"))
    done = ops.select("label", F.greatest("t_done", "t_invoke").alias("t"), F.lit(1).alias("phase"), "f", "type",
                      F.col("done_value").alias("value"), "error")
    return invoke.unionByName(done)


def create_ops(spark: SparkSession, keys: Keys) -> DataFrame:
    """`create` ops, one per key, before everything else."""
    rows = [(-1, 0, "ok", "create", json.dumps([key, topic, partition]), None)
            for key, (topic, partition) in enumerate(keys.partitions)]
    columns = [("t", "int64"), ("phase", "int32"), ("type", "string"), ("f", "string"), ("value", "string"),
               ("error", "string")]
    return rows_frame(spark, rows, columns).withColumn("label", F.lit("~create"))


def derive_history(spark: SparkSession, traces: DataFrame, keys: Keys, isolation: str = "auto",
                   clock: tuple[dict[str, int], int] | None = None, parts: WireParts | None = None) -> DataFrame:
    """The history the identified `traces` tell: a frame of HISTORY_SCHEMA, in time order, indexed 0, 1, ...
    `clock`: clock_offsets(traces), and `parts`: the wire views of the same traces
    (kproxy_spark.wire.views.wire_parts), when the caller has them."""
    offsets, start = clock if clock is not None else clock_offsets(traces)
    if parts is None:
        summary = trace_summary(traces)
        parts = WireParts(produce_attempts(traces), fetched_records(traces, isolation, summary), end_txns(traces),
                          summary)
    sends = client_sends(parts.attempts, offsets)
    positions = fetch_positions(traces)
    reads = delivered_reads(parts.fetched, positions, offsets)
    ops = (transaction_ops(sends, parts.ends, offsets)
           .unionByName(plain_send_ops(sends))
           .unionByName(poll_ops(reads))
           .unionByName(subscribe_ops(reads))
           .unionByName(rewind_ops(positions, keys, offsets)))
    rows = _rows(ops)
    rows = rows.withColumn("t", F.col("t") - F.lit(start)).unionByName(create_ops(spark, keys))
    # Processes numbered by first appearance; every operation of one process in time order.
    first_seen = rows.groupBy("label").agg(F.min(F.struct("t", "phase")).alias("first"))
    process = first_seen.select("label", (F.row_number().over(Window.orderBy("first", "label")) - 1).alias("process"))
    ordered = rows.join(process, "label")
    index = F.row_number().over(Window.orderBy("t", "phase", "process")) - 1
    return ordered.select(
        index.cast("long").alias("index"), F.greatest(F.col("t"), F.lit(0)).cast("long").alias("time"),
        F.when(F.col("f") == "create", F.lit(0)).otherwise(F.col("process")).cast("long").alias("process"),
        "type", "f", "value", "error",
    ).select(*[F.col(f.name).cast(f.dataType) for f in HISTORY_SCHEMA.fields])
