"""report.json structure, the verdict rules, exit codes, the terminal summary and report.html."""

from __future__ import annotations

import base64
import html
import json
import re

import pytest

from kproxy_spark.html import render_html
from kproxy_spark.report import (
    EXIT_INVALID,
    EXIT_UNKNOWN,
    EXIT_VALID,
    build_report,
    exit_code,
    format_summary,
)

TORN_EXPLANATION = (
    "txn op 2 (process 0, tx-0, client aborted): records [7,2] [7,3] committed but [7,1] aborted; cause: the"
    " EndTxn(commit) of client txn 1, duplicated by rule 'torn' and delivered while broker txn 2 was open (conn 1,"
    " correlation id 3)"
)
TORN_CASE = {"index": 2, "time": 3_000_000, "committed": [[7, 2], [7, 3]], "aborted": [[7, 1]],
             "explanation": TORN_EXPLANATION}
STALE_CASE = {"conn_id": 1, "correlation_id": 3, "txn_client": 1, "txn_broker": 2, "mono_ns": 5_000_000, "rule": "torn"}
SKIP_CASES = [
    {"index": 7, "key": 1, "causes": ["read-in-aborted-txn", "reassigned"], "explanation": "process 0 skipped"},
    {"index": 9, "key": 1, "causes": ["read-in-aborted-txn"], "explanation": "process 1 skipped"},
    {"index": 11, "key": 2, "causes": [], "explanation": "process 2 skipped"},
]
LATENCY = [{"api": "produce", "responses": 10, "errors": 0, "p50_ms": 1.0, "p95_ms": 3.0, "p99_ms": 9.5,
            "max_ms": 12.0, "upstream_p99_ms": 4.0},
           {"api": "end_txn", "responses": 4, "errors": 0, "p50_ms": 2.0, "p95_ms": 250.0, "p99_ms": 300.0,
            "max_ms": 300.0, "upstream_p99_ms": 2.0}]


def _stats(**extra):
    return {"completed_ops": 12, "final_reads": True, "sends_acknowledged": 5, "history_start_ns": 0, **extra}


def test_report_structure_and_an_error_anomaly_make_it_invalid():
    cases = [dict(TORN_CASE, index=i) for i in range(60)]
    report = build_report(
        {"G1a": [], "unseen": []},
        {"torn-transaction": cases, "stale-end-txn": [STALE_CASE], "latency": LATENCY,
         "fault-impact": [{"rule": "torn", "anomaly": "torn-transaction", "cases": 60, "events": 3}]},
        _stats(),
    )
    assert report["schema_version"] == 1
    assert report["valid"] is False
    assert report["anomaly_types"] == ["stale-end-txn", "torn-transaction"]
    assert report["errors"] == ["torn-transaction"]
    assert report["informational"] == ["stale-end-txn"]
    assert report["counts"] == {"G1a": 0, "unseen": 0, "torn-transaction": 60, "stale-end-txn": 1}
    assert len(report["anomalies"]["torn-transaction"]) == 50  # bounded; the count keeps the total
    assert "G1a" not in report["anomalies"]
    # Tables that are not anomalies go to stats.
    assert "latency" not in report["counts"] and report["stats"]["latency"] == LATENCY
    assert report["stats"]["fault_impact"][0]["rule"] == "torn"
    json.dumps(report)  # JSON-ready as is
    assert exit_code(report) == EXIT_INVALID


def test_informational_and_allowed_anomalies_keep_it_valid():
    report = build_report({"int-send-skip": [{"index": 1}], "poll-skip": [{"index": 4}]},
                          {"stale-end-txn": [STALE_CASE], "ambiguous-error": [{"key": 9}]},
                          _stats(), allowed={"poll-skip"})
    assert report["valid"] is True and report["errors"] == []
    assert exit_code(report) == EXIT_VALID


def test_unseen_counts_only_after_final_reads():
    unseen = {"unseen": [{"key": 1, "value": 2}]}
    with_final = build_report(unseen, {}, _stats(final_reads=True))
    assert with_final["valid"] is False and with_final["errors"] == ["unseen"]
    without = build_report(unseen, {}, _stats(final_reads=False))
    assert without["valid"] == "unknown" and without["errors"] == []
    assert exit_code(without) == EXIT_UNKNOWN


def test_an_empty_history_or_an_incomplete_cycle_search_is_unknown():
    assert build_report({"G1a": []}, {}, _stats(completed_ops=0))["valid"] == "unknown"
    incomplete = build_report({"G1c": [], "cycle-search-incomplete": [{"edges": 3_000_000}]}, {}, _stats())
    assert incomplete["valid"] == "unknown" and incomplete["errors"] == []


def test_terminal_summary_names_each_anomaly_with_an_example():
    report = build_report({}, {"torn-transaction": [TORN_CASE], "stale-end-txn": [STALE_CASE], "latency": LATENCY},
                          _stats())
    text = format_summary(report, "out")
    assert text.splitlines()[0] == "kproxy analyze: INVALID (1 error anomaly)"
    assert re.search(r"torn-transaction\s+1\s+error\s+txn op 2 \(process 0, tx-0, client aborted\): records", text)
    assert re.search(r"stale-end-txn\s+1\s+info\s+\{\"conn_id\":1", text)
    assert "latency end_txn" in text and "p99 300.0 ms" in text
    assert "out/report.json, out/report.html" in text
    clean = format_summary(build_report({"G1a": []}, {}, _stats()))
    assert clean.startswith("kproxy analyze: VALID") and "no anomalies found" in clean


def test_terminal_summary_tells_the_first_case_of_each_explained_anomaly_in_full():
    late = {"explanation": "Produce of records [7,2] [7,3] in client txn 1 of tx-0 (producer 1000), delayed by rule"
                           " 'torn' and delivered while broker txn 2 was open (conn 1, correlation id 2)"}
    report = build_report({"poll-skip": SKIP_CASES}, {"late-produce": [late], "torn-transaction": [TORN_CASE],
                                                      "stale-end-txn": [STALE_CASE]}, _stats())
    lines = format_summary(report).splitlines()
    why = lines.index("  why (the first case of each, in full):")
    # One line per anomaly in the table above it; the story below, never cut short.
    assert all("why" not in line for line in lines[:why])
    story = lines[why + 1:lines.index(next(line for line in lines if line.startswith("  ops:")))]
    assert all(len(line) <= 100 for line in story)
    told = " ".join(line.strip() for line in story)
    assert told == (f"torn-transaction: {TORN_EXPLANATION} late-produce: {late['explanation']}"
                    " poll-skip: process 0 skipped")
    # A case without an explanation (the stale EndTxn here) is in the table only.
    assert "stale-end-txn:" not in told


def test_causes_are_counted_over_every_case_and_shown_under_their_anomaly():
    report = build_report({"poll-skip": SKIP_CASES}, {}, _stats(), max_cases=1)
    assert report["anomalies"]["poll-skip"] == SKIP_CASES[:1]
    assert report["stats"]["causes"] == {"poll-skip": {"read-in-aborted-txn": 2, "reassigned": 1, "unexplained": 1}}
    text = format_summary(report)
    assert re.search(r"poll-skip\s+3\s+error .*\n\s+causes: read-in-aborted-txn 2, reassigned 1, unexplained 1$",
                     text, re.MULTILINE)
    # Checks without causes add nothing.
    assert "causes" not in build_report({"G1a": [{"key": 1}]}, {}, _stats())["stats"]


@pytest.mark.spark
def test_causes_are_counted_beyond_the_cases_kept():
    cases = [{"index": i, "causes": ["read-in-aborted-txn"] if i % 3 else []} for i in range(60)]
    report = build_report({"poll-skip": cases}, {}, _stats())
    assert len(report["anomalies"]["poll-skip"]) == 50
    assert report["stats"]["causes"] == {"poll-skip": {"read-in-aborted-txn": 40, "unexplained": 20}}


def test_html_is_self_contained_with_plots_and_case_tables(tmp_path):
    stats = _stats(
        unseen_over_time=[{"time": t * 1_000_000_000, "unseen": u} for t, u in [(1, 3), (2, 5), (3, 0)]],
        phases=[{"rule": "torn", "actions": ["duplicate"], "start_ns": 1_500_000_000, "end_ns": 2_500_000_000}],
        trace_clock_offset_ns=1_000_000_000,
        txn_outcomes=[{"bucket_start_ns": 0, "bucket_ns": 1_000_000_000, "type": "ok", "count": 4},
                      {"bucket_start_ns": 1_000_000_000, "bucket_ns": 1_000_000_000, "type": "fail", "count": 1}],
        end_txn_outcomes=[{"transactional_id": "tx-0", "txn_broker": 1, "commits": 0, "aborts": 1, "stale": 0},
                          {"transactional_id": "tx-0", "txn_broker": 2, "commits": 1, "aborts": 0, "stale": 1}],
    )
    report = build_report({}, {"torn-transaction": [TORN_CASE], "stale-end-txn": [STALE_CASE],
                               "latency": LATENCY}, stats)
    page = render_html(report)
    assert "http://" not in page and "https://" not in page  # nothing fetched from elsewhere
    images = re.findall(r"src='data:image/png;base64,([^']+)'", page)
    assert len(images) == 3  # timeline, latency, outcomes
    for i, image in enumerate(images):
        png = base64.b64decode(image)
        assert png.startswith(b"\x89PNG")
        (tmp_path / f"plot{i}.png").write_bytes(png)
    assert "INVALID" in page
    assert "<h2 id='torn-transaction'>" in page and html.escape(TORN_EXPLANATION) in page
    assert "[[7, 2]" not in page  # the fields stay in report.json
    assert "rule torn" not in page  # legends are inside the images, not the HTML


def test_html_without_traces_or_cases_still_renders():
    page = render_html(build_report({"G1a": []}, {}, _stats()))
    assert "VALID" in page and "<img" not in page
