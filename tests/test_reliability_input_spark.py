"""Jepsen's `empty-history` test through the whole analysis: nothing judged is `unknown`, not VALID.

Jepsen's Kafka checker test `empty-history-test` (one process assigns a key,
nothing is sent or read) expects the checker not to call it valid. kproxy
used to report `valid: true` and exit 0. The verdict is now `unknown`
(exit 4), with the reason in `stats.unknown_reason` and in the summary.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from kproxy.cli import main

EMPTY_HISTORY_EDN = """\
{:index 0, :time 0, :type :invoke, :process 0, :f :assign, :value [:x]}
{:index 1, :time 1, :type :ok, :process 0, :f :assign, :value [:x]}
"""


@pytest.mark.spark
def test_jepsens_empty_history_is_unknown_with_exit_4(spark, tmp_path):
    edn = tmp_path / "empty-history.edn"
    edn.write_text(EMPTY_HISTORY_EDN)
    history = tmp_path / "history.jsonl"
    imported = CliRunner().invoke(main, ["history", "import", str(edn), "-o", str(history)])
    assert imported.exit_code == 0, imported.output
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["analyze", "--history", str(history), "--out", str(out),
                                       "--master", "local[2]"])
    assert result.exit_code == 4, result.output
    assert result.stdout.startswith("kproxy analyze: UNKNOWN\n  why unknown: no send and no poll completed")
    report = json.loads((out / "report.json").read_text())
    assert report["valid"] == "unknown" and report["errors"] == [] and report["anomaly_types"] == []
    assert report["stats"]["completed_ops"] == 1
    assert report["stats"]["unknown_reason"].startswith("no send and no poll completed")
