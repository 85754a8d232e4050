#!/usr/bin/env python3
"""Three Apache Kafka nodes behind the proxy, one stopped and restarted mid-run; count what the brokers answered.

    scripts/kafka-node-stop.py [--client confluent-kafka|kafka-python|java] [--txn] [--out DIR]

No rule is loaded: every error response in the records-level trace is the
brokers' own (docs/kafka.md, "A node stopped mid-run").
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from kproxy.kafka.jars import DEFAULT_VERSION  # noqa: E402
from kproxy.kafka.kraft import start_cluster, wait_ready  # noqa: E402
from kproxy.obs.trace_files import iter_trace_events  # noqa: E402
from kproxy.protocol.errors import error_name  # noqa: E402
from kproxy.proxy_process import running_proxy  # noqa: E402
from kproxy.workload.config import WorkloadConfig  # noqa: E402
from kproxy.workload.runner import run_workload  # noqa: E402


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--client", default="confluent-kafka")
    parser.add_argument("--version", default=DEFAULT_VERSION)
    parser.add_argument("--duration", type=float, default=14.0)
    parser.add_argument("--txn", action="store_true", help="transactional workload (coordinators move too)")
    parser.add_argument("--out", type=Path, default=Path("node-stop-out"))
    args = parser.parse_args()
    shutil.rmtree(args.out, ignore_errors=True)
    args.out.mkdir(parents=True)
    with start_cluster(args.version, nodes=3, work_dir=args.out / "kafka") as cluster:
        with running_proxy(cluster.nodes[0].bootstrap, "--traces", str(args.out / "traces"), "--trace-level",
                           "records", log_path=args.out / "kproxy.log") as proxy:
            def stop_and_restart() -> None:
                time.sleep(4)
                cluster.nodes[1].stop()
                time.sleep(4)
                cluster.nodes[1].start()
                wait_ready(cluster, 90)

            mover = threading.Thread(target=stop_and_restart)
            mover.start()
            summary = run_workload(WorkloadConfig(bootstrap=proxy.bootstrap, client=args.client, duration=args.duration,
                                                  seed=5, final_reads_timeout=30, crash_probability=0.0,
                                                  txn=args.txn, abort_probability=0.2 if args.txn else 0.0),
                                   args.out / "history.jsonl", progress=False)
            mover.join()
    answered: collections.Counter[tuple[str, str, str | None]] = collections.Counter()
    for event in iter_trace_events(args.out / "traces", records=False):
        if event.get("direction") != "response":
            continue
        codes = {p.get("error_code") for p in event.get("partitions") or []} | {event.get("error_code")}
        for code in sorted(c for c in codes if c):
            answered[(event["api"], error_name(code), event.get("rule"))] += 1
    print(f"history: {summary.completions}; final reads caught up: {summary.final_reads_caught_up}")
    for (api, name, rule), count in answered.most_common():
        print(f"{api:20} {name:32} {count:5}  rule: {rule or '-'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
