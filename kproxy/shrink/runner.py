"""`kproxy shrink`'s runs: the search of kproxy.shrink.search, judged by real demo runs.

One broker (started once, or the user's) and one Spark session serve every
candidate; each run makes its own topics (run_demo's fresh prefix). Against
the user's cluster, every run gets the same upstream TLS settings and client
settings (`--upstream-*`, `--client-config`), as `kproxy demo` would. A
candidate runs up to K times with the same seed and counts as reproducing at
its first run that shows the anomaly. Everything a run wrote stays under
DIR/candidates/N/run-R/, the candidate's rule file and workload beside it.
The best result so far is written after every step, so a stop at any point
(the budget, Ctrl-C, a crash) leaves DIR/minimal.yaml and DIR/shrink.json.
"""

from __future__ import annotations

import json
import re
import shlex
import shutil
import time
from collections.abc import Callable, Mapping
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import yaml

from kproxy.proxy_process import UpstreamTlsFiles
from kproxy.shrink.search import (
    Candidate, Floors, Result, Step, Stop, Verdict, Workload, anomaly_appears, attributed_rules, shrink,
)

DEFAULT_RUNS_PER_CANDIDATE = 1
DEFAULT_BUDGET_MINUTES = 30.0
# A run that fails (a client library crashing, say) rejects its candidate; this
# many in a row mean the set-up broke (the broker died) and the shrink ends.
MAX_FAILED_RUNS_IN_A_ROW = 3
# Kept candidates the final replay may back off through when the minimal does not show the anomaly again.
MAX_BACK_OFF = 3


class NotReproduced(Exception):
    """The starting run did not show the anomaly: nothing to shrink."""


@dataclass(frozen=True)
class ShrinkConfig:
    rules_file: Path
    anomaly: str
    out_dir: Path
    scenario: str = "torn-transaction"
    seed: int = 1
    bootstrap: str | None = None
    broker: str | None = None  # kind to start when no bootstrap is given (run_demo's default)
    runs_per_candidate: int = DEFAULT_RUNS_PER_CANDIDATE
    budget_s: float = DEFAULT_BUDGET_MINUTES * 60
    duration: float | None = None  # the starting workload's length (default: the scenario's)
    client: str = "confluent-kafka"
    floors: Floors = field(default_factory=Floors)
    max_candidates: int | None = None  # candidates to run, the starting one included; None: the budget decides
    upstream_tls: UpstreamTlsFiles | None = None  # TLS towards the bootstrap cluster, for every run's proxy
    client_config: Mapping[str, str] = field(default_factory=dict)  # every run's clients (SASL, say)


@dataclass
class ShrinkOutcome:
    result: Result | None
    summary: dict[str, Any]
    exit_code: int


def start_workload(config: ShrinkConfig) -> Workload:
    from kproxy.demo import profile_for

    profile = profile_for(config.scenario)
    return Workload(processes=profile.concurrency, duration=config.duration or profile.duration,
                    max_txn_length=profile.max_txn_length, keys=profile.key_count)


def replay_command(config: ShrinkConfig, workload: Workload, rules_path: Path) -> str:
    """`kproxy demo` with the shrunk rules and workload: the reproduction as one command line."""
    args = ["kproxy", "demo", "--scenario", config.scenario, "--rules", str(rules_path), "--seed", str(config.seed),
            "--processes", str(workload.processes), "--duration", _number(workload.duration),
            "--max-txn-length", str(workload.max_txn_length), "--keys", str(workload.keys)]
    if config.client != "confluent-kafka":
        args += ["--client", config.client]
    if config.bootstrap:
        args += ["--bootstrap", config.bootstrap]
    elif config.broker:
        args += ["--broker", config.broker]
    if config.upstream_tls is not None:
        args += config.upstream_tls.run_args()
    line = shlex.join(args)
    for key, value in config.client_config.items():
        # A secret is not written into the replay: the command reads it from the environment.
        setting = (shlex.quote(f"{key}=") + f'"${secret_variable(key)}"' if is_secret(key)
                   else shlex.quote(f"{key}={value}"))
        line += f" --client-config {setting}"
    return line


#: Client settings whose values are secrets (librdkafka's, the Java client's and kafka-python's names).
_SECRET_WORDS = ("password", "secret", "token", "jaas")


def is_secret(key: str) -> bool:
    return any(word in key.lower() for word in _SECRET_WORDS)


def secret_variable(key: str) -> str:
    """The environment variable the replay command reads a secret setting from: sasl.password -> SASL_PASSWORD."""
    return re.sub(r"[^A-Za-z0-9]+", "_", key).strip("_").upper()


def secret_variables(config: ShrinkConfig) -> list[str]:
    return [secret_variable(key) for key in config.client_config if is_secret(key)]


def _number(value: float) -> str:
    return str(int(value)) if float(value).is_integer() else str(value)


def rules_yaml(data: dict[str, Any], header: list[str] = ()) -> str:  # type: ignore[assignment]
    body = yaml.safe_dump(data, sort_keys=False, default_flow_style=False)
    return "".join(f"# {line}\n" if line else "#\n" for line in header) + body


def describe(candidate: Candidate) -> str:
    """One line: how big a candidate is."""
    n = len(candidate.rule_ids)
    w = candidate.workload
    phases = len((candidate.rules.get("schedule") or {}).get("phases") or ())
    return (f"{n} rule{'s' if n != 1 else ''}{f', {phases} phases' if phases else ''}, "
            f"{w.processes} process{'es' if w.processes != 1 else ''}, {_number(w.duration)} s, "
            f"txn <= {w.max_txn_length}, {w.keys} key{'s' if w.keys != 1 else ''}")


class _Runner:
    """The verdict callback: runs a candidate up to K times and records everything."""

    def __init__(self, config: ShrinkConfig, bootstrap: str, spark: Any, say: Callable[[str], None],
                 clock: Callable[[], float]) -> None:
        self.config = config
        self.bootstrap = bootstrap
        self.spark = spark
        self.say = say
        self.clock = clock
        self.started = clock()
        self.number = 0
        self.run_times: list[float] = []
        self.runs = 0
        self.failures = 0  # runs failed in a row
        self.require_rule = True
        self.best: Candidate | None = None
        self.best_run: Path | None = None  # the best candidate's run that showed the anomaly
        self.best_verdict: Verdict | None = None
        self.chain: list[tuple[Candidate, Verdict, Path | None]] = []  # every candidate kept, in order
        self.confirmed: bool | None = None  # None: not replayed (the search did not finish)
        self.replays: list[dict[str, Any]] = []
        self.on_step: Callable[[], None] = lambda: None

    def time_left(self) -> float:
        return self.config.budget_s - (self.clock() - self.started)

    def judge(self, candidate: Candidate, axis: str, change: str) -> Verdict:
        if self.config.max_candidates is not None and self.number >= self.config.max_candidates:
            raise Stop("candidate limit")
        number = self.number
        self.number += 1
        directory = self.config.out_dir / "candidates" / str(number)
        directory.mkdir(parents=True, exist_ok=True)
        rules_path = directory / "rules.yaml"
        rules_path.write_text(rules_yaml(dict(candidate.rules), [f"candidate {number} ({axis}): {change}"]))
        (directory / "workload.json").write_text(json.dumps(asdict(candidate.workload), indent=2) + "\n")
        self.say(f"candidate {number} ({axis}): {change}  [{describe(candidate)}]")
        runs: list[dict[str, Any]] = []
        hit_dir: Path | None = None
        for attempt in range(1, self.config.runs_per_candidate + 1):
            if number > 0 and self.run_times:
                expected = sum(self.run_times) / len(self.run_times)
                if self.time_left() < expected:
                    (directory / "verdict.json").write_text(json.dumps({"stopped": "budget", "runs": runs}, indent=2))
                    raise Stop("budget")
            run_dir = directory / f"run-{attempt}"
            began = self.clock()
            try:
                report = self._run(candidate, rules_path, run_dir)
            except Exception as exc:  # noqa: BLE001 - a failed run is a verdict, not the end of the shrink
                self.runs += 1
                self.failures += 1
                runs.append({"run": attempt, "dir": str(run_dir.relative_to(self.config.out_dir)), "count": 0,
                             "blamed_rules": [], "reproduced": False, "error": f"{type(exc).__name__}: {exc}",
                             "counts": {}})
                self.say(f"  run {attempt} failed: {type(exc).__name__}: {exc} (see {run_dir / 'demo.log'})")
                if number == 0 or self.failures >= MAX_FAILED_RUNS_IN_A_ROW:
                    raise
                continue
            self.failures = 0
            self.run_times.append(self.clock() - began)
            self.runs += 1
            count = report.get("counts", {}).get(self.config.anomaly, 0)
            blamed = sorted(attributed_rules(report, self.config.anomaly))
            appears = anomaly_appears(report, self.config.anomaly, self.require_rule)
            runs.append({"run": attempt, "dir": str(run_dir.relative_to(self.config.out_dir)), "count": count,
                         "blamed_rules": blamed, "reproduced": appears, "seconds": round(self.run_times[-1], 1),
                         "counts": {k: v for k, v in report.get("counts", {}).items() if v}})
            if appears:
                hit_dir = run_dir
                break
        hits = sum(r["reproduced"] for r in runs)
        verdict = Verdict(reproduced=hits > 0, runs=len(runs), hits=hits,
                          detail={"candidate": number, "runs": runs})
        (directory / "verdict.json").write_text(json.dumps(
            {"candidate": number, "axis": axis, "change": change, "reproduced": verdict.reproduced,
             "anomaly": self.config.anomaly, "runs": runs}, indent=2) + "\n")
        if verdict.reproduced:
            self.best, self.best_run, self.best_verdict = candidate, hit_dir, verdict
            self.chain.append((candidate, verdict, hit_dir))
        shown = ", ".join(f"{r['count']}{' (no rule blamed)' if r['count'] and not r['reproduced'] else ''}" for r in runs)
        best = describe(self.best) if self.best else "-"
        self.say(f"  -> {'kept' if verdict.reproduced else 'rejected'}: {self.config.anomaly} {shown} "
                 f"in {len(runs)} run{'s' if len(runs) != 1 else ''} | best: {best} | "
                 f"{max(self.time_left(), 0) / 60:.1f} min left")
        return verdict

    def run_arguments(self, candidate: Candidate, rules_path: Path) -> dict[str, Any]:
        """What every run of `candidate` hands run_demo, besides where it writes and what it says."""
        from kproxy.demo import WorkloadProfile, profile_for

        w = candidate.workload
        profile: WorkloadProfile = replace(profile_for(self.config.scenario), concurrency=w.processes,
                                           duration=w.duration, max_txn_length=w.max_txn_length, key_count=w.keys)
        return {"seed": self.config.seed, "bootstrap": self.bootstrap, "rules_file": rules_path, "spark": self.spark,
                "client": self.config.client, "profile": profile, "upstream_tls": self.config.upstream_tls,
                "client_config": dict(self.config.client_config)}

    def _run(self, candidate: Candidate, rules_path: Path, run_dir: Path) -> dict[str, Any]:
        from kproxy.demo import run_demo

        arguments = self.run_arguments(candidate, rules_path)
        run_dir.mkdir(parents=True, exist_ok=True)
        with open(run_dir / "demo.log", "w") as log:
            result = run_demo(self.config.scenario, run_dir, **arguments,
                              say=lambda line: print(line, file=log, flush=True), progress=False)
        return result.report


class EarlierShrinkError(ValueError):
    """The output directory holds an earlier shrink's candidates."""


def refuse_earlier_shrink(out_dir: Path) -> None:
    """Each candidate run judges every trace file in its directory, so an
    earlier shrink's candidates (an --out used again) would be judged with
    this one's histories; kproxy neither reuses nor deletes them."""
    candidates = out_dir / "candidates"
    if candidates.is_dir() and any(candidates.iterdir()):
        raise EarlierShrinkError(f"{out_dir} holds the candidates of an earlier shrink, whose traces would be judged"
                                 f" with this one's runs: choose another --out or remove {out_dir}")


def run_shrink(config: ShrinkConfig, *, spark: Any = None, say: Callable[[str], None] = print,
               clock: Callable[[], float] = time.monotonic) -> ShrinkOutcome:
    """Confirm the anomaly, shrink, write the results; see the module's doc."""
    from kproxy.faults.loader import load_rule_file
    from kproxy.faults.yaml_source import read_yaml

    if config.upstream_tls is not None and config.bootstrap is None:
        raise ValueError("TLS towards the broker needs a bootstrap address: the embedded brokers speak plaintext")
    refuse_earlier_shrink(config.out_dir)
    load_rule_file(config.rules_file)  # a bad file fails with file and line before anything starts
    data = read_yaml(config.rules_file.read_text(), str(config.rules_file)).data
    start = Candidate(rules=data, workload=start_workload(config))

    stop_broker: Callable[[], None] = lambda: None  # noqa: E731
    bootstrap = config.bootstrap
    if bootstrap is not None:
        from kproxy.brokers.identify import identify

        # No broker there, or a TLS handshake that fails: fail now, before anything is written.
        tls = config.upstream_tls.settings() if config.upstream_tls is not None else None
        identity = identify(bootstrap, tls=tls)
        config.out_dir.mkdir(parents=True, exist_ok=True)
        say(f"using the broker at {bootstrap}{' over TLS' if tls is not None else ''}: {identity.describe()}")
    else:
        from kproxy.brokers import start_broker
        from kproxy.demo import DEFAULT_BROKER

        config.out_dir.mkdir(parents=True, exist_ok=True)
        kind = config.broker or DEFAULT_BROKER
        config = replace(config, broker=kind)
        say(f"starting the embedded {kind} broker, shared by every candidate (log: {config.out_dir / 'broker.log'})")
        embedded = start_broker(kind=kind, log_path=config.out_dir / "broker.log")
        bootstrap, stop_broker = embedded.bootstrap, embedded.stop
    try:
        if spark is None:
            from kproxy.engine.client import status

            engine = status()
            if engine is not None:  # each candidate's analysis goes to it (kproxy.demo.run_demo)
                say(f"every candidate's analysis goes to the warm engine (pid {engine['pid']})")
            else:
                from kproxy_spark.session import get_session

                say("starting Spark, shared by every candidate's analysis")
                # A dozen analyses or more: the optimising JIT's cost in the first two is repaid from the
                # third on (docs/performance-analysis.md, "The fixed cost of a small analysis").
                spark = get_session(quick_start=False)
        runner = _Runner(config, bootstrap, spark, say, clock)
        return _shrink_with(config, start, runner)
    finally:
        stop_broker()


def _shrink_with(config: ShrinkConfig, start: Candidate, runner: _Runner) -> ShrinkOutcome:
    say = runner.say
    say(f"confirming {config.anomaly} with {config.rules_file} ({describe(start)}, seed {config.seed}, "
        f"up to {config.runs_per_candidate} run{'s' if config.runs_per_candidate != 1 else ''} a candidate, "
        f"budget {config.budget_s / 60:.1f} min)")
    # The starting run decides what "still appears" means: blamed on a rule if it was blamed on one there.
    runner.require_rule = False
    try:
        first = runner.judge(start, "start", "the rule file and workload as given")
    except KeyboardInterrupt:
        say("interrupted before the starting run finished: nothing to shrink")
        return ShrinkOutcome(None, {}, 130)
    start_runs = first.detail["runs"]
    if not first.reproduced:
        counts = start_runs[-1]["counts"]
        raise NotReproduced(
            f"{config.anomaly} did not appear in {len(start_runs)} run{'s' if len(start_runs) != 1 else ''} of "
            f"{config.rules_file} (seed {config.seed}); the run found: "
            f"{', '.join(f'{k} {v}' for k, v in sorted(counts.items())) or 'nothing'}. "
            f"Nothing to shrink: see {config.out_dir / 'candidates' / '0'}")
    runner.require_rule = bool(start_runs[-1]["blamed_rules"])
    say(f"{config.anomaly} appears ({start_runs[-1]['count']} cases"
        f"{', blamed on ' + ', '.join(start_runs[-1]['blamed_rules']) if runner.require_rule else ', no rule blamed'}); "
        f"shrinking")

    steps_so_far: list[Step] = [Step("start", "the rule file and workload as given", "kept", first)]
    partial = Result(start, start, [])

    def judge(candidate: Candidate, axis: str, change: str) -> Verdict:
        verdict = runner.judge(candidate, axis, change)
        partial.best = runner.best or start
        partial.steps.append(Step(axis, change, "kept" if verdict.reproduced else "rejected", verdict))
        write_results(config, runner, partial, steps_so_far, stopped="in progress")
        return verdict

    result = shrink(start, judge, floors=config.floors, require_rule=runner.require_rule)
    if result.stopped is None:
        _confirm(config, runner, result)
    summary = write_results(config, runner, result, steps_so_far, stopped=result.stopped)
    say(format_summary(summary))
    return ShrinkOutcome(result, summary, 130 if result.stopped == "interrupted" else 0)


def _confirm(config: ShrinkConfig, runner: _Runner, result: Result) -> None:
    """Replay the minimal candidate K times afresh, for its reproduction rate.

    A candidate is kept on one lucky run, and near the floors (one process,
    a few seconds) luck matters: the minimal found may not show the anomaly
    again. Then the shrink backs off to the candidate kept before it, up to
    MAX_BACK_OFF times, and the changes after the confirmed one are undone.
    """
    k = config.runs_per_candidate
    tried = 0
    for candidate, verdict, _ in reversed(runner.chain):
        if tried > MAX_BACK_OFF or verdict.detail.get("candidate", 0) == 0:
            break
        tried += 1
        number = verdict.detail["candidate"]
        candidate_dir = config.out_dir / "candidates" / str(number)
        runner.say(f"replaying candidate {number} {k} time{'s' if k != 1 else ''} [{describe(candidate)}]")
        runs: list[dict[str, Any]] = []
        first_hit: Path | None = None
        try:
            for attempt in range(1, k + 1):
                run_dir = candidate_dir / f"replay-{attempt}"
                report = runner._run(candidate, candidate_dir / "rules.yaml", run_dir)
                runner.runs += 1
                appears = anomaly_appears(report, config.anomaly, runner.require_rule)
                if appears and first_hit is None:
                    first_hit = run_dir
                runs.append({"run": attempt, "dir": str(run_dir.relative_to(config.out_dir)),
                             "count": report.get("counts", {}).get(config.anomaly, 0),
                             "blamed_rules": sorted(attributed_rules(report, config.anomaly)), "reproduced": appears})
        except KeyboardInterrupt:
            runner.say("interrupted: the minimal candidate is not confirmed")
            return
        hits = sum(r["reproduced"] for r in runs)
        runner.say(f"  -> {config.anomaly} in {hits} of {k} replay{'s' if k != 1 else ''}")
        runner.replays.append({"candidate": number, "runs": runs, "hits": hits})
        if hits:
            runner.best, runner.best_run, runner.confirmed = candidate, first_hit, True
            runner.best_verdict = Verdict(reproduced=True, runs=k, hits=hits, detail={"candidate": number, "runs": runs})
            result.best = candidate
            return
    runner.confirmed = False
    runner.say(f"no replay of the last {tried} kept candidates showed {config.anomaly}: keeping the smallest, "
               f"unconfirmed; try --runs-per-candidate 2 or more")


def write_results(config: ShrinkConfig, runner: _Runner, result: Result, first_steps: list[Step],
                  stopped: str | None) -> dict[str, Any]:
    """DIR/minimal.yaml, DIR/report.json (and .html) of the minimal run, DIR/replay.sh, DIR/shrink.json."""
    out = config.out_dir
    best = result.best
    minimal_path = out / "minimal.yaml"
    replay = replay_command(config, best.workload, minimal_path)
    verdict = runner.best_verdict
    rate = {"runs": verdict.runs, "hits": verdict.hits} if verdict else {"runs": 0, "hits": 0}
    replayed = next((r for r in runner.replays if verdict and r["candidate"] == verdict.detail.get("candidate")), None)
    if replayed is not None:
        rate = {"runs": len(replayed["runs"]), "hits": replayed["hits"]}
    how = {True: "fresh replays", False: "fresh replays: NOT CONFIRMED",
           None: "the run that kept it; not replayed"}[runner.confirmed]
    best_number = verdict.detail.get("candidate") if verdict else None
    # Changes kept after the candidate the replay confirmed were undone by backing off.
    kept = [s for s in result.steps if s.outcome == "kept"
            and (best_number is None or s.verdict is None or s.verdict.detail.get("candidate", 0) <= best_number)]
    undone = [s.change for s in result.steps if s.outcome == "kept" and s.change not in {k.change for k in kept}]
    header = [
        f"Shrunk by `kproxy shrink` from {config.rules_file}: reproduces {config.anomaly}"
        f"{' (blamed on a rule)' if runner.require_rule else ''} in {rate['hits']} of {rate['runs']} "
        f"run{'s' if rate['runs'] != 1 else ''} ({how}; seed {config.seed}).",
        f"Size: {describe(best)}.",
        "Replay:",
        f"  {replay}",
        "",
        "What the shrink removed:" if kept else "The shrink removed nothing.",
        *[f"  - {s.change}" for s in kept],
    ]
    minimal_path.write_text(rules_yaml(annotated(best.rules, kept), header))
    secrets = secret_variables(config)
    needs = f"# Set {', '.join(secrets)} in the environment first.\n" if secrets else ""
    (out / "replay.sh").write_text("#!/bin/sh\n# Reproduces " + config.anomaly + " with the shrunk rules and workload.\n"
                                   + needs + replay + "\n")
    if runner.best_run is not None:
        for name in ("report.json", "report.html"):
            if (runner.best_run / name).exists():
                shutil.copyfile(runner.best_run / name, out / name)
    steps = [_step_json(s) for s in [*first_steps, *result.steps]]
    summary = {
        "anomaly": config.anomaly,
        "scenario": config.scenario,
        "rules_file": str(config.rules_file),
        "seed": config.seed,
        "runs_per_candidate": config.runs_per_candidate,
        "budget_minutes": round(config.budget_s / 60, 2),
        "stopped": stopped,  # null: the search finished; budget; interrupted; in progress
        "blamed_on_a_rule": runner.require_rule,
        "elapsed_s": round(runner.clock() - runner.started, 1),
        "candidates": runner.number,
        "runs": runner.runs,
        "start": {"rules": result.start.rule_ids, "workload": asdict(result.start.workload)},
        "minimal": {"rules": best.rule_ids, "workload": asdict(best.workload), "rule_file": str(minimal_path),
                    "run": str(runner.best_run.relative_to(out)) if runner.best_run else None},
        # confirmed: the minimal showed the anomaly again in fresh replays (null: not replayed, the search stopped early).
        "reproduction": {**rate, "rate": round(rate["hits"] / rate["runs"], 3) if rate["runs"] else None,
                         "confirmed": runner.confirmed},
        "replays": runner.replays,
        "undone": undone,
        "replay": replay,
        "removed": [s.change for s in kept],
        "steps": steps,
    }
    (out / "shrink.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


def annotated(rules: Any, kept: list[Step]) -> dict[str, Any]:
    """The rule file with each changed rule's description saying what the shrink changed in it
    (its id and description were written for the rule as it was)."""
    out = json.loads(json.dumps(rules))
    for rule in out.get("rules", []):
        prefix = f"rule {rule['id']}: "
        changes = [s.change.removeprefix(prefix) for s in kept if s.change.startswith(prefix)]
        if changes:
            said = rule.get("description", "")
            rule["description"] = f"{said} [shrunk: {'; '.join(changes)}]".strip()
    return out


def _step_json(step: Step) -> dict[str, Any]:
    out: dict[str, Any] = {"axis": step.axis, "change": step.change, "outcome": step.outcome}
    if step.verdict is not None and step.verdict.detail:
        out["candidate"] = step.verdict.detail.get("candidate")
        out["runs"] = [{k: r[k] for k in ("run", "count", "blamed_rules", "reproduced", "error") if k in r}
                       for r in step.verdict.detail.get("runs", ())]
        out["counts"] = step.verdict.detail.get("runs", [{}])[-1].get("counts", {})
    if step.reason:
        out["reason"] = step.reason
    return out


def format_summary(summary: dict[str, Any]) -> str:
    rate = summary["reproduction"]
    start, minimal = summary["start"], summary["minimal"]
    lines = [
        f"shrink {'finished' if summary['stopped'] is None else 'stopped (' + summary['stopped'] + ')'} after "
        f"{summary['candidates']} candidates, {summary['runs']} runs, {summary['elapsed_s'] / 60:.1f} min",
        f"rules: {len(start['rules'])} -> {len(minimal['rules'])} ({', '.join(minimal['rules']) or 'none'})",
        "workload: " + ", ".join(f"{k} {start['workload'][k]} -> {minimal['workload'][k]}" for k in start["workload"]),
        f"{summary['anomaly']} reproduced in {rate['hits']} of {rate['runs']} "
        + {True: "fresh replays of the minimal candidate", False: "fresh replays: the minimal is NOT CONFIRMED",
           None: "runs (not replayed: the search stopped early)"}[rate["confirmed"]],
        f"minimal rule file: {minimal['rule_file']}",
        f"replay: {summary['replay']}",
    ]
    return "\n".join(lines)
