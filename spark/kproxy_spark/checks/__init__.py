"""Jepsen's Kafka queue checks over a client history.

``history_checks(ops)`` maps each anomaly name (Jepsen's names) to the list
of its cases (dicts); an empty list means none were found. The per-key
checks run in one grouped pass (kproxy_spark.checks.keypass); the cycle search runs
on the driver over what that pass's edges leave after pruning. See
docs/analysis-checks.md for each definition.
"""

from __future__ import annotations

from pyspark.sql import DataFrame

from kproxy_spark.checks.causes import CAUSES
from kproxy_spark.checks.cycles import cycle_checks
from kproxy_spark.checks.kernel import KEY_CHECKS
from kproxy_spark.checks.keypass import PassResult, run_pass, version_orders
from kproxy_spark.checks.abort_position import POSITIONS
from kproxy_spark.checks.summary import summary, summary_counts
from kproxy_spark.checks.visibility import running_unseen

#: Every name history_checks returns (the cycle classes' *-cycle-exists and
#: cycle-search-incomplete only when the search bound was hit).
ANOMALY_NAMES = (*KEY_CHECKS, "G0", "G1c")

def allowed_anomalies(subscribe: bool = False, ww_deps: bool = True) -> frozenset[str]:
    """Names Jepsen's checker tolerates for Kafka's model, given how the workload read.

    Sends inside a transaction interleave with other producers' writes
    (int-send-skip) and writes are never isolated (G0). With subscribe a
    rebalance may move a consumer, so poll-skip and nonmonotonic-poll are
    expected. With ww dependencies inferred from offsets, G1c cycles of the
    form T1 <ww T2 <wr T1 are normal.
    """
    allowed = {"int-send-skip", "G0", "G0-cycle-exists"}
    if subscribe:
        allowed |= {"poll-skip", "nonmonotonic-poll"}
    if ww_deps:
        allowed |= {"G1c", "G1c-cycle-exists"}
    return frozenset(allowed)


def cases_of(result: PassResult) -> dict[str, list[dict]]:
    """Every history check's cases from a collected pass, the cycles included."""
    return {**result.cases, **cycle_checks(result.edge_src, result.edge_dst, result.edge_ww, result.explain)}


def history_checks(ops: DataFrame, names=None, ww_deps: bool = True) -> dict[str, list[dict]]:  # noqa: ANN001
    """Run every history check over ``ops`` (as returned by ``load_history``).

    One Spark job (the grouped pass); ``names`` limits what is returned.
    """
    result = run_pass(ops, ww_deps)
    checks = cases_of(result)
    result.release()
    if names is not None:
        checks = {name: cases for name, cases in checks.items() if name in names}
    return checks


def unseen_series(result: PassResult, bucket_ns: int) -> list[dict]:
    """Unseen acknowledged writes over all keys: [{time (end of bucket, ns), unseen}]."""
    return running_unseen(result.unseen_deltas, bucket_ns)


def unseen_series_by_key(result: PassResult, bucket_ns: int) -> list[dict]:
    """The same per key: [{key, time, unseen}]."""
    return [
        {"key": key, **point}
        for key in sorted(result.unseen_by_key)
        for point in running_unseen(result.unseen_by_key[key], bucket_ns)
    ]


__all__ = [
    "ANOMALY_NAMES",
    "CAUSES",
    "POSITIONS",
    "allowed_anomalies",
    "cases_of",
    "history_checks",
    "summary",
    "summary_counts",
    "unseen_series",
    "unseen_series_by_key",
    "version_orders",
]
