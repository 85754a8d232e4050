"""What the wire analysis needs to know of the traces before it plans:
one small job on the kept traces (kproxy_spark.wire.views.wire_parts runs
it once per analysis).

Each answer used to be an eager job of its own (the Fetch responses'
records counted for the isolation's tell, the request APIs listed), each a
query the driver planned and the JVM compiled anew on the wire phase's
critical path.
"""

from __future__ import annotations

from dataclasses import dataclass

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

#: Requests only a member of a group sends: a group none of whose consumers
#: sent one has no members.
MEMBER_APIS = ("join_group", "sync_group", "heartbeat", "consumer_group_heartbeat")


@dataclass(frozen=True)
class TraceSummary:
    """request_apis: the APIs of the traced requests (a check whose APIs are
    absent is not built: kproxy_spark.wire.check.built); member_groups: the
    consumer groups some member joined; fetch_lists: whether any Fetch
    response carried an aborted-transactions list beside records (the
    isolation's tell: kproxy_spark.wire.landings.fetched_records)."""

    request_apis: frozenset[str]
    member_groups: frozenset[str]
    fetch_lists: bool


def trace_summary(traces: DataFrame) -> TraceSummary:
    request = F.col("direction") == "request"
    listed = (F.col("api") == "fetch") & (F.col("direction") == "response") & F.exists(
        "partitions", lambda p: p["aborted_transactions"].isNotNull()
        & F.exists(p["records"], lambda r: r["offset"].isNotNull()))
    rows = traces.where(request | listed).select(
        F.when(request, F.col("api")).alias("api"),
        F.when(request & F.col("api").isin(*MEMBER_APIS), F.col("group_id")).alias("group_id"),
        F.coalesce(listed, F.lit(False)).alias("fetch_lists")).distinct().collect()
    return TraceSummary(
        request_apis=frozenset(row["api"] for row in rows if row["api"] is not None),
        member_groups=frozenset(row["group_id"] for row in rows if row["group_id"] is not None),
        fetch_lists=any(row["fetch_lists"] for row in rows))
