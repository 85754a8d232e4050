"""Per written value, every wire fact that explains why a client saw it,
missed it or saw its fate differ from what it was told: the rows
kproxy_spark.attribution ties history cases to the wire by."""

from __future__ import annotations

from typing import Any

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F
from pyspark.sql.types import BooleanType, LongType, StringType, StructField, StructType

from kproxy_spark.wire import phrases as say
from kproxy_spark.wire.check import WireTable
from kproxy_spark.wire.cut_off_pass import OWN, STALE, STALE_FIELDS, cut_off_by_stale_end_txns
from kproxy_spark.wire.diagnoses import DIAGNOSES, BrokerDiagnosis
from kproxy_spark.wire.landings import TXN_KEY, spread
from kproxy_spark.wire.views import WireViews

VALUE_FACT_COLUMNS = ("key", "value", "fact", "rule", "topic", "partition", "offset", "conn_id", "correlation_id",
                      "detail", "evidence")

#: What a cut-off fact's `evidence` holds (the exchanges that show it); the
#: driver renders it as a sentence (cut_off_evidence).
EVIDENCE = (
    ("produce_conn_id", "bigint"), ("produce_correlation_id", "bigint"), ("stale_conn_id", "bigint"),
    ("stale_correlation_id", "bigint"), ("stale_copy", "bigint"), ("stale_commit", "boolean"),
    ("end_conn_id", "bigint"), ("end_correlation_id", "bigint"), ("end_commit", "boolean"), ("by_marker", "boolean"),
    ("log_fate", "string"), ("topic", "string"), ("partition", "bigint"), ("offset", "bigint"),
)
_EVIDENCE_TYPE = "struct<" + ",".join(f"{name}:{kind}" for name, kind in EVIDENCE) + ">"


def cut_off_records(views: WireViews) -> DataFrame:
    """Traced records a rule's stale EndTxn cut off from their own
    transaction: the stale EndTxn, of the same producer, was answered after
    the producer's previous own EndTxn reached the broker and before the
    record's Produce did, so it ended the record's transaction early; the
    record landed after that end, the client's own EndTxn (the next one
    delivered) did not reach it, and the log gave it another fate than that
    EndTxn's: its producer's next marker in the partition, or an
    aborted-transactions entry covering it (noida-db: the next transaction's
    ABORT, so a committed write is dropped; docs/analysis.md, "Causes").

    One row per record, the latest such stale EndTxn, with `log_fate` and
    the ids of the Produce, the stale EndTxn and the client's own EndTxn:
    one grouped pass per producer session
    (kproxy_spark.wire.cut_off_pass.cut_off_by_stale_end_txns)."""
    log, ends = views.log, views.ends
    ok = F.col("delivered") & (F.col("response_error_code").isNull() | (F.col("response_error_code") == 0))
    told = F.when(F.col("end_end_txn_commit"), "committed").when(~F.col("end_end_txn_commit"), "aborted")
    in_session = F.col("txn_id").isNotNull() & F.col("txn_pid").isNotNull() & F.col("txn_epoch").isNotNull()
    records = log.where(
        F.col("produce_delivery_ns").isNotNull() & F.col("end_hazard").isNull() & F.col("marker_fate").isNotNull()
        & told.isNotNull() & (F.col("marker_fate") != told) & in_session
    ).select(*TXN_KEY, "topic", "partition", "offset", "key_long", "value_long", "produce_delivery_ns",
             "produce_conn_id", "produce_correlation_id", "end_conn_id", "end_correlation_id", "end_end_txn_commit",
             F.col("marker_fate").alias("log_fate"), F.col("next_marker_fate").isNotNull().alias("by_marker"))
    kind = (F.when(F.col("hazard").isNull() & F.col("delivery_ns").isNotNull(), F.lit(OWN))
            .when(F.col("hazard").isNotNull() & F.col("rule").isNotNull() & F.col("response_ns").isNotNull(),
                  F.lit(STALE)))
    candidates = ends.where(ok & in_session & kind.isNotNull()).select(
        *TXN_KEY, kind.alias("kind"), "delivery_ns", "response_ns", F.col("conn_id").cast("long").alias("conn_id"),
        F.col("correlation_id").cast("long").alias("correlation_id"), F.col("copy").cast("long").alias("copy"),
        "end_txn_commit", "rule")
    stale = StructType([StructField(name, _SPARK_TYPES[str(arrow_type)]) for name, arrow_type in STALE_FIELDS])
    schema = StructType([StructField(f.name, f.dataType) for f in records.schema.fields if f.name not in TXN_KEY]
                        + [StructField("stale", stale)])
    by_session = spread(records, *TXN_KEY)
    return records.groupBy(by_session).cogroup(candidates.groupBy(by_session)).applyInArrow(
        cut_off_by_stale_end_txns, schema)


#: Spark's types for the pyarrow types of the `stale` struct's fields.
_SPARK_TYPES = {"int64": LongType(), "bool": BooleanType(), "string": StringType()}


def _cut_off_evidence() -> Column:
    fields = {
        "produce_conn_id": F.col("produce_conn_id"), "produce_correlation_id": F.col("produce_correlation_id"),
        "stale_conn_id": F.col("stale.conn_id"), "stale_correlation_id": F.col("stale.correlation_id"),
        "stale_copy": F.col("stale.copy"), "stale_commit": F.col("stale.commit"),
        "end_conn_id": F.col("end_conn_id"), "end_correlation_id": F.col("end_correlation_id"),
        "end_commit": F.col("end_end_txn_commit"), "by_marker": F.col("by_marker"), "log_fate": F.col("log_fate"),
        "topic": F.col("topic"), "partition": F.col("partition"), "offset": F.col("offset"),
    }
    return F.struct(*[fields[name].cast(kind).alias(name) for name, kind in EVIDENCE])


def cut_off_evidence(evidence: dict[str, Any] | None) -> str | None:
    """A cut-off fact's evidence as the sentence its cause quotes."""
    if not evidence:
        return None
    e = {name: say.text(evidence.get(name)) for name, _ in EVIDENCE}
    decided = (f"its producer's next marker in {e['topic']}[{e['partition']}] after offset {e['offset']}"
               f" {'aborted' if evidence.get('log_fate') == 'aborted' else 'committed'} it" if evidence.get("by_marker")
               else f"an aborted-transactions entry covers it at {e['topic']}[{e['partition']}] offset {e['offset']}")
    return (f"its Produce (conn {e['produce_conn_id']}, correlation id {e['produce_correlation_id']}) reached the"
            f" broker after the stale EndTxn({say.commit_or_abort(evidence.get('stale_commit'))}) (conn"
            f" {e['stale_conn_id']}, correlation id {e['stale_correlation_id']}, copy {e['stale_copy']}) had ended its"
            f" producer's transaction there, so the client's own EndTxn({say.commit_or_abort(evidence.get('end_commit'))})"
            f" (conn {e['end_conn_id']}, correlation id {e['end_correlation_id']}) did not reach it, and {decided}")


def _pick(frame: DataFrame, fact: str, rule: Column, detail: Column, evidence: Column | None = None,
          at: tuple[Column, Column] | None = None) -> DataFrame:
    conn, correlation = at or [F.col(c) if c in frame.columns else F.lit(None) for c in ("conn_id", "correlation_id")]
    return frame.select(
        F.col("key_long").alias("key"), F.col("value_long").alias("value"), F.lit(fact).alias("fact"),
        rule.alias("rule"), "topic", "partition", "offset",
        conn.cast("long").alias("conn_id"), correlation.cast("long").alias("correlation_id"),
        detail.cast("string").alias("detail"),
        (F.lit(None) if evidence is None else evidence).cast(_EVIDENCE_TYPE).alias("evidence"),
    )


def _diagnosed(diagnosis: BrokerDiagnosis, views: WireViews) -> DataFrame:
    """The values a diagnosis found (rule: the rewriting rule when its
    rewrite made it so, and the rule explains values)."""
    records = diagnosis.records(views).where(F.col("key_long").isNotNull() & F.col("value_long").isNotNull())
    if diagnosis.rule_explains_values:
        rule = F.when(diagnosis.rule_made_it(), F.col("rule"))
    else:
        records, rule = records.where(~diagnosis.rule_made_it()), F.lit(None).cast("string")
    return _pick(records, diagnosis.name, rule, F.col("client_id"))


def _taken_out(views: WireViews) -> DataFrame:
    """Data records a rule took out of a Fetch response, except aborted ones
    out of a read_committed response: the client drops those itself, so
    taking them out hides nothing it should have read. (Counted as a fact,
    such a record's absence from one reader would be blamed on the rule
    where another reader was served it wrongly: the broker's doing.)"""
    removed = views.removed.where(F.col("control").isNull() & F.col("key_long").isNotNull())
    fates = views.log.select("topic", "partition", "offset",
                             F.coalesce("next_marker_fate", "fate").alias("log_fate"))
    aborted = F.coalesce(F.col("read_committed") & (F.col("log_fate") == "aborted"), F.lit(False))
    return removed.join(fates, ["topic", "partition", "offset"], "left").where(~aborted)


def value_facts(views: WireViews) -> DataFrame:
    """Rows (VALUE_FACT_COLUMNS) of the facts kproxy_spark.attribution reads:

    * ``stale-end-txn``: the EndTxn that decided the record was stale (rule:
      the rule that delivered it), detail its fate;
    * ``late-produce``: the record's Produce landed in a later transaction;
    * every broker diagnosis (kproxy_spark.wire.diagnoses), under its name:
      a read_committed response served or hid the value so (detail: the
      client; rule: the rewriting rule when its rewrite made it so);
    * ``removed-by-rule``: a rule took it out of a Fetch response (not an
      aborted record out of a read_committed one: _taken_out);
    * ``copy-landed``: a copy the proxy delivered landed it again;
    * ``cut-off-by-stale-end-txn``: a rule's stale EndTxn ended its
      transaction before its Produce arrived and the log decided it otherwise
      than the client's own EndTxn (cut_off_records; detail: the log's fate,
      at: the stale EndTxn, evidence: the exchanges that show it).
    """
    log = views.log
    landed = log.where(F.col("key_long").isNotNull() & F.col("value_long").isNotNull())
    cut = cut_off_records(views).where(F.col("key_long").isNotNull() & F.col("value_long").isNotNull())
    parts = [
        _pick(landed.where(F.col("end_hazard").isNotNull()), "stale-end-txn", F.col("end_rule"), F.col("fate")),
        _pick(landed.where(F.col("produce_hazard").isNotNull()), "late-produce", F.col("produce_rule"), F.col("fate")),
        *[_diagnosed(d, views) for d in DIAGNOSES],
        _pick(_taken_out(views), "removed-by-rule", F.col("rule"), F.col("client_id")),
        _pick(landed.where(F.col("produce_copy") > 0), "copy-landed", F.col("produce_rule"), F.col("fate")),
        _pick(cut, "cut-off-by-stale-end-txn", F.col("stale.rule"), F.col("log_fate"), _cut_off_evidence(),
              at=(F.col("stale.conn_id"), F.col("stale.correlation_id"))),
    ]
    union = parts[0]
    for part in parts[1:]:
        union = union.unionByName(part)
    # One row per value, fact and rule: the first place it was seen says where.
    return union.groupBy("key", "value", "fact", "rule").agg(
        *[F.min_by(c, F.struct("offset", "conn_id", "correlation_id")).alias(c)
          for c in ("topic", "partition", "offset", "conn_id", "correlation_id", "detail", "evidence")]
    )


TABLE = WireTable("~value-facts", (("key", False), ("value", False), ("fact", False), ("rule", False)), value_facts,
                  explain=lambda row: cut_off_evidence(row.get("evidence")), text_field="evidence")
