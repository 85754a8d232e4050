#!/usr/bin/env python3
"""Which Apache Kafka versions and clients still tear a transaction, and does `--guard` protect them?

Runs `kproxy demo`'s scenario runner against real Kafka clusters, one cell
per (broker configuration, client, scenario, guard, seed), and appends one
JSON line per cell to OUT/cells.jsonl; `--table` prints docs/kafka-versions.md's
tables from it.

    scripts/kafka-matrix.py --out matrix-out            # the full matrix, most telling cells first
    scripts/kafka-matrix.py --brokers 4.4.0:tv2 --clients franz-go,sarama --scenarios torn-transaction
    scripts/kafka-matrix.py --out matrix-out --table    # the Markdown tables
    scripts/kafka-matrix.py --out matrix-out --reanalyze  # every cell's analysis again, with this checkout's
    scripts/kafka-matrix.py --out matrix-out --reanalyze 2026-11-27T12:10  # only cells started before then

A broker configuration is VERSION or VERSION:tvN (transaction.version N,
4.x only; plain VERSION is the version's default: 2 on 4.x). Each cluster is
a single KRaft node, started once per run of consecutive cells on it; every
cell uses fresh topics and transactional ids. The Java client is
kafka-clients at the default version (kproxy.kafka.jars.DEFAULT_VERSION)
against every broker.

Cells run in order of what they tell: torn-transaction on the first broker
rows (4.4.0 with transaction version 2 and 0) for every client, with and
without the guard; then the other rows; then the torn-transaction cells'
further seeds (`--seeds`); then the other scenarios. A cell already in
OUT/cells.jsonl is skipped, so an interrupted run resumes where it stopped;
`--stop-at` starts no cell after a given UTC time. Each cell keeps, from its
trace (scripts/matrix_wire.py), the versions of the transactional requests
the client sent and whether its epoch moved at each commit, the broker's
answers to the rule's copies, and the analysis's findings with their causes.
"""

from __future__ import annotations

import argparse
import collections
import datetime
import importlib.metadata
import json
import os
import re
import signal
import sys
import time
from pathlib import Path
from typing import Any

# The checkout's kproxy (repository root), kproxy_spark (spark/) and matrix_wire (this folder).
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "spark"), str(Path(__file__).resolve().parent)]

from matrix_wire import FENCING_ERRORS, read_cell, speaks_tv2, why

from kproxy.demo import run_demo
from kproxy.kafka.kraft import start_cluster

BROKERS = ["4.4.0:tv2", "4.4.0:tv0", "3.6.2", "3.9.1"]
CLIENTS = ["java", "franz-go", "confluent-kafka", "kafka-python", "sarama", "aiokafka"]
SCENARIOS = ["torn-transaction", "stale-abort", "late-produce", "healthy"]
TORN = "torn-transaction"
WATCHED = ["torn-transaction", "client-outcome-mismatch", "G1a", "lost-write", "duplicate", "poll-skip",
           "precommitted-read", "stale-end-txn", "late-produce", "broker-aborted-read"]
# What a torn or thrown-away transaction shows as; a guarded cell with none of these is whole.
DAMAGE = ["torn-transaction", "client-outcome-mismatch", "G1a", "lost-write", "precommitted-read"]
CLIENT_NAMES = {"java": "Java", "franz-go": "franz-go", "confluent-kafka": "librdkafka (confluent-kafka)",
                "kafka-python": "kafka-python", "sarama": "Sarama", "aiokafka": "aiokafka"}


def parse_broker(spec: str) -> tuple[str, int | str | None]:
    version, _, tv = spec.partition(":tv")
    return version, (int(tv) if tv else "default")


def client_version(client: str) -> str:
    """The library version a cell's client ran, as installed or pinned here."""
    if client == "java":
        from kproxy.workload.clients.java import client_version as java_version

        return java_version()
    if client in ("franz-go", "sarama"):
        module = {"franz-go": "github.com/twmb/franz-go", "sarama": "github.com/IBM/sarama"}[client]
        go_mod = (ROOT / "kproxy/workload/clients/go_bridge/go.mod").read_text()
        found = re.search(rf"^\s*{re.escape(module)} (v\S+)", go_mod, re.MULTILINE)
        return found.group(1) if found else "?"
    return importlib.metadata.version(client)


def client_errors(history: Path) -> dict[str, int]:
    """Errors the clients reported (fail and info completions), by name, aborts on purpose left out."""
    out: collections.Counter[str] = collections.Counter()
    if not history.is_file():
        return {}
    with open(history) as lines:
        for line in lines:
            op = json.loads(line)
            if op.get("type") in ("fail", "info") and op.get("error") and op["error"] != "aborted":
                out[str(op["error"])] += 1
    return dict(out.most_common(4))


def cell_key(cell: dict[str, Any]) -> tuple:
    return (cell["broker"], cell["client"], cell["scenario"], bool(cell["guard"]), int(cell.get("seed", 1)))


def cell_name(key: tuple) -> str:
    broker, client, scenario, guard, seed = key
    return f"{broker.replace(':', '-')}_{client}_{scenario}{'_guard' if guard else ''}_s{seed}"


def plan(brokers: list[str], clients: list[str], scenarios: list[str], guards: list[bool],
         seeds: list[int]) -> list[tuple]:
    """Every cell, most telling first (see the module's docstring)."""
    cells = []
    for b, broker in enumerate(brokers):
        for c, client in enumerate(clients):
            for s, scenario in enumerate(scenarios):
                for seed in (seeds if scenario == TORN else seeds[:1]):
                    for guard in guards:
                        if scenario == TORN:
                            phase = 0 if seed == seeds[0] else 1
                        else:
                            # The rule-free control under the guard (nothing to refuse) comes last.
                            phase = 3 if scenario == "healthy" and guard else 2
                        cells.append(((phase, b, s, seed, c, guard), (broker, client, scenario, guard, seed)))
    return [key for _, key in sorted(cells)]


def set_aside_interrupted(cell_dir: Path, say) -> None:
    """A cell not in cells.jsonl whose directory exists was interrupted
    (the script stopped mid-run): move what it left aside, as the demo
    refuses to judge a new run with an earlier run's traces."""
    if not cell_dir.exists():
        return
    n = 1
    while (aside := cell_dir.with_name(f"{cell_dir.name}.interrupted-{n}")).exists():
        n += 1
    cell_dir.rename(aside)
    say(f"{cell_dir.name}: an interrupted earlier attempt moved to {aside.name}")


def run_cell(bootstrap: str, out_dir: Path, client: str, scenario: str, guard: bool, seed: int,
             duration: float, spark) -> dict:
    result = run_demo(scenario, out_dir, guard=guard, seed=seed, duration=duration, bootstrap=bootstrap,
                      client=client, spark=spark, progress=False, say=lambda _: None)
    return analysis_fields(out_dir, result.report)


def analysis_fields(out_dir: Path, report: dict) -> dict:
    """What a cell keeps of its analysis and its trace."""
    counts = report.get("counts", {})
    impact = report.get("stats", {}).get("fault_impact") or []
    return {
        "valid": report.get("valid"),
        "errors": report.get("errors", []),
        "counts": {k: counts.get(k, 0) for k in WATCHED},
        "attributed": sorted({f"{i['anomaly']}: {i['cases']}" for i in impact if i.get("cases")}),
        **read_cell(out_dir, report),
    }


def _unexplained(cell: dict) -> bool:
    return any(cause.startswith("unexplained")
               for found in cell.get("findings", {}).values() for cause in found.get("causes") or {})


def reanalyze(out: Path, before: str, say) -> int:
    """Analyse the cells of OUT/cells.jsonl started before `before` (ISO UTC) again from the history and
    traces their runs left, with this checkout's analysis, and rewrite their analysis fields (the run's own
    fields stay): cells run before a change to the analysis then read as the later ones do. Each cell keeps
    when it was re-analysed."""
    from kproxy_spark.jobs import analyze
    from kproxy_spark.report import write_json
    from kproxy_spark.session import get_session

    results = out / "cells.jsonl"
    cells = [json.loads(line) for line in results.read_text().splitlines() if line.strip()]
    spark = get_session(master="local[2]", app_name="kproxy-kafka-matrix",
                        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"})
    began = time.monotonic()
    # Cells with a finding the analysis could not explain first: a change to the analysis is likeliest to
    # move those, and a stopped re-analysis has then done them.
    order = sorted(cells, key=lambda cell: not _unexplained(cell))
    try:
        for n, cell in enumerate(order, 1):
            cell_dir = out / cell_name(cell_key(cell))
            if cell["started"] >= before:
                continue
            if "failed" in cell or not (cell_dir / "history.jsonl").is_file():
                say(f"[{n}/{len(cells)}] {cell_dir.name}: kept as it was (no run to analyse)")
                continue
            old = cell.get("findings", {})
            broker = json.loads((cell_dir / "report.json").read_text()).get("broker")
            report = analyze(str(cell_dir / "history.jsonl"), str(cell_dir / "traces"), str(cell_dir), spark=spark)
            if broker is not None:  # what the demo's run knew of the broker, which the analysis alone does not
                report["broker"] = broker
                write_json(report, str(cell_dir / "report.json"))
            cell.update(analysis_fields(cell_dir, report))
            cell["reanalyzed"] = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
            new = cell.get("findings", {})
            say(f"[{n}/{len(cells)}] {cell_dir.name}: {'same findings and causes' if new == old else f'{old} -> {new}'}")
            # Rewritten after each cell: a stopped re-analysis keeps what it did.
            tmp = results.with_suffix(".tmp")
            tmp.write_text("".join(json.dumps(c) + "\n" for c in cells))
            tmp.replace(results)
    finally:
        spark.stop()
    say(f"re-analysis ended after {time.monotonic() - began:.0f} s: {results}")
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", default=",".join(BROKERS))
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--guard", choices=["both", "off", "on"], default="both")
    parser.add_argument("--seeds", default="1,2,3", help="seeds of the torn-transaction cells; the others run the first")
    parser.add_argument("--duration", type=float, default=8.0, help="workload seconds per cell")
    parser.add_argument("--out", type=Path, default=Path("matrix-out"))
    parser.add_argument("--stop-at", help="UTC time HH:MM after which no cell starts (the one running finishes)")
    parser.add_argument("--table", action="store_true", help="only print the Markdown tables of OUT/cells.jsonl")
    parser.add_argument("--reanalyze", nargs="?", const="9999", metavar="BEFORE",
                        help="analyse the cells of OUT/cells.jsonl again (those started before BEFORE, an ISO UTC "
                             "time, when given), from the history and traces their runs left, with this checkout's "
                             "analysis; runs no cell")
    args = parser.parse_args()
    results = args.out / "cells.jsonl"
    if args.table:
        print(tables([json.loads(line) for line in results.read_text().splitlines() if line.strip()]), end="")
        return 0
    if args.reanalyze:
        return reanalyze(args.out, args.reanalyze, lambda text: print(text, file=sys.stderr, flush=True))

    guards = {"both": [False, True], "off": [False], "on": [True]}[args.guard]
    cells = plan(args.brokers.split(","), args.clients.split(","), args.scenarios.split(","), guards,
                 [int(s) for s in args.seeds.split(",")])
    done = set()
    if results.is_file():
        done = {cell_key(json.loads(line)) for line in results.read_text().splitlines() if line.strip()}
    todo = [key for key in cells if key not in done]
    stop_at = None
    if args.stop_at:
        hour, minute = map(int, args.stop_at.split(":"))
        now = datetime.datetime.now(datetime.UTC)
        stop_at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    say = lambda text: print(text, file=sys.stderr, flush=True)
    say(f"{len(todo)} cells to run ({len(cells) - len(todo)} of {len(cells)} already in {results})")
    if not todo:
        return 0

    # SIGTERM unwinds like Ctrl-C, so the proxy and the Kafka node of the cell in progress are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    from kproxy_spark.session import get_session

    spark = get_session(master="local[2]", app_name="kproxy-kafka-matrix",
                        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"})
    args.out.mkdir(parents=True, exist_ok=True)
    began = time.monotonic()
    cluster, cluster_spec = None, None
    try:
        for n, key in enumerate(todo, 1):
            if stop_at is not None and datetime.datetime.now(datetime.UTC) >= stop_at:
                say(f"stopping at {args.stop_at} UTC: {len(todo) - n + 1} cells not run")
                break
            broker, client, scenario, guard, seed = key
            if broker != cluster_spec:
                if cluster is not None:
                    cluster.stop()
                    cluster = None
                version, tv = parse_broker(broker)
                cluster_spec = broker
                cluster = start_cluster(version, transaction_version=tv,
                                        work_dir=args.out / f"kafka-{broker.replace(':', '-')}", say=say)
            name = cell_name(key)
            cell: dict[str, Any] = {
                "broker": broker, "kafka": cluster.version, "transaction_version": cluster.transaction_version,
                "client": client, "client_version": client_version(client), "scenario": scenario, "guard": guard,
                "seed": seed, "started": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
                "load_start": round(os.getloadavg()[0], 1),
            }
            set_aside_interrupted(args.out / name, say)
            started = time.monotonic()
            try:
                cell.update(run_cell(cluster.bootstrap, args.out / name, client, scenario, guard, seed,
                                     args.duration, spark))
            except Exception as exc:  # noqa: BLE001 - a cell that cannot run is a finding too; say why
                cell["failed"] = f"{type(exc).__name__}: {exc}"
            cell["client_errors"] = client_errors(args.out / name / "history.jsonl")
            cell["report"] = f"{name}/report.json"
            cell["seconds"] = round(time.monotonic() - started, 1)
            cell["load_end"] = round(os.getloadavg()[0], 1)
            with open(results, "a") as out:
                out.write(json.dumps(cell) + "\n")
            say(f"[{n}/{len(todo)}] {name}: {cell.get('errors', cell.get('failed'))}; "
                f"{why(cell.get('wire', {}))}; copies {cell.get('copies')} "
                f"({cell['seconds']} s, load {cell['load_start']}-{cell['load_end']})")
    finally:
        if cluster is not None:
            cluster.stop()
        spark.stop()
    say(f"matrix run ended after {time.monotonic() - began:.0f} s: {results}")
    return 0


# ---- the tables of docs/kafka-versions.md ----------------------------------------------------------

def _fmt(counter: dict[str, int] | None) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted((counter or {}).items(), key=lambda kv: -kv[1])) or "-"


def _versions(wire: dict[str, Any], api: str) -> str:
    found = wire.get("versions", {}).get(api)
    return "v" + "/".join(map(str, found)) if found else "none"


def _span(values: list[int]) -> str:
    return str(values[0]) if min(values) == max(values) else f"{min(values)}-{max(values)}"


def _stale_answers(cells: list[dict[str, Any]], api: str) -> collections.Counter[str]:
    total: collections.Counter[str] = collections.Counter()
    for cell in cells:
        total.update(cell.get("copies", {}).get(api) or {})
    return total


def _rule_caused(cells: list[dict[str, Any]]) -> dict[str, int]:
    """Cases of the data anomalies that the analysis blamed on the rule, summed over cells."""
    total: collections.Counter[str] = collections.Counter()
    for cell in cells:
        for name, found in cell.get("findings", {}).items():
            if name in DAMAGE:
                total[name] += sum(n for cause, n in found["causes"].items() if cause.startswith("rule"))
    return {name: n for name, n in total.items() if n}


def summary_cell(cells: list[dict[str, Any]], scenario: str, *, short: bool = False) -> str:
    """One client's cell of a broker row for one scenario: finding, broker's answer, versions, guard.

    short: the finding, the EndTxn versions and the guard's verdict only.
    """
    off = [c for c in cells if not c["guard"]]
    on = [c for c in cells if c["guard"]]
    failed = [c for c in cells if "failed" in c]
    ran_off = [c for c in off if "failed" not in c]
    if not ran_off:
        if failed:
            return f"could not run: {failed[0]['failed'][:160]}"
        return "not run in time"
    api = "produce" if scenario == "late-produce" else "end_txn"
    answers = _stale_answers(ran_off, api)
    fenced = sum(v for k, v in answers.items() if set(k.split()) & FENCING_ERRORS)
    # Fenced: the broker refused the stale copies for their epoch and took none (a copy that met the next
    # transaction's commit in progress is answered CONCURRENT_TRANSACTIONS, whatever the protocol).
    taken = answers.get("accepted (NONE)", 0) + answers.get("accepted and appended", 0)
    broker_fenced = fenced > 0 and taken == 0
    watched = {"torn-transaction": "torn-transaction", "stale-abort": "client-outcome-mismatch",
               "late-produce": "late-produce", "healthy": None}[scenario]
    parts = []
    if watched == "torn-transaction":
        torn = [c["counts"].get(TORN, 0) for c in ran_off]
        runs = f"{len(ran_off)} run{'s' if len(ran_off) > 1 else ''}"
        if any(torn):
            parts.append(f"**torn** in {sum(1 for t in torn if t)} of {runs} "
                         f"({_span(torn)} case{'' if max(torn) == 1 else 's'})")
        elif broker_fenced:
            parts.append(f"**fenced**, nothing torn ({runs})")
        elif taken and _rule_caused(ran_off):
            # The stale commit decided a whole transaction the client aborted (or read past), not half of one.
            parts.append(f"**stale commit taken**, no torn-transaction case ({runs}); "
                         f"from the rule: {_fmt(_rule_caused(ran_off))}")
        else:
            parts.append(f"no torn case ({runs}); from the rule: {_fmt(_rule_caused(ran_off))}")
    elif watched == "client-outcome-mismatch":
        lost = [c["counts"].get("client-outcome-mismatch", 0) + c["counts"].get("lost-write", 0) for c in ran_off]
        parts.append(f"**mismatch/lost** ({_span(lost)})" if any(lost)
                     else ("**fenced**" if broker_fenced else "no lost write"))
        if _rule_caused(ran_off):
            parts.append(f"from the rule: {_fmt(_rule_caused(ran_off))}")
    elif watched == "late-produce":
        damage = [sum(c["counts"].get(d, 0) for d in DAMAGE) for c in ran_off]
        parts.append(f"**damage** ({_span(damage)})" if any(damage) else "no data anomaly")
    else:
        # The control's findings, with who the analysis blamed (client, broker, unexplained).
        found: dict[str, collections.Counter[str]] = collections.defaultdict(collections.Counter)
        for c in ran_off:
            for name, f in c.get("findings", {}).items():
                for cause, n in f["causes"].items():
                    found[name][cause.split(":")[0]] += n
        parts.append("valid" if not found else ", ".join(
            f"{name} {sum(by.values())} ({_fmt(dict(by))})" for name, by in sorted(found.items())))
    if watched is not None:
        parts.append(f"copies: {_fmt(dict(answers))}")
    wire = ran_off[0].get("wire", {})
    parts.append(f"EndTxn {_versions(wire, 'end_txn')}, Produce {_versions(wire, 'produce')}")
    parts.append(why(wire).split(":")[0] + (" (epoch moved at every commit)" if speaks_tv2(wire) else ""))
    guard_verdict = None
    if watched is not None:
        ran_on = [c for c in on if "failed" not in c]
        if not ran_on:
            guard_verdict = f"could not run ({on[0]['failed'][:80]})" if on else "not run in time"
            parts.append(f"guard: {guard_verdict}")
        else:
            damage = [sum(c["counts"].get(d, 0) for d in DAMAGE) for c in ran_on]
            refused = _stale_answers(ran_on, api)
            verdict = "whole" if not any(damage) else f"**damage left** ({_span(damage)})"
            guard_runs = f"{len(ran_on)} run{'s' if len(ran_on) > 1 else ''}"
            guard_verdict = f"{verdict} ({guard_runs})"
            parts.append(f"guard: {verdict}, copies {_fmt(dict(refused))} ({guard_runs})")
    if short:
        tv2 = " + epoch bump" if speaks_tv2(wire) else ""
        verdict = parts[0].split(";")[0].replace(", no torn-transaction case", "")
        return f"{verdict}; EndTxn {_versions(wire, 'end_txn')}{tv2}" + (f"; guard: {guard_verdict}" if guard_verdict else "")
    return "; ".join(parts)


def tables(cells: list[dict[str, Any]]) -> str:
    brokers = list(dict.fromkeys(c["broker"] for c in cells))
    clients = [c for c in CLIENTS if any(cell["client"] == c for cell in cells)]
    versions = {c["client"]: c.get("client_version", "?") for c in cells}
    header = ["| Kafka | " + " | ".join(f"{CLIENT_NAMES[c]} {versions.get(c, '')}" for c in clients) + " |",
              "|---|" + "---|" * len(clients)]
    out = ["### In short: torn-transaction\n", *header]
    torn = [c for c in cells if c["scenario"] == TORN]
    for broker in brokers:
        row = [summary_cell([c for c in torn if c["broker"] == broker and c["client"] == client], TORN, short=True)
               for client in clients]
        out.append(f"| {broker.replace(':tv', ' TV')} | " + " | ".join(row) + " |")
    out.append("")
    for scenario in SCENARIOS:
        mine = [c for c in cells if c["scenario"] == scenario]
        if not mine:
            continue
        out.append(f"### {scenario}\n")
        out.extend(header)
        for broker in brokers:
            row = [summary_cell([c for c in mine if c["broker"] == broker and c["client"] == client], scenario)
                   for client in clients]
            out.append(f"| {broker.replace(':tv', ' TV')} | " + " | ".join(row) + " |")
        out.append("")
    out.append("### Every cell\n")
    out.append("| Kafka | client | scenario | guard | seed | errors (cases) and causes | stale EndTxn copies | "
               "Produce copies | EndTxn | Produce | AddPartitionsToTxn | TxnOffsetCommit | epoch at commits "
               "(moved/same/re-init) | client errors | s | load |")
    out.append("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for c in cells:
        head = (f"| {c['broker']} | {c['client']} | {c['scenario']} | {'on' if c['guard'] else 'off'} | "
                f"{c.get('seed', 1)} |")
        load = f"{c.get('load_start', '?')}-{c.get('load_end', '?')}"
        if "failed" in c:
            out.append(f"{head} could not run: {c['failed'][:200]} | | | | | | | | {_fmt(c.get('client_errors'))} | "
                       f"{c.get('seconds', '')} | {load} |")
            continue
        found = "; ".join(f"{name} {f['cases']} ({_fmt(f['causes'])})" for name, f in c.get("findings", {}).items())
        wire = c.get("wire", {})
        epoch = wire.get("epoch", {}).get("commit", {})
        out.append(f"{head} {found or 'none (valid)'} | {_fmt(c['copies'].get('end_txn'))} | "
                   f"{_fmt(c['copies'].get('produce'))} | {_versions(wire, 'end_txn')} | {_versions(wire, 'produce')} | "
                   f"{_versions(wire, 'add_partitions_to_txn')} | {_versions(wire, 'txn_offset_commit')} | "
                   f"{epoch.get('moved', 0)}/{epoch.get('same', 0)}/{epoch.get('reinitialised', 0)} | "
                   f"{_fmt(c.get('client_errors'))} | {c.get('seconds', '')} | {load} |")
    return "\n".join(out) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
