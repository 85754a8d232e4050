"""Jepsen's Kafka queue checks over a client history, as Spark DataFrames.

``history_checks(ops)`` maps each anomaly name (Jepsen's names) to a
DataFrame of its cases; an empty DataFrame means none were found. See
docs/analysis-checks.md for each definition.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from spark.checks.abort_position import POSITIONS, abort_positions
from spark.checks.causes import CAUSES, with_causes
from spark.checks.contiguity import (
    internal_poll_pairs,
    read_neighbours,
    internal_send_pairs,
    nonmonotonic,
    poll_pairs,
    send_pairs,
    skips,
)
from spark.checks.cycles import cycle_checks
from spark.checks.orders import (
    by_index,
    by_value,
    representative_positions,
    duplicates,
    inconsistent_offsets,
    version_orders_from_mops,
    writer_of,
)
from spark.checks.summary import summary, summary_counts, summary_from
from spark.checks.visibility import (
    aborted_reads,
    lost_writes,
    precommitted_reads,
    unseen,
    unseen_by_key_over_time,
    unseen_over_time,
)
from spark.history import flatten_mops, membership_changes

#: Every name history_checks returns (cycle-search-incomplete only when the bound was hit).
ANOMALY_NAMES = (
    "inconsistent-offsets",
    "duplicate",
    "G1a",
    "lost-write",
    "unseen",
    "poll-skip",
    "nonmonotonic-poll",
    "nonmonotonic-send",
    "int-poll-skip",
    "int-send-skip",
    "int-nonmonotonic-poll",
    "int-nonmonotonic-send",
    "precommitted-read",
    "G0",
    "G1c",
    "abort-position",
)

#: Classifications rather than anomalies: reported, never a reason for invalid.
INFORMATIONAL = frozenset({"abort-position"})


def allowed_anomalies(subscribe: bool = False, ww_deps: bool = True) -> frozenset[str]:
    """Names Jepsen's checker tolerates for Kafka's model, given how the workload read.

    Sends inside a transaction interleave with other producers' writes
    (int-send-skip) and writes are never isolated (G0). With subscribe a
    rebalance may move a consumer, so poll-skip and nonmonotonic-poll are
    expected. With ww dependencies inferred from offsets, G1c cycles of the
    form T1 <ww T2 <wr T1 are normal.
    """
    allowed = {"int-send-skip", "G0"} | INFORMATIONAL
    if subscribe:
        allowed |= {"poll-skip", "nonmonotonic-poll"}
    if ww_deps:
        allowed |= {"G1c"}
    return frozenset(allowed)


def version_orders(ops: DataFrame) -> DataFrame:
    """key, offset, value, vo_index: each key's log as sends and polls observed it."""
    return version_orders_from_mops(flatten_mops(ops))


def history_checks(ops: DataFrame, cache: bool = True, names=None) -> dict[str, DataFrame]:
    """Run every history check over ``ops`` (as returned by ``load_history``).

    The DataFrames are lazy except the cycle search, which collects the
    collapsed dependency graph; ``names`` limits the result (and skips the
    cycle search unless G0 or G1c is named).
    """
    spark = ops.sparkSession
    mops = flatten_mops(ops)
    if cache:
        mops = mops.cache()
    vo = version_orders_from_mops(mops)
    if cache:
        vo = vo.cache()
    changes = membership_changes(ops)
    if cache:
        # Several checks build these same frames; Spark finds a cached frame
        # by its plan, so caching them here makes every check reuse them
        # instead of recomputing the aggregations and windows per check.
        changes.cache()
        by_value(vo).cache()
        by_index(vo).cache()
        representative_positions(vo).cache()
        writer_of(mops).cache()
        read_neighbours(mops, vo, changes).cache()

    int_polls = internal_poll_pairs(mops, vo)
    int_sends = internal_send_pairs(mops, vo)
    polls = poll_pairs(mops, vo, changes)
    sent = send_pairs(mops, vo, changes)

    checks = {
        "inconsistent-offsets": inconsistent_offsets(vo, mops),
        "duplicate": duplicates(vo),
        "G1a": aborted_reads(mops),
        "lost-write": lost_writes(mops, vo),
        "unseen": unseen(mops),
        "poll-skip": with_causes(skips(polls, vo, ["index", "key"]), mops, vo, changes, skip=True),
        "nonmonotonic-poll": with_causes(nonmonotonic(polls), mops, vo, changes, skip=False),
        "nonmonotonic-send": nonmonotonic(sent),
        "int-poll-skip": skips(int_polls, vo, ["index", "key", "prev_vo_index", "vo_index"]),
        "int-send-skip": skips(int_sends, vo, ["index", "key", "prev_vo_index", "vo_index"]),
        "int-nonmonotonic-poll": nonmonotonic(int_polls),
        "int-nonmonotonic-send": nonmonotonic(int_sends),
        "precommitted-read": precommitted_reads(mops),
        "abort-position": abort_positions(mops, vo, changes, ops),
    }
    if names is None or {"G0", "G1c"} & set(names):
        checks.update(cycle_checks(spark, mops, vo))
    if names is not None:
        checks = {name: df for name, df in checks.items() if name in names}
    return checks


__all__ = [
    "ANOMALY_NAMES",
    "CAUSES",
    "INFORMATIONAL",
    "POSITIONS",
    "allowed_anomalies",
    "history_checks",
    "summary",
    "summary_counts",
    "summary_from",
    "unseen_by_key_over_time",
    "unseen_over_time",
    "version_orders",
]
