"""Wire checks of Fetch responses: one anomaly class per broker diagnosis
(kproxy_spark.wire.diagnoses), one case per response partition."""

from __future__ import annotations

from functools import partial

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy_spark.wire.check import ERROR, WireCheck
from kproxy_spark.wire.diagnoses import DIAGNOSES, BrokerDiagnosis
from kproxy_spark.wire.views import WireViews

#: Cases of a Fetch response, in the order they crossed the proxy.
BY_RESPONSE = (("mono_ns", False), ("conn_id", False), ("correlation_id", False))


def by_response(diagnosis: BrokerDiagnosis, views: WireViews) -> DataFrame:
    """One case per fetch response partition: its records the diagnosis
    found and, when a rule's rewrite is what made them so, that rule."""
    return diagnosis.records(views).groupBy("proxy_id", "conn_id", "correlation_id", "copy", "topic", "partition").agg(
        F.min("mono_ns").alias("mono_ns"),
        F.first("client_id").alias("client_id"),
        F.count(F.lit(1)).alias(diagnosis.count_as),
        F.array_sort(F.collect_set("offset")).alias("offsets"),
        F.array_sort(F.collect_set(F.array("key_long", "value_long"))).alias("records"),
        F.array_sort(F.collect_set("producer_id")).alias("producer_ids"),
        F.first("last_stable_offset").alias("last_stable_offset"),
        F.first("rule", ignorenulls=True).alias("response_rule"),
        F.first("action", ignorenulls=True).alias("response_action"),
        F.array_sort(F.collect_set(F.when(diagnosis.rule_made_it(), F.col("rule")))).alias("rules"),
        *diagnosis.extra(),
    )


CHECKS = tuple(
    WireCheck(d.check, ERROR, BY_RESPONSE, partial(by_response, d), d.name, d.explain) for d in DIAGNOSES
)
