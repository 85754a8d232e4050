"""Wire checks of Produce answers: what an error answer told the client,
beside where the write is."""

from __future__ import annotations

from typing import Any

from pyspark.sql import DataFrame
from pyspark.sql import functions as F

from kproxy_spark.wire import phrases as say
from kproxy_spark.wire.check import BY_RULES, ERROR, INFO, WireCheck
from kproxy_spark.wire.views import WireViews


def _attempts_by_write(attempts: DataFrame) -> DataFrame:
    """Per written (key, value): how its Produce attempts were answered."""
    return attempts.groupBy("key_long", "value_long").agg(
        F.max((F.col("status") == "ok").cast("int")).alias("any_ok"),
        F.max((F.col("status") == "error").cast("int")).alias("any_error"),
        F.array_sort(F.collect_set(F.when(F.col("status") == "error", F.col("response_error")))).alias("error_codes"),
        F.array_sort(F.collect_set(
            F.when(
                F.col("status") == "error",
                F.struct("conn_id", "correlation_id", "copy", "topic", "partition", "rule", "action", "outcome",
                         "response_error"),
            )
        )).alias("errored_produces"),
        F.array_sort(F.collect_set(F.when(F.col("status") == "error", F.col("rule")))).alias("rules"),
    )


def spurious_offsets(views: WireViews) -> DataFrame:
    """Sends the client reported at an offset while every traced Produce of
    that write (kproxy_spark.wire.landings.produce_attempts) was answered with an
    error."""
    reported = views.sent.where(F.col("offset").isNotNull() & F.col("type").isin("ok", "info"))
    answers = _attempts_by_write(views.attempts)
    joined = reported.join(
        answers, (reported["key"] == answers["key_long"]) & (reported["value"] == answers["value_long"])
    )
    return joined.where((F.col("any_error") == 1) & (F.col("any_ok") == 0)).select(
        "index", "time", "process", "type", "key", "value", F.col("offset").alias("client_offset"),
        "error_codes", "errored_produces", "rules",
    )


def explain_spurious(case: dict[str, Any]) -> str:
    return (f"op {say.text(case.get('index'))} (process {say.text(case.get('process'))}) reported key"
            f" {say.text(case.get('key'))} value {say.text(case.get('value'))} at offset"
            f" {say.text(case.get('client_offset'))}, but every Produce of it was answered with an error"
            f" ({say.errors(case.get('error_codes'))})" + say.rules_involved(case.get("rules")))


def ambiguous_errors(views: WireViews) -> DataFrame:
    """Writes whose every Produce was answered with an error, yet which a
    Fetch (kproxy_spark.wire.landings.fetched_records) later returned: the error
    did not mean "not written"."""
    answers = _attempts_by_write(views.attempts).where((F.col("any_error") == 1) & (F.col("any_ok") == 0))
    reads = views.fetched.where(F.col("control").isNull()).groupBy(
        "key_long", "value_long", "topic", "partition"
    ).agg(F.array_sort(F.collect_set("offset")).alias("read_offsets"))
    client = views.sent.select(
        F.col("key").alias("key_long"), F.col("value").alias("value_long"),
        F.col("index"), F.col("type").alias("client_type"), F.col("error").alias("client_error"),
    )
    return (
        answers.join(reads, ["key_long", "value_long"])
        .join(client, ["key_long", "value_long"], "left")
        .select(
            "index", "client_type", "client_error",
            F.col("key_long").alias("key"), F.col("value_long").alias("value"),
            "topic", "partition", "read_offsets", "error_codes", "errored_produces", "rules",
        )
    )


def explain_ambiguous(case: dict[str, Any]) -> str:
    index, client_type, client_error = case.get("index"), case.get("client_type"), case.get("client_error")
    if index is None or client_type is None:
        saw = "no history op for it"
    else:
        saw = f"op {index} {client_type}" + (f" ({client_error})" if client_error is not None else "")
    return (f"every Produce of key {say.text(case.get('key'))} value {say.text(case.get('value'))} was answered"
            f" with an error ({say.errors(case.get('error_codes'))}), yet a Fetch read it from"
            f" {say.text(case.get('topic'))} partition {say.text(case.get('partition'))} at offset"
            f" {say.numbers(case.get('read_offsets'))}; the client saw {saw}" + say.rules_involved(case.get("rules")))


CHECKS = (
    WireCheck("spurious-offset", ERROR, (("index", False), ("key", False)), spurious_offsets, BY_RULES,
              explain_spurious),
    WireCheck("ambiguous-error", INFO, (("key", False), ("value", False)), ambiguous_errors, BY_RULES,
              explain_ambiguous),
)
