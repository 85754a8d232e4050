"""`kproxy bench`: throughput and latency through the proxy vs a direct connection."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click


@click.command(context_settings={"max_content_width": 100})
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Benchmark against this broker instead of starting the embedded one.")
@click.option("--rounds", default=3, show_default=True, type=click.IntRange(1, 50),
              help="Rounds; each runs every path (direct first, then proxy, then reversed next round).")
@click.option("--batched-records", default=40_000, show_default=True, type=click.IntRange(100),
              help="1 KiB records per batched produce run (acks=all, linger.ms=5); the consume run reads them back.")
@click.option("--consume-passes", default=12, show_default=True, type=click.IntRange(1),
              help="Times the consume run reads those records from offset 0, each with a fresh consumer timed from its first record to its last.")
@click.option("--small-records", default=40_000, show_default=True, type=click.IntRange(100),
              help="100 B records per unbatched produce run (linger.ms=0).")
@click.option("--rate", default=500, show_default=True, type=click.IntRange(1),
              help="Records per second for the fixed-rate latency run.")
@click.option("--latency-seconds", default=4.0, show_default=True, type=float,
              help="Length of each fixed-rate latency run.")
@click.option("--trace", "trace_levels", multiple=True, type=click.Choice(["headers", "records"]),
              help="Also run through a proxy tracing at this level (repeatable) and report tracing's cost.")
@click.option("--reference", is_flag=True,
              help="Also run every workload through HAProxy in TCP mode (Debian's haproxy package) in front of a "
                   "second embedded broker: what any extra hop costs on this machine, measured in the same run. "
                   "Needs the embedded broker (no --bootstrap).")
@click.option("--no-memory", is_flag=True, help="Skip the 100 idle + 10 busy connections memory check.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the full results as JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG bar chart of the ratios here.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep broker/proxy logs and traces here (default: a temporary directory).")
@click.option("--strict", is_flag=True, help="Exit 1 if any target is missed.")
def bench(bootstrap, rounds, batched_records, consume_passes, small_records, rate, latency_seconds, trace_levels,  # noqa: ANN001
          reference, no_memory, out, plot, work_dir, strict) -> None:
    """Measure the proxy against a direct connection, side by side in one run.

    Runs the same confluent-kafka workloads (1 KiB batched produce with
    acks=all, consume, 100 B produce with linger.ms=0, and a fixed-rate
    latency run) directly against the broker and through `kproxy run`,
    alternating, and prints throughput, latency percentiles and the ratios
    against the targets in docs/performance.md. Header decoding and
    correlation tracking are always on in the proxy.

    Rates are medians over rounds. A ratio is the median over rounds of
    each round's own pair (proxy / direct, tracing / proxy, kproxy /
    HAProxy), so the broker slowing as it fills does not tilt it.
    """
    from tqdm import tqdm

    from kproxy.bench.report import format_table
    from kproxy.bench.report import plot as plot_result
    from kproxy.bench.reference import haproxy_binary
    from kproxy.bench.runner import BenchConfig, run_bench
    from kproxy.broker import BrokerError

    if reference:
        if bootstrap is not None:
            raise click.UsageError("--reference starts its own broker behind HAProxy; it cannot use --bootstrap")
        try:
            haproxy_binary()
        except BrokerError as exc:
            raise click.UsageError(str(exc)) from exc
    config = BenchConfig(
        bootstrap=bootstrap, rounds=rounds, batched_records=batched_records, consume_passes=consume_passes,
        small_records=small_records,
        rate=rate, latency_seconds=latency_seconds, trace_levels=tuple(trace_levels), reference=reference,
        memory_check=not no_memory, work_dir=work_dir,
    )
    steps = rounds * (2 + len(trace_levels) + int(reference)) + (0 if no_memory else 1)
    with tqdm(total=steps, desc="bench", unit="step", file=sys.stderr) as bar:
        def progress(what: str) -> None:
            bar.set_postfix_str(what)
            bar.update(1)

        try:
            result = run_bench(config, progress)
        except RuntimeError as exc:
            raise click.ClickException(str(exc)) from exc
    click.echo(format_table(result))
    if out:
        out.write_text(json.dumps(result, indent=2))
        click.echo(f"results: {out}")
    if plot:
        plot_result(result, plot)
        click.echo(f"plot: {plot}")
    if strict and not all(result["checks"].values()):
        sys.exit(1)
