"""`kproxy analyze` end to end on literal files, through click's CliRunner."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kproxy.cli import main
from tests.test_wire_scenarios import torn_scenario


def test_help_documents_the_options_and_exit_codes():
    result = CliRunner().invoke(main, ["analyze", "--help"])
    assert result.exit_code == 0
    for text in ("--history", "--traces", "--out", "--master", "--quiet", "--isolation", "Exit codes:",
                 "1  invalid", "2  usage or input error", "3  internal error"):
        assert text in result.output


def test_a_missing_history_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["analyze", "--history", str(tmp_path / "nope.jsonl"), "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "history not found" in result.output


def test_missing_required_options_are_usage_errors():
    assert CliRunner().invoke(main, ["analyze", "--out", "x"]).exit_code == 2


@pytest.mark.spark
def test_analyze_finds_and_explains_the_torn_transaction(spark, tmp_path):
    history, traces = torn_scenario().write(tmp_path)
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["analyze", "--history", str(history), "--traces", str(traces),
                                       "--out", str(out), "--master", "local[2]"])
    assert result.exit_code == 1, result.output
    # The summary on stdout, progress on stderr.
    assert "kproxy analyze: INVALID" in result.stdout
    assert "torn-transaction" in result.stdout
    # The why block tells the torn transaction's cause in full (wrapped over lines).
    told = " ".join(result.stdout.split())
    assert ("torn-transaction: txn op 2 (process 0, tx-0, client aborted): records [7,2] [7,3] committed but [7,1]"
            " aborted; cause: the EndTxn(commit) of client txn 1, duplicated by rule 'torn' and delivered while"
            " broker txn 2 was open (conn 1, correlation id 3)") in told
    assert "[analyze] wire checks done" in result.stderr

    report = json.loads((out / "report.json").read_text())
    assert report["valid"] is False
    assert {"torn-transaction", "client-outcome-mismatch", "broker-aborted-read"} <= set(report["errors"])
    assert {"stale-end-txn", "late-produce"} <= set(report["informational"])
    [torn] = report["anomalies"]["torn-transaction"]
    [stale] = torn["stale_end_txns"]
    assert (stale["txn_client"], stale["txn_broker"], stale["end_txn_commit"], stale["rule"]) == (1, 2, True, "torn")
    # The history checks ran as well: the client failed the transaction, so
    # reading any of its values 1, 2, 3 is Jepsen's G1a, from the client's view.
    assert report["counts"]["G1a"] == 3
    assert report["stats"]["final_reads"] is False
    assert {r["api"] for r in report["stats"]["latency"]} == {"produce", "end_txn", "fetch"}
    html = (out / "report.html").read_text()
    assert html.count("data:image/png;base64,") >= 2 and "torn-transaction" in html
    # The torn transaction is drawn from its exchanges, fetched from the wire views after the checks.
    story = torn["wire_story"]
    [copy] = [e for e in story["end_txns"] if e["copy"] == 1]
    assert (copy["txn_client"], copy["txn_broker"], copy["hazard"], copy["rule"]) == (1, 2, "stale_end_txn", "torn")
    fates = {(r["key"], r["value"]): (r["fate"], r["decided_by"]) for p in story["produces"] for r in p["records"]}
    assert fates[(7, 2)] == fates[(7, 3)] == ("committed", [copy["conn_id"], copy["correlation_id"], 1])
    assert fates[(7, 1)][0] == "aborted"
    [late] = [p for p in story["produces"] if p["hazard"] == "late_produce"]
    assert (late["rule"], late["action"], late["txn_client"], late["txn_broker"]) == ("torn", "delay", 1, 2)
    assert "phases_s" in report["stats"] and "wire_stories" in report["stats"]["phases_s"]
    figure = html[html.index("id='draw-torn-transaction-1'"):]
    assert "copy 1: EndTxn(commit) client txn 1" in figure[:figure.index("</figure>")]
    assert "Drawn: 1 of 1 case" in html


@pytest.mark.spark
def test_analyze_of_a_clean_run_exits_zero_quietly(spark, tmp_path):
    history, _ = torn_scenario(stale=False, aborted_read=False).write(tmp_path)
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["analyze", "--history", str(history), "--out", str(out), "--quiet"])
    assert result.output == ""
    report = json.loads((out / "report.json").read_text())
    assert report["valid"] is True and report["errors"] == [] and result.exit_code == 0
