"""The frames every wire check reads, each computed once per analysis.

`wire_views` builds them from the history's operations and the traces;
the checks and tables of kproxy_spark.wire.registry take the WireViews and
nothing else.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy_spark.history import flatten_mops, key_partitions, sends
from kproxy_spark.traces import EXCHANGE, rule_removed_records
from kproxy_spark.wire.landings import (
    end_txns,
    fetched_records,
    landings,
    produce_attempts,
)
from kproxy_spark.wire.summary import TraceSummary, trace_summary

#: The columns of kproxy_spark.wire.landings.fetched_records that the wire checks read.
FETCHED_COLUMNS = (
    *EXCHANGE, "mono_ns", "latency_ms", "client_id", "rule", "action", "topic", "partition", "offset", "key", "value",
    "key_long", "value_long", "control", "producer_id", "transactional", "last_stable_offset",
    "aborted_transactions", "read_committed", "rewritten", "listed_aborted", "upstream_listed_aborted", "past_lso",
    "upstream_past_lso",
)

#: A gap wider than this in one response is read as this many offsets: a
#: compacted or truncated range says nothing more per offset, and the
#: explode must stay bounded.
MAX_GAP = 1000


def history_sends(ops: DataFrame) -> DataFrame:
    """Completed send micro-ops with the key's topic/partition (from `create`
    ops, when the history has them) and the op's error."""
    mops = sends(flatten_mops(ops))
    errors = ops.select(F.col("index").alias("_index"), F.col("error"))
    where = key_partitions(ops).select(
        "key", F.col("topic").alias("key_topic"), F.col("partition").alias("key_partition")
    ).dropDuplicates(["key"])
    return (
        mops.join(errors, mops["index"] == errors["_index"], "left")
        .drop("_index")
        .join(where, "key", "left")
    )


@dataclass(frozen=True)
class WireViews:
    """What the checks read.

    ops, traces: the inputs. Kept (computed once, by the job that collects
    the checks): sent: history_sends; attempts: every Produce attempt of a
    record (kproxy_spark.wire.landings.produce_attempts); fetched: every
    record a Fetch returned (FETCHED_COLUMNS); ends: every EndTxn; log:
    every record that landed, with its fate (landings). The derived frames
    below are built once per analysis, for the checks and the facts that
    read them alike (building a frame's plan is most of the wire phase's
    driver time on a small input). held: where the releases of the rows
    kept here go (the caller's list).
    """

    ops: DataFrame
    traces: DataFrame
    sent: DataFrame
    attempts: DataFrame
    fetched: DataFrame
    ends: DataFrame
    log: DataFrame
    summary: TraceSummary
    held: list | None = None
    _shared: dict = field(default_factory=dict, compare=False, repr=False)

    def keep(self, frame: DataFrame) -> DataFrame:
        """`frame` computed once by the job that collects the checks, its plan cut off: a frame several
        checks build on (or one check several times) is otherwise planned, optimised and computed once
        per use (the exactly-once check's offset commits: 1.9 s -> 1.1 s of a small analysis)."""
        from kproxy_spark.session import keep

        return keep(frame, self.held)

    def shared(self, build: Callable[[WireViews], DataFrame]) -> DataFrame:
        """build(self), built once per analysis and kept (`keep`), for the checks that share it."""
        if build not in self._shared:
            self._shared[build] = self.keep(build(self))
        return self._shared[build]

    @cached_property
    def served(self) -> DataFrame:
        """Data records served to read_committed fetches, with their fate in
        the log. A broker is judged by its own log: where the trace shows the
        producer's next marker after the record, that marker is its fate here
        (not an aborted-transactions entry, which is what is being judged).
        end_proxy_id / end_delivery_ns: where and when the EndTxn that ended
        the record's transaction reached the broker, when traced."""
        fates = self.log.select("topic", "partition", "offset",
                                F.coalesce("next_marker_fate", "fate").alias("fate"), "fate_source",
                                "end_proxy_id", "end_delivery_ns")
        return self.keep(self.fetched.where(F.col("read_committed") & F.col("control").isNull()).join(
            fates, ["topic", "partition", "offset"]))

    @cached_property
    def left_out(self) -> DataFrame:
        """Per record: committed data records a read_committed Fetch response
        skipped over, inside a gap between two offsets it did serve (responses
        a rule rewrote are left to the rule's own `removed-by-rule`)."""
        parts = self.fetched.where(F.col("read_committed") & ~F.coalesce("rewritten", F.lit(False))).groupBy(
            *EXCHANGE, "topic", "partition").agg(
            F.min("mono_ns").alias("mono_ns"), F.first("client_id").alias("client_id"),
            F.first("last_stable_offset").alias("last_stable_offset"),
            F.first("rule", ignorenulls=True).alias("rule"), F.first("action", ignorenulls=True).alias("action"),
            F.array_sort(F.collect_set("offset")).alias("served"))
        served = F.col("served")
        gaps = F.when(F.size(served) >= 2, F.flatten(F.transform(
            F.sequence(F.lit(1), F.size(served) - 1),
            lambda i: F.when(served[i] - served[i - 1] > 1,
                             F.sequence(served[i - 1] + 1, F.least(served[i] - 1, served[i - 1] + MAX_GAP)))
            .otherwise(F.array().cast("array<bigint>")),
        ))).otherwise(F.array().cast("array<bigint>"))
        missing = parts.select(*EXCHANGE, "topic", "partition", "mono_ns", "client_id", "last_stable_offset", "rule",
                               "action", F.explode(gaps).alias("offset"))
        committed = self.log.where(F.col("key_long").isNotNull()).select(
            "topic", "partition", "offset", "key_long", "value_long", "producer_id",
            F.coalesce("next_marker_fate", "fate").alias("fate"))
        return self.keep(missing.join(committed, ["topic", "partition", "offset"]).where(F.col("fate") == "committed"))

    @property
    def request_apis(self) -> frozenset[str]:
        """The APIs of the requests in the traces."""
        return self.summary.request_apis

    @cached_property
    def removed(self) -> DataFrame:
        """Records a rule took out of a Fetch response (kproxy_spark.traces.rule_removed_records)."""
        return rule_removed_records(self.traces)


@dataclass(frozen=True)
class WireParts:
    """The views that read the traces alone (no history), kept: a history derived from the same
    traces (kproxy_spark.derived) reads them too, so they are built once for both."""

    attempts: DataFrame
    fetched: DataFrame
    ends: DataFrame
    summary: TraceSummary


def _keeper(held: list | None):
    from kproxy_spark.session import keep as keep_rows
    from kproxy_spark.session import one_partition

    def keep(frame: DataFrame) -> DataFrame:
        return keep_rows(one_partition(frame, joined=True), held)

    return keep


def wire_parts(traces: DataFrame, isolation: str = "auto", held: list | None = None) -> WireParts:
    """produce_attempts, fetched_records (FETCHED_COLUMNS) and end_txns, kept (releases to `held`), and
    the traces' summary (one small job)."""
    keep = _keeper(held)
    summary = trace_summary(traces)
    # Only the columns the checks read: a Fetch record carries every column
    # of its event, and at a million operations the whole width no longer
    # fits in memory.
    return WireParts(keep(produce_attempts(traces)),
                     keep(fetched_records(traces, isolation, summary).select(*FETCHED_COLUMNS)),
                     keep(end_txns(traces)), summary)


def wire_views(ops: DataFrame, traces: DataFrame, isolation: str = "auto", held: list | None = None,
               parts: WireParts | None = None) -> WireViews:
    """history_sends, produce_attempts, fetched_records (FETCHED_COLUMNS),
    end_txns and landings, kept; their releases go to `held`, for the caller:
    analyses that share a session must not clear each other's rows.
    `isolation` says how to tell read_committed fetches
    (kproxy_spark.wire.landings.fetched_records). `parts`: wire_parts(traces), when the caller holds them."""
    keep = _keeper(held)
    sent = keep(history_sends(ops))
    if parts is None:
        parts = wire_parts(traces, isolation, held)
    attempts, fetched, ends = parts.attempts, parts.fetched, parts.ends
    log = keep(landings(traces, isolation, attempts=attempts, fetched=fetched, ends=ends))
    return WireViews(ops, traces, sent, attempts, fetched, ends, log, parts.summary, held)
