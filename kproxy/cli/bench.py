"""`kproxy bench`: throughput and latency through the proxy vs a direct
connection; `kproxy bench analysis`: what the Spark analysis costs.

`bench` stays a command of its own (its options run the proxy benchmark)
and is also a group, so other benchmarks are subcommands of it.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kproxy.bench.analysis import DEFAULT_TIMEOUT_S, TRACE_MODES, default_work_dir, parse_sizes
from kproxy.brokers import KINDS


@click.group(invoke_without_command=True, subcommand_metavar="[COMMAND [ARGS]...]",
             context_settings={"max_content_width": 100})
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Benchmark against this broker instead of starting the embedded one.")
@click.option("--broker", "broker_kind", type=click.Choice(list(KINDS)), default="tansu", show_default=True,
              help="Embedded broker to start when there is no --bootstrap. --reference and --tls need tansu "
                   "(they put HAProxy in front of it, which needs a broker that advertises another port).")
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
@click.option("--tls", is_flag=True,
              help="TLS on every path: the embedded broker behind an HAProxy TLS terminator (certificates made "
                   "for the run), kproxy with TLS towards clients and brokers, and with --reference HAProxy "
                   "ending and opening TLS the same way. Skips the memory check. See docs/security.md.")
@click.option("--no-memory", is_flag=True, help="Skip the 100 idle + 10 busy connections memory check.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the full results as JSON here.")
@click.option("--plot", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write a PNG bar chart of the ratios here.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Keep broker/proxy logs and traces here (default: a temporary directory).")
@click.option("--strict", is_flag=True, help="Exit 1 if any target is missed.")
@click.pass_context
def bench(ctx, bootstrap, broker_kind, rounds, batched_records, consume_passes, small_records, rate, latency_seconds,  # noqa: ANN001
          trace_levels, reference, tls, no_memory, out, plot, work_dir, strict) -> None:
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

    With a command (`kproxy bench analysis`) that benchmark runs instead,
    and the options above do not apply.
    """
    if ctx.invoked_subcommand is not None:
        _refuse_proxy_options(ctx)
        return
    from tqdm import tqdm

    from kproxy.bench.report import format_table
    from kproxy.bench.report import plot as plot_result
    from kproxy.bench.reference import haproxy_binary
    from kproxy.bench.runner import BenchConfig, run_bench
    from kproxy.brokers import BrokerError

    if plot is not None:
        import importlib.util

        from kproxy.prereqs import install_analysis_command

        if importlib.util.find_spec("matplotlib") is None:  # found out now, not after the whole benchmark
            raise click.UsageError(f"--plot needs matplotlib, from the 'analysis' extra: {install_analysis_command()}")
    if broker_kind != "tansu" and (bootstrap is not None or reference or tls):
        raise click.UsageError("--broker applies to the plain paths without --bootstrap; --reference and --tls run "
                               "on tansu")
    if tls:
        if bootstrap is not None:
            raise click.UsageError("--tls starts its own broker behind a TLS terminator; it cannot use --bootstrap")
        no_memory = True  # its idle connections are plain sockets, which a TLS listener would hold in handshake
    if reference or tls:
        if bootstrap is not None:
            raise click.UsageError("--reference starts its own broker behind HAProxy; it cannot use --bootstrap")
        try:
            haproxy_binary()
        except BrokerError as exc:
            raise click.UsageError(str(exc)) from exc
    config = BenchConfig(
        bootstrap=bootstrap, broker=broker_kind, rounds=rounds, batched_records=batched_records, consume_passes=consume_passes,
        small_records=small_records,
        rate=rate, latency_seconds=latency_seconds, trace_levels=tuple(trace_levels), reference=reference,
        memory_check=not no_memory, work_dir=work_dir, tls=tls,
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


def _refuse_proxy_options(ctx: click.Context) -> None:
    """`kproxy bench --rounds 5 analysis` would silently ignore --rounds: refuse it."""
    given = [param.opts[0] for param in ctx.command.params
             if ctx.get_parameter_source(param.name) is not click.core.ParameterSource.DEFAULT]
    if given:
        raise click.UsageError(f"options of the proxy benchmark do not apply to "
                               f"`kproxy bench {ctx.invoked_subcommand}`: {', '.join(given)}")


@bench.command("analysis", context_settings={"max_content_width": 100})
@click.option("--sizes", default="10,100k,1M", show_default=True, metavar="N,N,...",
              help="History sizes to measure, in completed operations, comma-separated; k and M suffixes "
                   "allowed (e.g. 10,1000,100k,1M,10M).")
@click.option("--traces", "traces_mode", type=click.Choice(list(TRACE_MODES)), default="both", show_default=True,
              help="Analyse each history with its generated proxy traces, without them, or both (two runs).")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master passed to `kproxy analyze --master`.")
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the synthetic histories.")
@click.option("--timeout", default=DEFAULT_TIMEOUT_S, show_default=True, type=click.FloatRange(1),
              help="Seconds one analysis may run before it is stopped and reported as timed out.")
@click.option("--work-dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Cache of generated histories and traces (reused by later runs), and each run's report "
                   "and log. Default: $XDG_CACHE_HOME/kproxy/bench-analysis (~/.cache/kproxy/bench-analysis). "
                   "1M operations with traces take about 4 GB.")
@click.option("--out", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the results (every run's measures, phases and paths) as JSON here.")
def analysis(sizes, traces_mode, master, seed, timeout, work_dir, out) -> None:  # noqa: ANN001
    """Measure `kproxy analyze` on clean synthetic histories of growing size.

    For each size, a Jepsen-style queue history with matching proxy traces
    in the proxy's own format (segment files, record batches in side files;
    the generator of scripts/synthetic-history.py, docs/performance-analysis.md)
    is generated once and cached in the work directory; then `kproxy analyze`
    runs on it as a subprocess, the way a user runs it, with and/or without
    the traces. The table gives, per run: wall time (Spark's start
    included), the CPU time of the analysis and every process it started
    and of it the Spark JVM's JIT compilers', its threads that plan for the
    driver (py4j's), its executor tasks' and the Python processes' (the
    driver and the workers), the machine's 1-minute load
    at the run's start and end, operations per second, the Spark jobs and
    stages the analysis ran (from the report's stats.spark_jobs and
    stats.spark_stages), the peak RSS of the driver (the Python process and
    its Spark JVM) and the verdict, which must be valid: the histories are
    correct by construction.

    Exit 1 if any run failed, timed out or was not valid. Other work on the
    machine changes the times: the CPU time and the load say how much, so
    that two runs, or two machines, can be compared.
    """
    from tqdm import tqdm

    from kproxy.bench.analysis import AnalysisBenchConfig, machine, measure, prepare_inputs, succeeded
    from kproxy.bench.analysis_report import format_table, to_json

    try:
        size_list = parse_sizes(sizes)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--sizes") from None
    from kproxy.cli.demo import _require_prerequisites

    _require_prerequisites("bench analysis")  # before generating any input
    config = AnalysisBenchConfig(work_dir=work_dir or default_work_dir(), sizes=size_list,
                                 traces=TRACE_MODES[traces_mode], seed=seed, master=master, timeout_s=timeout)
    runs = []
    with tqdm(total=len(config.sizes) * len(config.traces), desc="analysis runs", unit="run",
              file=sys.stderr, position=0) as bar:
        for ops in config.sizes:
            with tqdm(total=ops, desc=f"generating {ops:,} ops", unit="op", unit_scale=True, file=sys.stderr,
                      position=1, leave=False) as generating:
                inputs = prepare_inputs(config, ops, with_traces=True in config.traces, progress=generating.update)
            for with_traces in config.traces:
                bar.set_postfix_str(f"{ops:,} ops, {'with' if with_traces else 'without'} traces")
                runs.append(measure(config, inputs, with_traces))
                bar.update(1)
    result = {"benchmark": "analysis", "master": master, "seed": seed, "work_dir": str(config.work_dir),
              "machine": machine(), "runs": runs}
    click.echo(format_table(result))
    if out:
        out.write_text(to_json(result))
        click.echo(f"results: {out}")
    if not all(succeeded(run) for run in runs):
        sys.exit(1)
