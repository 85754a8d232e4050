#!/usr/bin/env python3
"""Which Apache Kafka versions and clients still tear a transaction, and does `--guard` protect them?

Runs `kproxy demo`'s scenario runner against real Kafka clusters, one cell
per (broker configuration, client, scenario, guard), and writes one JSON line
per cell plus a Markdown table (docs/kafka-versions.md is written from it).

    scripts/kafka-matrix.py --out matrix-out            # the full matrix
    scripts/kafka-matrix.py --brokers 4.4.0:tv2 --clients java --scenarios torn-transaction

A broker configuration is VERSION or VERSION:tvN (transaction.version N,
4.x only; plain VERSION is the version's default: 2 on 4.x). Each cluster is
a single KRaft node started once for all its cells; every cell uses fresh
topics and transactional ids. The Java client is kafka-clients at the
default version (kproxy.kafka.jars.DEFAULT_VERSION) against every broker.
"""

from __future__ import annotations

import argparse
import collections
import json
import signal
import sys
import time
from pathlib import Path

# The checkout's kproxy (repository root) and kproxy_spark (spark/).
ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "spark")]

from kproxy.demo import run_demo  # noqa: E402
from kproxy.kafka.kraft import start_cluster  # noqa: E402
from kproxy.protocol.errors import error_name  # noqa: E402

BROKERS = ["3.6.2", "3.9.1", "4.4.0:tv2", "4.4.0:tv0"]
CLIENTS = ["confluent-kafka", "kafka-python", "java"]
SCENARIOS = ["torn-transaction", "late-produce", "healthy"]
WATCHED = ["torn-transaction", "client-outcome-mismatch", "G1a", "lost-write", "duplicate", "poll-skip",
           "stale-end-txn", "late-produce", "broker-aborted-read"]


def parse_broker(spec: str) -> tuple[str, int | str | None]:
    version, _, tv = spec.partition(":tv")
    return version, (int(tv) if tv else "default")


def client_errors(history: Path) -> dict[str, int]:
    """Errors the clients reported (fail and info completions), by name, aborts on purpose left out."""
    out: collections.Counter[str] = collections.Counter()
    with open(history) as lines:
        for line in lines:
            op = json.loads(line)
            if op.get("type") in ("fail", "info") and op.get("error") and op["error"] != "aborted":
                out[str(op["error"])] += 1
    return dict(out.most_common(4))


def copy_answers(cell_dir: Path) -> dict[str, collections.Counter]:
    """How the broker answered each rule copy (EndTxn, Produce), from the cell's trace.

    A refused copy never reached the broker (the guard). A Produce copy the
    broker answered with no error and the original's base offset was
    deduplicated by idempotence, not appended again.
    """
    from kproxy.obs.trace_files import iter_trace_events

    out = {"end_txn": collections.Counter(), "produce": collections.Counter()}
    traces = cell_dir / "traces"
    if not traces.is_dir():
        return out
    events = [e for e in iter_trace_events(traces, records=False) if e.get("api") in out]
    originals = {(e["conn_id"], e["correlation_id"]): e for e in events
                 if e.get("direction") == "response" and not e.get("copy")}
    answers = {(e["conn_id"], e["correlation_id"], e.get("copy")): e for e in events
               if e.get("direction") == "response" and e.get("copy")}
    for e in events:
        if e.get("direction") != "request" or not e.get("copy"):
            continue
        if e.get("outcome") == "refused":
            out[e["api"]]["refused by the guard"] += 1
            continue
        reply = answers.get((e["conn_id"], e["correlation_id"], e.get("copy")))
        if reply is None:
            out[e["api"]][f"no answer ({e.get('outcome')})"] += 1
            continue
        codes = [p.get("error_code") for p in reply.get("partitions") or []] or [reply.get("error_code")]
        errors = sorted({error_name(c) for c in codes if c})
        if errors:
            out[e["api"]][" ".join(errors)] += 1
        elif e["api"] == "produce":
            original = originals.get((e["conn_id"], e["correlation_id"]))
            base = [p.get("base_offset") for p in reply.get("partitions") or []]
            first = [p.get("base_offset") for p in (original or {}).get("partitions") or []]
            out[e["api"]]["accepted as a duplicate (original's offset)" if original and base == first
                          else "accepted and appended"] += 1
        else:
            out[e["api"]]["accepted (NONE)"] += 1
    return out


def _fmt(counter: dict[str, int]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counter.items(), key=lambda kv: -kv[1])) or "-"


def table(results: Path) -> str:
    """The Markdown table of docs/kafka-versions.md, from a run's cells.jsonl."""
    rows = ["| Kafka | TV | client | scenario | guard | errors found (cases) | stale EndTxn copies: broker's answer | "
            "late Produce copies: broker's answer | attributed to the rule | client errors | report |",
            "|---|---|---|---|---|---|---|---|---|---|---|"]
    for line in results.read_text().splitlines():
        cell = json.loads(line)
        tv = cell.get("transaction_version")
        head = (f"| {cell['kafka']} | {'-' if tv is None else tv} | {cell['client']} | {cell['scenario']} | "
                f"{'on' if cell['guard'] else 'off'} |")
        if "failed" in cell:
            rows.append(f"{head} could not run: {cell['failed'][:200]} | | | | | | |")
            continue
        report = Path(cell["report"])
        counts = json.loads(report.read_text()).get("counts", {})
        found = ", ".join(f"{name} {counts.get(name, '?')}" for name in cell["errors"]) or "none (valid)"
        answers = copy_answers(report.parent)
        rows.append(f"{head} {found} | {_fmt(answers['end_txn'])} | {_fmt(answers['produce'])} | "
                    f"{'; '.join(cell['attributed']) or '-'} | {_fmt(cell['client_errors'])} | "
                    f"`{report.parent.name}/report.json` |")
    return "\n".join(rows) + "\n"


def run_cell(bootstrap: str, out_dir: Path, client: str, scenario: str, guard: bool, seed: int,
             duration: float, spark) -> dict:  # noqa: ANN001
    started = time.monotonic()
    result = run_demo(scenario, out_dir, guard=guard, seed=seed, duration=duration, bootstrap=bootstrap,
                      client=client, spark=spark, progress=False, say=lambda _: None)
    report = result.report
    counts = report.get("counts", {})
    impact = report.get("stats", {}).get("fault_impact") or []
    return {
        "valid": report.get("valid"),
        "errors": report.get("errors", []),
        "counts": {k: counts.get(k, 0) for k in WATCHED},
        "attributed": sorted({f"{i['anomaly']}: {i['cases']}" for i in impact if i.get("cases")}),
        "client_errors": client_errors(out_dir / "history.jsonl"),
        "report": str(out_dir / "report.json"),
        "seconds": round(time.monotonic() - started, 1),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--brokers", default=",".join(BROKERS))
    parser.add_argument("--clients", default=",".join(CLIENTS))
    parser.add_argument("--scenarios", default=",".join(SCENARIOS))
    parser.add_argument("--guard", choices=["both", "off", "on"], default="both")
    parser.add_argument("--duration", type=float, default=8.0, help="workload seconds per cell")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--out", type=Path, default=Path("matrix-out"))
    parser.add_argument("--table", action="store_true", help="only print the Markdown table of OUT/cells.jsonl")
    args = parser.parse_args()
    if args.table:
        print(table(args.out / "cells.jsonl"), end="")
        return 0

    # SIGTERM unwinds like Ctrl-C, so the proxy and the Kafka nodes of the cell in progress are stopped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    from kproxy_spark.session import get_session

    spark = get_session(master="local[2]", app_name="kproxy-kafka-matrix",
                        conf={"spark.sql.shuffle.partitions": "2", "spark.ui.enabled": "false"})
    args.out.mkdir(parents=True, exist_ok=True)
    results = args.out / "cells.jsonl"
    guards = {"both": [False, True], "off": [False], "on": [True]}[args.guard]
    began = time.monotonic()
    for spec in args.brokers.split(","):
        version, tv = parse_broker(spec)
        cluster = start_cluster(version, transaction_version=tv, work_dir=args.out / f"kafka-{spec.replace(':', '-')}",
                                say=lambda text: print(text, file=sys.stderr, flush=True))
        try:
            for client in args.clients.split(","):
                for scenario in args.scenarios.split(","):
                    # The rule-free control runs without the guard only: it has nothing to refuse.
                    for guard in (guards if scenario != "healthy" or args.guard == "on" else [False]):
                        name = f"{spec.replace(':', '-')}_{client}_{scenario}{'_guard' if guard else ''}"
                        cell = {"broker": spec, "kafka": cluster.version,
                                "transaction_version": cluster.transaction_version, "client": client,
                                "scenario": scenario, "guard": guard}
                        try:
                            cell.update(run_cell(cluster.bootstrap, args.out / name, client, scenario, guard,
                                                 args.seed, args.duration, spark))
                        except Exception as exc:  # a cell that cannot run is a finding too; say why
                            cell["failed"] = f"{type(exc).__name__}: {exc}"
                        with open(results, "a") as out:
                            out.write(json.dumps(cell) + "\n")
                        answers = copy_answers(args.out / name)
                        print(f"{name}: {cell.get('errors', cell.get('failed'))} end_txn copies "
                              f"{_fmt(answers['end_txn'])}; produce copies {_fmt(answers['produce'])} "
                              f"({cell.get('seconds')} s)", file=sys.stderr, flush=True)
        finally:
            cluster.stop()
    print(f"matrix done in {time.monotonic() - began:.0f} s: {results}", file=sys.stderr)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
