"""`kproxy demo`: the whole loop, on an embedded broker or the user's own, in one command."""

from __future__ import annotations

import sys
import time
from dataclasses import replace
from pathlib import Path

import click

from kproxy.brokers import KINDS
from kproxy.cli.options import (
    LOOPBACK_CLIENTS, check_target, client_config_option, upstream_tls_files, upstream_tls_options,
)
from kproxy.demo import DEFAULT_BROKER, DEFAULT_SCENARIO, profile_for, run_demo, scenarios
from kproxy.workload.config import CLIENTS


@click.command(context_settings={"max_content_width": 100})
@click.option("--scenario", default=DEFAULT_SCENARIO, show_default=True,
              help="Rule file in rules/ (name without .yaml). `--list` shows them.")
@click.option("--broker", "broker_kind", type=click.Choice(list(KINDS)), default=None,
              help=f"Embedded broker to start [default: {DEFAULT_BROKER}]. See docs/brokers.md.")
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Run against this broker or cluster instead of starting one. The demo creates only "
                   "its own kproxy-demo-* topics and touches nothing else.")
@upstream_tls_options
@client_config_option(LOOPBACK_CLIENTS)
@click.option("--client", type=click.Choice(CLIENTS), default="confluent-kafka", show_default=True,
              help="Client library of the workload. java (Apache Kafka's own) and franz-go speak transaction "
                   "version 2; franz-go and sarama are built with Go on first use (docs/workload.md).")
@click.option("--transaction-version", type=click.IntRange(0, 2), default=None,
              help="--broker kafka: the transaction.version feature of the Kafka 4.x broker [default: 2]; "
                   "0 runs it as a cluster upgraded from 3.x.")
@click.option("--rules", "rules_file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="Run this rule file instead of the scenario's (a shrunk one, say); the scenario still "
                   "chooses the workload.")
@click.option("--processes", type=click.IntRange(1), default=None,
              help="Workload processes (default: the scenario's, 3).")
@click.option("--max-txn-length", type=click.IntRange(1), default=None,
              help="Most micro-ops in one send or transaction (default: the scenario's).")
@click.option("--keys", type=click.IntRange(1), default=None, help="Keys in play at once (default: 4).")
@click.option("--guard", is_flag=True, help="Run the proxy in guard mode (refuse hazardous deliveries).")
@click.option("--seed", default=1, show_default=True, type=int, help="Seed for the workload and the rules.")
@click.option("--duration", type=float, default=None,
              help="Workload length in seconds (default: the scenario's, about 20 s).")
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Output directory (default: demo-out/SCENARIO[-guard]-TIMESTAMP under the current directory).")
@click.option("--rules-dir", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="Where scenario files live (default: the scenarios shipped with kproxy).")
@click.option("--list", "list_only", is_flag=True, help="List the scenarios and exit.")
@click.option("--no-progress", is_flag=True, help="No progress bar.")
def demo(scenario, broker_kind, bootstrap, upstream_tls, upstream_ca, upstream_cert, upstream_key,  # noqa: ANN001
         upstream_skip_hostname_check, client_config, client, transaction_version, rules_file, processes, max_txn_length, keys, guard, seed, duration, out_dir, rules_dir, list_only, no_progress) -> None:  # noqa: ANN001
    """Start a broker (or use --bootstrap) and the proxy with a scenario's rules,
    run the workload, analyse history and traces, and print what went wrong
    and why.

    The default scenario is the torn transaction: a stale EndTxn(commit) is
    delivered into the producer's next transaction. With --guard the proxy
    refuses it and the analysis finds no torn transaction.

    Exit codes: 0 the analysis found the run valid, 1 anomalies were found,
    2 bad usage, 3 the demo itself failed.
    """
    available = scenarios(rules_dir)
    if list_only:
        for name in available:
            click.echo(name)
        return
    if scenario not in available:
        raise click.BadParameter(f"unknown scenario; choose one of: {', '.join(available)}", param_hint="--scenario")
    tls_files = upstream_tls_files(upstream_tls, upstream_ca, upstream_cert, upstream_key, upstream_skip_hostname_check)
    check_target(broker_kind, bootstrap, tls_files)
    if transaction_version is not None and broker_kind != "kafka":
        raise click.BadParameter("is a feature of the Kafka broker the demo starts: add --broker kafka",
                                 param_hint="--transaction-version")
    _require_prerequisites("demo")
    if out_dir is None:
        out_dir = Path("demo-out") / f"{scenario}{'-guard' if guard else ''}-{time.strftime('%Y%m%dT%H%M%S')}"
    if rules_file is not None:
        from kproxy.faults.errors import RuleFileError
        from kproxy.faults.loader import load_rule_file

        try:
            load_rule_file(rules_file)
        except RuleFileError as exc:
            raise click.UsageError(str(exc)) from None
    from kproxy.obs.trace_files import EarlierTracesError

    profile = profile_for(scenario)
    overrides = {"concurrency": processes, "max_txn_length": max_txn_length, "key_count": keys}
    profile = replace(profile, **{k: v for k, v in overrides.items() if v is not None})
    try:
        result = run_demo(
            scenario, out_dir, guard=guard, seed=seed, duration=duration, rules_directory=rules_dir,
            say=lambda line: click.echo(line), progress=not no_progress,
            broker=broker_kind, bootstrap=bootstrap, client=client, rules_file=rules_file, profile=profile,
            upstream_tls=tls_files, client_config=client_config, transaction_version=transaction_version,
        )
    except EarlierTracesError as exc:  # refused before anything started
        raise click.UsageError(str(exc)) from None
    except Exception as exc:  # report, don't dump a trace at a new user
        click.echo(f"demo failed: {exc}", err=True)
        sys.exit(3)
    sys.exit(result.exit_code)


def _require_prerequisites(command: str) -> None:
    """Exit 3 at once, with the fix, when the analysis could not run (before any broker starts)."""
    from kproxy.prereqs import MissingPrerequisite, check_spark_prerequisites

    try:
        check_spark_prerequisites(command)
    except MissingPrerequisite as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(3)
