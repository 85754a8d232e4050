"""`kproxy analyze` reads its history right or refuses it: never VALID on a history it misread.

Jepsen's checker accepts any key; a kproxy history holds integer keys (named
ones are numbered by `kproxy history import`). An aborted read on string keys
used to come out `VALID, no anomalies found`, exit 0: Spark read the keys as
null and dropped every micro-op.
"""

from __future__ import annotations

import pytest
from click.testing import CliRunner

from kproxy.cli import main
from tests.fixtures.spark import op, write_history


def aborted_read(key) -> list[dict]:
    """p0 writes 1 to `key` in a transaction that aborts; p1 reads it anyway (G1a)."""
    return [
        op(0, "invoke", "txn", [["send", key, 1]]),
        op(0, "fail", "txn", [["send", key, [0, 1]]], error="aborted"),
        op(1, "invoke", "poll", [["poll"]]),
        op(1, "ok", "poll", [["poll", {str(key): [[0, 1]]}]]),
    ]


def test_string_keys_are_refused_with_file_line_and_exit_2_before_spark(tmp_path):
    history = write_history(tmp_path / "named.jsonl", aborted_read("x"))
    result = CliRunner().invoke(main, ["analyze", "--history", history, "--out", str(tmp_path / "report")])
    assert result.exit_code == 2, result.output
    assert f"{history}:1: send micro-op key 'x' is not an integer" in result.output
    assert "kproxy history import" in result.output
    assert not (tmp_path / "report").exists()  # refused before any analysis started
    # The same rule as `kproxy history validate`.
    validated = CliRunner().invoke(main, ["history", "validate", history])
    assert validated.exit_code == 1 and f"{history}:1: send micro-op key 'x'" in validated.output


@pytest.mark.parametrize(("line", "text", "message"), [
    ('{"index":0,"time":1,"process":0,"type":"invoke","f":"poll","value":[["poll"]]}\nnot json\n', 2,
     "not valid JSON"),
    ('{"index":0,"time":1,"process":0,"type":"ok","f":"poll","value":[["poll",{"k":[[0,1]]}]]}\n', 1,
     "poll keys are the decimal text of integer keys, got 'k'"),
    ('{"index":0,"time":1,"process":0,"type":"invoke","f":"poll","value":[["poll"]]}\n'
     '{"index":5,"time":2,"process":0,"type":"ok","f":"poll","value":[["poll",{}]]}\n', 2, "index 5 out of sequence"),
])
def test_every_history_rule_fails_analyze_with_file_line(tmp_path, line, text, message):
    history = tmp_path / "bad.jsonl"
    history.write_text(line)
    result = CliRunner().invoke(main, ["analyze", "--history", str(history), "--out", str(tmp_path / "r")])
    assert result.exit_code == 2
    assert f"{history}:{text}: " in result.output and message in result.output


@pytest.mark.spark
def test_spark_refuses_string_keys_it_opens_itself(spark, tmp_path):
    """spark-submit and URL histories skip the CLI's check: the job fails rather than say VALID."""
    from kproxy_spark.jobs import analyze

    history = write_history(tmp_path / "named.jsonl", aborted_read("x"))
    with pytest.raises(Exception, match="history key is not an integer"):
        analyze(history, None, tmp_path / "report", spark=spark)


@pytest.mark.spark
def test_the_same_aborted_read_on_integer_keys_is_invalid(spark, tmp_path):
    from kproxy_spark.jobs import analyze

    history = write_history(tmp_path / "numbered.jsonl", aborted_read(7))
    report = analyze(history, None, tmp_path / "report", spark=spark)
    assert report["valid"] is False and "G1a" in report["errors"]


@pytest.mark.parametrize("name", ["trace-p1-20261127T000000-000000.jsonl", "old.jsonl.gz"])
def test_a_trace_newer_than_this_kproxy_is_refused_with_its_file_and_exit_2_before_spark(tmp_path, name):
    """A newer writer's trace is never read as if it were an older one (trace_schema.READABLE_VERSIONS)."""
    import gzip
    import json

    history = write_history(tmp_path / "h.jsonl", aborted_read(1))
    traces = tmp_path / "traces"
    traces.mkdir()
    event = json.dumps({"schema_version": 99, "direction": "request", "api": "produce"}).encode() + b"\n"
    (traces / name).write_bytes(gzip.compress(event) if name.endswith(".gz") else event)
    result = CliRunner().invoke(
        main, ["analyze", "--history", history, "--traces", str(traces), "--out", str(tmp_path / "report")]
    )
    assert result.exit_code == 2, result.output
    assert f"{traces / name}:1: trace schema version 99 is not one this kproxy reads" in result.output
    assert not (tmp_path / "report").exists()  # refused before any analysis started


def _with_a_line_spark_skips(path):
    write_history(path, aborted_read(7)[:2])
    with open(path, "a") as f:
        f.write("not json\n")


@pytest.mark.spark
@pytest.mark.parametrize(("write", "where"), [
    # Spark drops a line it cannot parse: the analysis runs to its end, and the check stops it there.
    (_with_a_line_spark_skips, "3: not valid JSON"),
    # Spark's reader refuses a named key itself: the check's line explains the failure.
    (lambda path: write_history(path, aborted_read("x")), "1: send micro-op key 'x' is not an integer"),
], ids=["spark-reads-past-it", "spark-fails-on-it"])
def test_a_large_historys_broken_line_is_refused_beside_the_analysis_and_nothing_is_written(
        spark, tmp_path, monkeypatch, write, where):
    from kproxy.cli import analyze as cli

    monkeypatch.setattr(cli, "CHECK_BESIDE_BYTES", 0)  # every history is "large"
    history = tmp_path / "big.jsonl"
    write(history)
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["analyze", "--history", str(history), "--out", str(out), "--master", "local[2]"])
    assert result.exit_code == 2, result.output
    assert "checking the history's lines beside the analysis" in result.output
    assert f"error: {history}:{where}" in result.output
    assert not (out / "report.json").exists() and not (out / "report.html").exists()


@pytest.mark.spark
def test_a_large_valid_history_checked_beside_the_analysis_gets_its_report(spark, tmp_path, monkeypatch):
    from kproxy.cli import analyze as cli

    monkeypatch.setattr(cli, "CHECK_BESIDE_BYTES", 0)
    history = write_history(tmp_path / "numbered.jsonl", aborted_read(7))
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["analyze", "--history", history, "--out", str(out), "--master", "local[2]"])
    assert result.exit_code == 1, result.output  # G1a: invalid, as checked first
    assert "checking the history's lines beside the analysis" in result.output
    assert "G1a" in (out / "report.json").read_text()
