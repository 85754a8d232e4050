"""`kproxy workload`: run the queue workload with real clients and write its history."""

from __future__ import annotations

import logging
from pathlib import Path

import click

from kproxy.cli.options import client_config_option, parse_settings
from kproxy.workload.config import CLIENTS, WorkloadConfig


@click.command()
@click.option("--bootstrap", required=True, metavar="HOST:PORT",
              help="Kafka bootstrap address (the proxy's listener, or a broker directly).")
@click.option("--history", "history_path", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the history here (JSON Lines, see docs/history.md); overwritten.")
@click.option("--client", type=click.Choice(CLIENTS), default="confluent-kafka", show_default=True,
              help="Client library every process uses (docs/workload.md); franz-go and sarama are built with Go "
                   "on first use.")
@click.option("--duration", type=float, default=None, metavar="SECONDS",
              help="Stop starting operations after this long. Default: 10 s unless --ops is given.")
@click.option("--ops", type=click.IntRange(min=1), default=None,
              help="Stop after this many operations (summed over processes; final reads not counted).")
@click.option("--concurrency", type=click.IntRange(min=1), default=3, show_default=True,
              help="Worker threads, each a logical process with its own producer and consumer.")
@click.option("--seed", type=int, default=0, show_default=True,
              help="Seed of every random choice (op kinds, keys, aborts, crashes).")
@click.option("--txn/--no-txn", default=False, show_default=True,
              help="Transactional mode: txn operations mixing sends and polls, committed atomically.")
@click.option("--subscribe/--assign", default=False, show_default=True,
              help="Read through group subscription instead of explicit partition assignment.")
@click.option("--abort-probability", type=click.FloatRange(0, 1), default=0.0, show_default=True,
              help="Abort mode: chance that a txn is aborted on purpose (needs --txn).")
@click.option("--rewind-on-abort", is_flag=True,
              help="After an abort, seek the consumer back to the group's committed offsets (needs --txn).")
@click.option("--crash-probability", type=click.FloatRange(0, 1), default=0.02, show_default=True,
              help="Chance that an operation is a client crash (teardown without a clean close).")
@click.option("--reassign-probability", type=click.FloatRange(0, 1), default=0.1, show_default=True,
              help="Chance that an operation changes what the process reads (assign or subscribe).")
@click.option("--key-count", type=click.IntRange(min=1), default=4, show_default=True,
              help="Keys in play at once; chosen with exponential frequency.")
@click.option("--max-writes-per-key", type=click.IntRange(min=1), default=32, show_default=True,
              help="Sends to a key before it is retired and a fresh key takes its place.")
@click.option("--max-txn-length", type=click.IntRange(min=1), default=4, show_default=True,
              help="Most micro-ops in one send or txn operation.")
@click.option("--partitions-per-topic", type=click.IntRange(min=1), default=1, show_default=True,
              help="1: a topic per key. N: keys spread over the N partitions of each topic.")
@click.option("--topic-prefix", default=None,
              help="Topic name prefix (default: kproxy-<random>, fresh topics per run).")
@click.option("--group-id", default=None, help="Consumer group (default: <topic-prefix>-group).")
@click.option("--poll-timeout", type=float, default=0.1, show_default=True, metavar="SECONDS",
              help="How long one poll micro-op waits for records.")
@click.option("--op-timeout", type=float, default=5.0, show_default=True, metavar="SECONDS",
              help="Bound of flush, commit, abort and other blocking client calls.")
@click.option("--final-reads-timeout", type=float, default=10.0, show_default=True, metavar="SECONDS",
              help="How long the final reads may take to read every key back.")
@client_config_option("--producer-config and --consumer-config win over it.")
@click.option("--producer-config", multiple=True, callback=parse_settings, metavar="KEY=VALUE",
              help="Producer setting in the client's own naming (repeatable); overrides the safe defaults.")
@click.option("--consumer-config", multiple=True, callback=parse_settings, metavar="KEY=VALUE",
              help="Consumer setting in the client's own naming (repeatable); overrides the safe defaults.")
@click.option("--no-progress", is_flag=True, help="No progress bar on stderr.")
@click.option("-v", "--verbose", count=True, help="Log more (-v info, -vv debug).")
def workload(history_path: Path, duration: float | None, ops: int | None, topic_prefix: str | None,
             no_progress: bool, verbose: int, **options: object) -> None:
    """Run a Jepsen-style Kafka queue workload and write the client history.

    Processes send, poll and (with --txn) run transactions over integer keys,
    each key one topic-partition, with real clients and the safe settings
    (acks=all, idempotence, read_committed, earliest, manual commits). Errors
    are recorded as fail (definitely no effect) or info (unknown); a process
    whose op ended info, or that crashed, continues under a new process number.
    Final reads then read every key from offset 0. See docs/workload.md and
    docs/history.md.

    Exit status: 0 when the run finished and the final reads caught up, 1 when
    the final reads timed out on some keys, 2 on usage errors or a failed run.
    """
    logging.basicConfig(level=[logging.WARNING, logging.INFO, logging.DEBUG][min(verbose, 2)],
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    if not verbose:
        # Client libraries log every reconnect; the history already says what matters.
        for library in ("kafka", "aiokafka"):
            logging.getLogger(library).setLevel(logging.CRITICAL)
    if duration is None and ops is None:
        duration = 10.0
    extra = {"topic_prefix": topic_prefix} if topic_prefix else {}
    try:
        config = WorkloadConfig(duration=duration, ops=ops, **extra, **options)  # type: ignore[arg-type]
    except ValueError as exc:
        raise click.UsageError(str(exc)) from None

    from kproxy.workload.runner import WorkloadError, run_workload

    try:
        summary = run_workload(config, history_path, progress=not no_progress)
    except WorkloadError as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(2) from None
    counts = ", ".join(f"{n} {t}" for t, n in sorted(summary.completions.items()))
    click.echo(f"{summary.invocations} operations by {summary.processes} processes on {summary.keys} keys "
               f"in {summary.elapsed:.1f}s ({counts}); history: {summary.history_path}")
    if not summary.final_reads_caught_up:
        click.echo(f"final reads did not catch up on keys {list(summary.lagging_keys)}", err=True)
        raise SystemExit(1)
