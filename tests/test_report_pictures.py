"""report.html tells every case in a sentence and draws the first few:
wire sequence diagrams from a case's story, cycles for G0 and G1c (no Spark)."""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET

from kproxy_spark.checks import ANOMALY_NAMES
from kproxy_spark.checks.sentences import SENTENCES, TOLD_WHERE_FOUND, sentence_of
from kproxy_spark.drawings.anchors import FIRST_DRAWN, drawn_anchors
from kproxy_spark.drawings.cycle import cycle_svg
from kproxy_spark.drawings.sequence import sequence_svg
from kproxy_spark.html import render_html
from kproxy_spark.report import build_report
from kproxy_spark.wire.registry import WIRE_CHECKS

# Cases as the demo's torn-transaction run reported them (report.json), fields only.
G0_CASE = {"cycle": [43, 49, 47, 43], "processes": [2, 2, 0, 2], "length": 3, "steps": [
    {"from_index": 43, "to_index": 49, "type": "ww", "key": 0, "value": 28, "value2": 29},
    {"from_index": 49, "to_index": 47, "type": "ww", "key": 0, "value": 30, "value2": 25},
    {"from_index": 47, "to_index": 43, "type": "ww", "key": 0, "value": 24, "value2": 26}]}
G1C_CASE = {"cycle": [43, 47, 43], "processes": [2, 0, 2], "length": 2, "steps": [
    {"from_index": 43, "to_index": 47, "type": "wr", "key": 2, "value": 4, "value2": None},
    {"from_index": 47, "to_index": 43, "type": "ww", "key": 0, "value": 24, "value2": 26}]}
HISTORY_CASES = {
    "G0": [G0_CASE],
    "G1c": [G1C_CASE],
    "abort-position": [{"key": 0, "process": 0, "abort_index": 19, "error": "aborted", "next_index": 31,
                        "aborted_first_offset": 1, "aborted_last_offset": 1, "next_first_offset": 5,
                        "aborted_first_value": 3, "aborted_last_value": 3, "next_first_value": 4,
                        "position": "advance"}],
    "int-poll-skip": [{"key": 4, "values": [9, 10], "delta": 3, "index": 113, "process": 0, "type": "fail",
                       "f": "txn", "mop_index": 1, "prev_vo_index": 5, "vo_index": 8, "skipped": [7, 8]}],
    "int-send-skip": [{"key": 0, "values": [24, 25], "delta": 6, "index": 47, "process": 0, "type": "ok", "f": "txn",
                       "mop_index": 7, "prev_vo_index": 10, "vo_index": 16, "skipped": [26, 27, 28, 29, 30]}],
    "precommitted-read": [{"index": 82, "process": 2, "type": "fail", "key": 3, "value": 4, "offset": 8}],
    "unseen": [{"key": 4, "value": 7, "offset": 13, "send_index": 78, "send_time": 2224484339, "process": 2}],
}

# The demo's first torn transaction, as the analysis fetched it from the wire views.
TOPIC = "kproxy-demo-06d51b6172-"
TORN_STORY = {
    "produces": [
        {"conn_id": 6, "correlation_id": 23, "copy": 0, "mono_ns": 20432865801054, "delivery_ns": 20432865839721,
         "response_ns": 20432865962024, "transactional_id": "kproxy-demo-06d51b6172-txn-1", "producer_id": 1000,
         "txn_client": 5, "txn_broker": 5, "hazard": None, "rule": None, "action": None, "outcome": "delivered",
         "records": [{"key": 3, "value": 0, "topic": TOPIC + "3", "partition": 0, "offset": 0, "status": "ok",
                      "error": 0, "fate": "committed", "log_fate": "committed", "decided_by": [7, 15, 1],
                      "marker": {"offset": 1, "control": "commit"}}]},
        {"conn_id": 6, "correlation_id": 26, "copy": 0, "mono_ns": 20433163665435, "delivery_ns": 20433163690853,
         "response_ns": 20433163946404, "transactional_id": "kproxy-demo-06d51b6172-txn-1", "producer_id": 1000,
         "txn_client": 5, "txn_broker": 5, "hazard": None, "rule": None, "action": None, "outcome": "delivered",
         "records": [{"key": 1, "value": 8, "topic": TOPIC + "1", "partition": 0, "offset": 17, "status": "ok",
                      "error": 0, "fate": "aborted", "log_fate": "aborted", "decided_by": [7, 20, 0],
                      "marker": {"offset": 19, "control": "abort"}}]},
    ],
    "end_txns": [
        {"conn_id": 7, "correlation_id": 15, "copy": 0, "mono_ns": 20432859634381, "delivery_ns": 20432859641912,
         "response_ns": 20432859828180, "transactional_id": "kproxy-demo-06d51b6172-txn-1", "txn_client": 4,
         "txn_broker": 4, "end_txn_commit": True, "hazard": None, "rule": "stale-commit-into-next-txn",
         "action": "duplicate", "outcome": "delivered", "delivered": True, "response_error_code": 0},
        {"conn_id": 7, "correlation_id": 15, "copy": 1, "mono_ns": 20432866300549, "delivery_ns": 20432866148141,
         "response_ns": 20432866607486, "transactional_id": "kproxy-demo-06d51b6172-txn-1", "txn_client": 4,
         "txn_broker": 5, "end_txn_commit": True, "hazard": "stale_end_txn", "rule": "stale-commit-into-next-txn",
         "action": "duplicate", "outcome": "ghost", "delivered": True, "response_error_code": 0},
        {"conn_id": 7, "correlation_id": 20, "copy": 0, "mono_ns": 20433164337297, "delivery_ns": 20433164344146,
         "response_ns": 20433164514261, "transactional_id": "kproxy-demo-06d51b6172-txn-1", "txn_client": 5,
         "txn_broker": 5, "end_txn_commit": False, "hazard": None, "rule": None, "action": None,
         "outcome": "delivered", "delivered": True, "response_error_code": 0},
    ],
    "fetches": [],
}


def _texts(svg: str) -> list[str]:
    return ["".join(t.itertext()) for t in ET.fromstring(svg).iter("text")]


def test_every_class_the_analysis_reports_has_a_sentence():
    history = {*ANOMALY_NAMES, "G0-cycle-exists", "G1c-cycle-exists", "cycle-search-incomplete"}
    assert history - set(TOLD_WHERE_FOUND) <= set(SENTENCES)
    assert all(check.explain is not None for check in WIRE_CHECKS)


def test_history_cases_read_as_sentences():
    told = {name: sentence_of(name, cases[0]) for name, cases in HISTORY_CASES.items()}
    assert told["G1c"] == ("write-read cycle: cycle of 2 ops, op 43 (process 2) -> op 47 (process 0) -> op 43:"
                           " op 47 read key 2 value 4 that op 43 wrote (wr); op 47's value 24 of key 0 comes before"
                           " op 43's 26 in the log (ww)")
    assert told["int-poll-skip"] == ("op 113 (process 0), failed, read key 4 value 9 then value 10, skipping 2"
                                     " value(s) [7, 8] between them")
    assert told["abort-position"].endswith("it went on past them, not back to the committed position (advance)")
    assert told["unseen"] == "key 4 value 7 (offset 13), sent by op 78 (process 2) and acknowledged, was never read"
    assert told["precommitted-read"] == ("op 82 (process 2), failed, read key 3 value 4 (offset 8) that it sent"
                                         " itself, before its own commit")


def test_the_page_tells_cases_in_sentences_not_json():
    report = build_report(HISTORY_CASES, {}, {"completed_ops": 10, "final_reads": True})
    page = render_html(report)
    anomaly_table = page[page.index("<h2>Anomalies</h2>"):page.index("</table>", page.index("<h2>Anomalies</h2>"))]
    assert "{" not in anomaly_table and "write-read cycle: cycle of 2 ops" in anomaly_table
    sections = page[page.index("<h2 id="):page.index("<h2>Stats</h2>")]
    assert '{"' not in sections and "&quot;" not in sections
    # Every case in report.json carries its sentence too.
    assert all(c["explanation"] for cases in report["anomalies"].values() for c in cases)


def test_a_torn_transaction_is_drawn_as_a_sequence_of_the_wire():
    svg = sequence_svg(TORN_STORY, "torn-transaction, case 1")
    texts = _texts(svg)
    assert {"client", "kproxy", "broker"} <= set(texts)
    assert "producer 1000, kproxy-demo-06d51b6172-txn-1" in texts
    # The stale copy, where it landed, what it decided and the marker that shows it; the client's own abort.
    assert "copy 1: EndTxn(commit) client txn 4" in texts
    assert "delivered while broker txn 5 was open" in texts
    assert "rule 'stale-commit-into-next-txn' copied it and held the copy" in texts
    assert "commits [3,0]" in texts and f"COMMIT marker {TOPIC}3[0] @1" in texts
    assert "aborts [1,8]" in texts and f"ABORT marker {TOPIC}1[0] @19" in texts
    assert "EndTxn(abort) client txn 5 (conn 7, corr 20)" in texts
    assert "Produce [3,0] (conn 6, corr 23)" in texts and "client txn 5 → broker txn 5" in texts
    # Rows in time order, times in ms after the first: the original EndTxn first, the client's abort last.
    times = [float(t[1:]) for t in texts if re.fullmatch(r"\+\d+\.\d", t)]
    assert times == sorted(times) and times[0] == 0.0 and round(times[-1]) == 305
    # The copy was held from the original's arrival until its delivery: a bar on the proxy lane.
    assert "held" in texts and svg.count("<rect") == 4


def test_a_cycle_is_drawn_with_its_operations_and_labelled_dependencies():
    svg = cycle_svg(G1C_CASE, "G1c, case 1")
    texts = _texts(svg)
    assert {"op 43", "op 47", "process 2", "process 0"} <= set(texts)
    assert {"wr key 2: read 4", "ww key 0: 24 before 26"} <= set(texts)
    assert svg.count("<circle") == 2 and len(re.findall(r"<path d='M-?\d+,-?\d+ Q", svg)) == 2  # one arrow a step
    assert len(_texts(cycle_svg(G0_CASE, "G0"))) == 3 * 2 + 3 + 2  # ops, processes, edges, legend


def test_the_first_few_caused_cases_of_each_drawn_class_are_anchored():
    by_rule = {"by": "rule", "rule": "r", "at": {"topic": "t", "partition": 0, "offset": 3}}
    g1a = [{"key": 1, "value": v, "cause": by_rule} for v in range(5)]
    g1a.insert(1, {"key": 1, "value": 99, "cause": {"by": "client"}})  # the client's doing: no wire to draw
    torn = [{"committed": [[3, 0]], "aborted": [[1, 8]], "stale_end_txns": [
        {"conn_id": 7, "correlation_id": 15, "copy": 1}]}]
    anchors = drawn_anchors({"G1a": g1a, "torn-transaction": torn, "poll-skip": g1a})
    assert [a.case_id for a in anchors] == ["torn-transaction#0", "G1a#0", "G1a#2", "G1a#3"]
    assert anchors[0].records == ((3, 0), (1, 8)) and anchors[0].exchanges[0].copy == 1
    assert len([a for a in anchors if a.case_id.startswith("G1a")]) == FIRST_DRAWN


def test_the_page_draws_the_stories_and_cycles_and_says_how_many_of_how_many():
    torn = {"index": 35, "committed": [[3, 0]], "aborted": [[1, 8]], "explanation": "txn op 35 torn",
            "wire_story": TORN_STORY}
    report = build_report({"G0": [G0_CASE] * 5}, {"torn-transaction": [torn, dict(torn, wire_story=None)]},
                          {"completed_ops": 10, "final_reads": True})
    page = render_html(report)
    assert page.count("<figure class='case-picture'") == 1 + FIRST_DRAWN
    assert "id='draw-torn-transaction-1'" in page and "id='draw-G0-3'" in page and "id='draw-G0-4'" not in page
    assert "Drawn: 1 of 2 cases (case 1)." in page and "Drawn: 3 of 5 cases (cases 1, 2, 3)." in page
    # The torn transaction, an error, comes before G0's section, which is informational.
    assert page.index("<h2 id='torn-transaction'>") < page.index("<h2 id='G0'>")


def test_a_broker_diagnosis_shows_the_fetch_response_and_what_the_client_did_with_it():
    aborted = {"key": 7, "value": 1, "topic": "t", "partition": 0, "offset": 0, "status": "ok", "error": 0,
               "fate": "aborted", "log_fate": "aborted", "decided_by": [1, 3, 0], "marker": {"offset": 1,
                                                                                          "control": "abort"}}
    story = {
        "produces": [
            {"conn_id": 1, "correlation_id": 1, "copy": 0, "mono_ns": 1_000_000, "delivery_ns": 1_000_000,
             "response_ns": 2_000_000, "transactional_id": "tx-0", "producer_id": 1000, "txn_client": 1,
             "txn_broker": 1, "hazard": None, "rule": None, "action": None, "records": [aborted]},
            {"conn_id": 1, "correlation_id": 2, "copy": 0, "mono_ns": 2_500_000, "delivery_ns": 2_500_000,
             "response_ns": 2_600_000, "transactional_id": "tx-0", "producer_id": 1000, "txn_client": 1,
             "txn_broker": 1, "hazard": None, "rule": None, "action": None,
             "records": [dict(aborted, value=2, offset=None, status="error", error=47, fate=None, log_fate=None,
                              decided_by=None, marker=None)]},
        ],
        "end_txns": [{"conn_id": 1, "correlation_id": 3, "copy": 0, "mono_ns": 3_000_000, "delivery_ns": 3_000_000,
                      "response_ns": 4_000_000, "transactional_id": "tx-0", "txn_client": 1, "txn_broker": 1,
                      "end_txn_commit": False, "hazard": None, "rule": None, "action": None, "delivered": True,
                      "response_error_code": 0}],
        "fetches": [{"conn_id": 2, "correlation_id": 1, "mono_ns": 15_000_000, "latency_ms": 2.0, "client_id": "c-0",
                     "rule": None, "action": None, "topic": "t", "partition": 0, "last_stable_offset": 100,
                     "aborted_transactions": [], "records": [
                         {"offset": 0, "key": 7, "value": 1, "control": None, "producer_id": 1000,
                          "listed_aborted": False},
                         {"offset": 1, "key": None, "value": None, "control": "abort", "producer_id": 1000,
                          "listed_aborted": False}]}],
    }
    texts = _texts(sequence_svg(story, "G1a, case 1"))
    assert "Fetch response (conn 2, corr 1) @0..0" in texts
    assert "t[0], last stable offset 100" in texts and "aborted list: empty" in texts
    assert "serves aborted [7,1] with no aborted-list entry: the client keeps it" in texts
    assert "aborts [7,1]" in texts and "ABORT marker t[0] @1" in texts
    assert "Produce answer: no offset, INVALID_PRODUCER_EPOCH" in texts
