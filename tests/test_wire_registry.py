"""The wire registry's shape, the lists derived from it, and case sentences
rendered on the driver from literal cases (no Spark session needed)."""

from __future__ import annotations

import pytest

from kproxy_spark import attribution, report
from kproxy_spark.wire import diagnoses, registry
from kproxy_spark.wire.check import BY_RULES, ERROR, INFO


def test_every_check_has_one_name_a_severity_an_order_and_a_sentence():
    names = [check.name for check in registry.WIRE_CHECKS]
    assert len(names) == len(set(names))
    for check in registry.WIRE_CHECKS:
        assert check.severity in (ERROR, INFO), check.name
        assert callable(check.cases) and callable(check.explain), check.name
        assert check.cause == BY_RULES or check.cause in registry.BROKER_DIAGNOSES, check.name
    assert list(registry.WIRE_ORDER) == [*names, *(table.name for table in registry.WIRE_TABLES)]


def test_each_broker_diagnosis_is_one_row_with_one_check_and_one_fact():
    rows = diagnoses.DIAGNOSES
    assert len({d.name for d in rows}) == len(rows) and len({d.check for d in rows}) == len(rows)
    assert registry.DIAGNOSED == {d.check: d.name for d in rows}
    for d in rows:
        assert registry.BY_NAME[d.check].cause == d.name
        wanted = attribution.SERVED_WRONGLY if d.explains == diagnoses.SERVED else attribution.MISSED
        assert [fact for fact, _ in wanted].count(d.name) == 1, d.name
        assert attribution._FACT_TEXT[d.name] == d.text


def test_the_reports_lists_come_from_the_registry():
    assert report.WHY_ORDER[: len(registry.TELLING_ORDER)] == registry.TELLING_ORDER
    assert registry.INFORMATIONAL == {"stale-end-txn", "late-produce", "ambiguous-error"}
    assert registry.INFORMATIONAL <= report.INFORMATIONAL
    assert not (report.INFORMATIONAL & {c.name for c in registry.WIRE_CHECKS if c.severity == ERROR})
    assert registry.RULE_ONLY == registry.INFORMATIONAL
    assert report.STATS_TABLES["latency"] == "latency"


def _explain(name: str, **case) -> str:
    return registry.BY_NAME[name].explain(case)


FETCH = {"conn_id": 2, "correlation_id": 5, "topic": "t", "partition": 0, "offsets": [3, 4], "rules": []}


@pytest.mark.parametrize(("name", "case", "sentence"), [
    ("broker-aborted-read", {**FETCH, "client_id": "c1", "aborted_records": 2, "known_by": ["end_txn", "marker"]},
     "a read_committed Fetch by c1 (conn 2, correlation id 5) returned 2 record(s) of aborted transactions: topic t"
     " partition 0 at offset(s) 3, 4 (aborted per the EndTxn and the log's markers), and its aborted-transactions"
     " list covers none of them; the broker's own response"),
    ("stale-aborted-entry", {**FETCH, "committed_records": 2, "producer_ids": [1000], "listed_first_offsets": [0],
                             "rules": ["hide"]},
     "a read_committed Fetch (conn 2, correlation id 5) returned 2 committed record(s) of topic t partition 0 at"
     " offset(s) 3, 4, yet listed their producer(s) 1000 as aborted from offset(s) 0 with no abort marker in"
     " between, so the client drops them; listed because rule 'hide' rewrote the broker's response"),
    ("past-lso-read", {**FETCH, "past_records": 2, "last_stable_offset": 3},
     "a read_committed Fetch (conn 2, correlation id 5) returned 2 record(s) of topic t partition 0 at offset(s)"
     " 3, 4, at or beyond its own last stable offset 3; the broker's own response"),
    ("left-out-records", {**FETCH, "left_out": 2},
     "a read_committed Fetch (conn 2, correlation id 5) left out 2 committed record(s) of topic t partition 0 at"
     " offset(s) 3, 4, between records it did serve; the broker's own response"),
    ("stale-end-txn", {"end_txn_commit": False, "txn_client": 3, "transactional_id": "tx", "producer_id": 7,
                       "producer_epoch": 1, "rule": "r", "action": "hold", "hazard": "stale_end_txn",
                       "txn_broker": 4, "conn_id": 1, "correlation_id": 9, "response_error_code": 48},
     "EndTxn(abort) of client txn 3 from tx (producer 7, epoch 1), held back by rule 'r' and delivered while"
     " broker txn 4 was open (conn 1, correlation id 9); the broker answered INVALID_TXN_STATE"),
    ("late-produce", {"records": [[1, 2]], "txn_client": 1, "txn_broker": 2, "transactional_id": "tx",
                      "producer_id": 7, "rule": None, "conn_id": 1, "correlation_id": 4, "landed_offsets": [],
                      "landed_fates": [], "lost_reason": None},
     "Produce of records [1,2] in client txn 1 of tx (producer 7), delivered while broker txn 2 was open"
     " (conn 1, correlation id 4), did not land (error or no response)"),
    ("ambiguous-error", {"key": 9, "value": 5, "error_codes": [7, 99999], "topic": "u", "partition": 0,
                         "read_offsets": [0], "index": None, "rules": ["err"]},
     "every Produce of key 9 value 5 was answered with an error (REQUEST_TIMED_OUT, 99999), yet a Fetch read it"
     " from u partition 0 at offset 0; the client saw no history op for it; fault rules involved: 'err'"),
    ("client-outcome-mismatch", {"f": "send", "index": 4, "process": 1, "client_type": "ok",
                                 "direction": "client-ok-wire-aborted", "committed": [], "aborted": [[8, 1]],
                                 "rules": []},
     "send op 4 (process 1, client acknowledged) but the wire aborted [8,1]"),
])
def test_sentences_are_rendered_from_the_cases_fields(name, case, sentence):
    assert _explain(name, **case) == sentence


def test_a_torn_transaction_names_what_decided_its_records_when_no_stale_end_txn_did():
    end = {"end_txn_commit": True, "txn_client": 1, "hazard": None, "rule": "slow", "action": "delay",
           "conn_id": 1, "correlation_id": 3}
    sentence = _explain("torn-transaction", source="history", index=2, process=0, transactional_id="tx-0",
                        client_type="info", client_error=None, committed=[[7, 2]], aborted=[[7, 1]],
                        unknown=[[7, 3]], stale_end_txns=[], end_txns=[end], rules=["slow"])
    assert sentence == (
        "txn op 2 (process 0, tx-0, client outcome unknown: no error given): records [7,2] committed but [7,1]"
        " aborted, and [7,3] of unknown fate; no EndTxn with a hazard decided them (they were decided by the"
        " EndTxn(commit) of client txn 1, delayed by rule 'slow' (conn 1, correlation id 3)); fault rules"
        " involved: 'slow'")
