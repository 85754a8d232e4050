"""Broker diagnoses: what a broker's own read_committed Fetch response did
against the protocol (KIP-98; the Fetch schema's AbortedTransactions and
LastStableOffset), judged by the broker's own log.

One row per diagnosis, and the row is all there is to it: the records it
finds serve both the per-response cases (kproxy_spark.wire.fetch, one
anomaly class each) and the per-value facts that tie history cases to the
response (kproxy_spark.wire.facts). docs/analysis.md, "Causes", describes
each.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kproxy_spark.wire import phrases as say

if TYPE_CHECKING:
    from kproxy_spark.wire.views import WireViews

#: What a diagnosis explains in the history (kproxy_spark.attribution): a
#: value a client read though it should not have, or a committed value it missed.
SERVED, MISSED = "served", "missed"


@dataclass(frozen=True)
class BrokerDiagnosis:
    """name: the diagnosis (the per-value fact and the cause's name);
    check: the report's anomaly class of its per-response cases;
    records: views -> the records it finds, one row each (a Fetch record's
    exchange, topic, partition, offset, key_long, value_long, client_id, rule
    and whatever `extra` reads);
    rule_made_it: on such a record, whether a rule's rewrite of the broker's
    response made it so (then that rule is the cause, not the broker);
    explains: SERVED or MISSED; text: what it did to a value, for the cause;
    count_as: the case's field for its number of records;
    extra: more per-response aggregates of its records;
    explain: a per-response case -> its sentence;
    rule_explains_values: whether a rule that made it so also explains the
    values (else only the broker's own responses make facts)."""

    name: str
    check: str
    records: Callable[[WireViews], DataFrame]
    rule_made_it: Callable[[], Column]
    explains: str
    text: str
    count_as: str
    explain: Callable[[dict[str, Any]], str]
    extra: Callable[[], list[Column]] = list
    rule_explains_values: bool = True


def _fetch(case: dict[str, Any]) -> str:
    client = case.get("client_id")
    by = f" by {client}" if client is not None else ""
    return f"a read_committed Fetch{by} {say.at(case.get('conn_id'), case.get('correlation_id'))}"


def _who(case: dict[str, Any], what: str) -> str:
    """'; the broker's own response' or the rule whose rewrite made it so."""
    rules = case.get("rules") or []
    if rules:
        return f"; {what} because rule '" + "', '".join(rules) + "' rewrote the broker's response"
    return "; the broker's own response"


def _where(case: dict[str, Any]) -> str:
    return (f"topic {say.text(case.get('topic'))} partition {say.text(case.get('partition'))}"
            f" at offset(s) {say.numbers(case.get('offsets'))}")


_KNOWN_BY = {"end_txn": "the EndTxn", "marker": "the log's markers"}


def _explain_not_listed(case: dict[str, Any]) -> str:
    known = " and ".join(_KNOWN_BY.get(k, k) for k in case.get("known_by") or () if k is not None)
    return (f"{_fetch(case)} returned {say.text(case.get('aborted_records'))} record(s) of aborted transactions:"
            f" {_where(case)} (aborted per {known}), and its aborted-transactions list covers none of them"
            + _who(case, "uncovered"))


def _explain_stale_entry(case: dict[str, Any]) -> str:
    return (f"{_fetch(case)} returned {say.text(case.get('committed_records'))} committed record(s) of {_where(case)},"
            f" yet listed their producer(s) {say.numbers(case.get('producer_ids'))} as aborted from offset(s)"
            f" {say.numbers(case.get('listed_first_offsets'))} with no abort marker in between, so the client drops"
            " them" + _who(case, "listed"))


def _explain_past_lso(case: dict[str, Any]) -> str:
    return (f"{_fetch(case)} returned {say.text(case.get('past_records'))} record(s) of {_where(case)}, at or beyond"
            f" its own last stable offset {say.text(case.get('last_stable_offset'))}" + _who(case, "past it"))


def _explain_left_out(case: dict[str, Any]) -> str:
    return (f"{_fetch(case)} left out {say.text(case.get('left_out'))} committed record(s) of {_where(case)},"
            " between records it did serve" + _who(case, "left out"))


def _maybe_decided_when_read() -> Column:
    """The record's transaction may have ended before the broker read it:
    its EndTxn reached the broker (through the same proxy, whose clock
    orders both) before this Fetch response came back, and the broker's own
    response already put the record past its LSO (else a rule did)."""
    ended_first = (F.col("end_proxy_id") == F.col("proxy_id")) & (F.col("end_delivery_ns") < F.col("mono_ns"))
    return F.coalesce(ended_first & F.coalesce(F.col("upstream_past_lso"), F.lit(True)), F.lit(False))


def _listed_first_offsets() -> list[Column]:
    covering = F.filter(F.coalesce(F.col("aborted_transactions"), F.array()),
                        lambda a: a["producer_id"] == F.col("producer_id"))
    return [F.array_sort(F.flatten(F.collect_set(F.transform(covering, lambda a: a["first_offset"]))))
            .alias("listed_first_offsets")]


DIAGNOSES = (
    # Records of aborted transactions that the response's aborted-transactions
    # list does not cover: the client has nothing to drop them by. Covered
    # ones are how Kafka serves read_committed and are no anomaly. A rule is
    # the cause only when the broker's own response covered them and the
    # rule's rewrite removed that.
    BrokerDiagnosis(
        name="aborted-txn-not-listed", check="broker-aborted-read",
        records=lambda views: views.served.where((F.col("fate") == "aborted") & ~F.col("listed_aborted")),
        rule_made_it=lambda: F.coalesce(F.col("upstream_listed_aborted"), F.lit(False)),
        explains=SERVED, count_as="aborted_records", explain=_explain_not_listed,
        extra=lambda: [F.array_sort(F.collect_set("fate_source")).alias("known_by")],
        text="a read_committed Fetch response served it as an aborted record without listing its transaction as"
             " aborted",
    ),
    # Committed records an aborted-transactions entry covers: an entry whose
    # transaction ended before these records, with no ABORT marker of the
    # producer in between, so the client drops committed records. Kafka
    # lists only aborted transactions that overlap the fetched range.
    BrokerDiagnosis(
        name="stale-aborted-entry", check="stale-aborted-entry",
        records=lambda views: views.served.where((F.col("fate") == "committed") & F.col("listed_aborted")),
        rule_made_it=lambda: ~F.coalesce(F.col("upstream_listed_aborted"), F.lit(True)),
        explains=MISSED, count_as="committed_records", explain=_explain_stale_entry, extra=_listed_first_offsets,
        text="a read_committed Fetch response listed its producer as aborted though its transaction committed, so"
             " the client dropped it",
    ),
    # Records at or beyond the response's own last stable offset: of
    # transactions not yet decided when it was sent. A rule that lowers the
    # LSO changes a number, not which records the client gets, so it
    # explains no read. Kafka reports the LSO it read *before* reading the
    # records, each bounded by the LSO at read time (Partition.readRecords'
    # initialLastStableOffset), so a transaction whose EndTxn had reached
    # the broker before the response came back may have been decided in
    # between: only records served ahead of their EndTxn are the broker's.
    BrokerDiagnosis(
        name="past-last-stable-offset", check="past-lso-read",
        records=lambda views: views.served.where(F.col("past_lso") & ~_maybe_decided_when_read()),
        rule_made_it=lambda: ~F.coalesce(F.col("upstream_past_lso"), F.lit(True)),
        explains=SERVED, count_as="past_records", explain=_explain_past_lso,
        extra=lambda: [F.array_sort(F.collect_set("fate")).alias("fates")], rule_explains_values=False,
        text="a read_committed Fetch response served it beyond its own last stable offset",
    ),
    # Committed records skipped in the middle of what the response served:
    # no control batch, abort or rule explains the gap, and the client,
    # handed the records after it, moves past them. Responses a rule
    # rewrote are the rule's own (`removed-by-rule`).
    BrokerDiagnosis(
        name="records-left-out", check="left-out-records",
        records=lambda views: views.left_out,
        rule_made_it=lambda: F.lit(False),
        explains=MISSED, count_as="left_out", explain=_explain_left_out,
        text="a read_committed Fetch response left it out from among the records it served",
    ),
)

#: The diagnoses by name.
BY_NAME = {d.name: d for d in DIAGNOSES}
