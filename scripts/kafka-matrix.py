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
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kproxy.demo import run_demo  # noqa: E402
from kproxy.faults.kafka_errors import error_name  # noqa: E402
from kproxy.kafka.kraft import start_cluster  # noqa: E402

BROKERS = ["3.6.2", "3.9.1", "4.4.0:tv2", "4.4.0:tv0"]
CLIENTS = ["confluent-kafka", "kafka-python", "java"]
SCENARIOS = ["torn-transaction", "late-produce", "healthy"]
WATCHED = ["torn-transaction", "client-outcome-mismatch", "G1a", "lost-write", "duplicate", "poll-skip",
           "stale-end-txn", "late-produce", "broker-aborted-read"]


def parse_broker(spec: str) -> tuple[str, int | str | None]:
    version, _, tv = spec.partition(":tv")
    return version, (int(tv) if tv else "default")


def hazard_replies(report: dict, anomaly: str) -> dict[str, int]:
    """How the broker answered the rule's stale copies: error name (or outcome) -> count."""
    out: collections.Counter[str] = collections.Counter()
    for case in report.get("anomalies", {}).get(anomaly, []):
        if case.get("outcome") == "refused":
            out["refused by the guard"] += 1
        elif case.get("response_error_code") is not None:
            out[error_name(int(case["response_error_code"])) if case["response_error_code"] else "NONE (accepted)"] += 1
        else:
            out[f"no reply ({case.get('outcome')})"] += 1
    return dict(out)


def client_errors(history: Path) -> dict[str, int]:
    """Errors the clients reported (fail and info completions), by name, aborts on purpose left out."""
    out: collections.Counter[str] = collections.Counter()
    with open(history) as lines:
        for line in lines:
            op = json.loads(line)
            if op.get("type") in ("fail", "info") and op.get("error") and op["error"] != "aborted":
                out[str(op["error"])] += 1
    return dict(out.most_common(4))


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
        "stale_end_txn_replies": hazard_replies(report, "stale-end-txn"),
        "late_produce_replies": hazard_replies(report, "late-produce"),
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
    args = parser.parse_args()

    from spark.session import get_session

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
                        print(f"{name}: {cell.get('errors', cell.get('failed'))} "
                              f"stale={cell.get('stale_end_txn_replies')} late={cell.get('late_produce_replies')} "
                              f"({cell.get('seconds')} s)", file=sys.stderr, flush=True)
        finally:
            cluster.stop()
    print(f"matrix done in {time.monotonic() - began:.0f} s: {results}", file=sys.stderr)
    spark.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
