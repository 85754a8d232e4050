"""The wire verdict on what an application did through the proxy.

The analysis runs on the records-level trace alone: with no history, it
derives one from what the trace shows each client sent, was told and was
delivered (docs/analysis.md), then runs every check as `kproxy analyze`
does. `judge` runs it in this process (Spark starts once per process and
is reused); `Verdict` is its report with the questions a test asks.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


#: Spark settings for the trace of one test, a few hundred events: planning
#: shuffles and generating code cost far more than the work, so both are
#: turned down (the settings kproxy's own suite runs its analysis tests with,
#: tests/fixtures/spark.py). They apply when `judge` starts the session or
#: finds one running; a session given to it keeps its own.
SMALL_TRACE_CONF = {
    "spark.sql.shuffle.partitions": "1",
    "spark.default.parallelism": "1",
    "spark.sql.adaptive.enabled": "false",
    "spark.sql.codegen.wholeStage": "false",
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.autoBroadcastJoinThreshold": "-1",
    "spark.locality.wait": "0",
}


def judge(traces: Path | str, out_dir: Path | str, *, master: str = "local[*]", isolation: str = "auto",
          progress: Progress = _quiet, spark: Any = None, spark_conf: Mapping[str, str] | None = None,
          broker: Mapping[str, Any] | None = None) -> dict:
    """Analyse the trace in `traces` with no client history; write report.json and report.html to
    `out_dir` and return the report (kproxy_spark.jobs.analyze, whose errors it raises). `broker`: the
    report's broker section, when the caller knows it."""
    from kproxy_spark.jobs import InputError, analyze

    if spark is None and master == "local[*]":
        # A warm engine (kproxy engine start) answers in seconds what a Spark of our own takes a minute for;
        # its own settings apply.
        from kproxy.engine.client import EngineInputError, analyze_if_running

        try:
            report = analyze_if_running({"history": None, "traces": str(traces), "out": str(out_dir),
                                         "isolation": isolation, "broker": dict(broker) if broker else None},
                                        progress)
        except EngineInputError as exc:
            raise InputError(str(exc)) from None
        if report is not None:
            return report
    return analyze(None, str(traces), str(out_dir), master=master, isolation=isolation, progress=progress,
                   spark=spark, spark_conf=dict(spark_conf) if spark_conf else None,
                   broker=dict(broker) if broker else None)


@dataclass(frozen=True)
class Verdict:
    """A report of the analysis (report.json's dict), read as a test reads it."""

    report: Mapping[str, Any]
    out_dir: Path | None = None

    @classmethod
    def load(cls, report_json: Path | str) -> Verdict:
        path = Path(report_json)
        return cls(json.loads(path.read_text()), path.parent)

    @property
    def valid(self) -> bool:
        """True only when the analysis judged the run valid (not when it could not judge it)."""
        return self.report.get("valid") is True

    @property
    def unknown(self) -> bool:
        """The analysis could not judge the run (nothing to judge, or writes it could not see read)."""
        return self.report.get("valid") not in (True, False)

    @property
    def errors(self) -> dict[str, int]:
        """Error-level anomaly classes and how many cases of each."""
        counts = self.report.get("counts", {})
        return {name: int(counts.get(name, 0)) for name in self.report.get("errors", ())}

    @property
    def anomalies(self) -> dict[str, int]:
        """Every anomaly class present, errors and informational alike, with its case count."""
        counts = self.report.get("counts", {})
        return {name: int(counts.get(name, 0)) for name in self.report.get("anomaly_types", ())}

    @property
    def by_rule(self) -> dict[str, dict[str, int]]:
        """Per fault rule that acted: the anomaly classes whose cases the analysis attributes to it,
        with their counts (an empty dict: the rule acted and caused none)."""
        out: dict[str, dict[str, int]] = {}
        for row in self.report.get("stats", {}).get("fault_impact") or ():
            caused = out.setdefault(row["rule"], {})
            if row.get("anomaly") != "rule-effect":
                caused[row["anomaly"]] = caused.get(row["anomaly"], 0) + int(row.get("cases", 0))
        return out

    @property
    def rule_effects(self) -> dict[str, list[str]]:
        """Per fault rule that acted: its effect tags (`caused-anomalies`, `client-got-error`, ...)."""
        return {row["rule"]: list(row.get("effects") or ())
                for row in self.report.get("stats", {}).get("fault_impact") or ()
                if row.get("anomaly") == "rule-effect"}

    @property
    def causes(self) -> dict[str, dict[str, int]]:
        """Per anomaly class: its cases by cause (`rule:ID`, `broker:...`, `client:...`, `unexplained`)."""
        return {name: dict(by) for name, by in (self.report.get("stats", {}).get("causes") or {}).items()}

    def summary(self) -> str:
        """The summary `kproxy analyze` prints."""
        from kproxy_spark.report import format_summary

        return format_summary(self.report, str(self.out_dir) if self.out_dir is not None else None)

    def assert_valid(self) -> None:
        """Raise AssertionError, with the anomalies, an example of each and their causes, unless valid."""
        if self.valid:
            return
        head = ("the wire verdict could not judge this run" if self.unknown else
                "the wire verdict found " + ", ".join(f"{name} x{n}" for name, n in self.errors.items()))
        raise AssertionError(f"{head}\n{self.summary()}")

    def __repr__(self) -> str:
        state = "VALID" if self.valid else "UNKNOWN" if self.unknown else f"INVALID {self.errors}"
        return f"Verdict({state}{', ' + str(self.out_dir) if self.out_dir else ''})"
