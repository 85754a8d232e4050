"""`kproxy shrink`: the smallest rule file and workload that still show an anomaly."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from kproxy.brokers import KINDS
from kproxy.cli.options import (
    LOOPBACK_CLIENTS, check_target, client_config_option, upstream_tls_files, upstream_tls_options,
)
from kproxy.demo import DEFAULT_BROKER, DEFAULT_SCENARIO, scenarios
from kproxy.shrink.runner import DEFAULT_BUDGET_MINUTES, DEFAULT_RUNS_PER_CANDIDATE
from kproxy.workload.config import CLIENTS


@click.command(context_settings={"max_content_width": 100})
@click.option("--rules", "rules_file", required=True,
              type=click.Path(dir_okay=False, exists=True, path_type=Path),
              help="The rule file of the failing run.")
@click.option("--scenario", default=DEFAULT_SCENARIO, show_default=True,
              help="Scenario whose workload the run uses (its profile: transactional or not, abort rate, "
                   "processes, transaction length).")
@click.option("--anomaly", required=True, metavar="NAME",
              help="The anomaly to keep (a name of report.json's counts: torn-transaction, G1a, lost-write, ...).")
@click.option("--seed", default=1, show_default=True, type=int, help="Seed of the workload and the rules.")
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Run against this broker instead of starting one; every run makes its own topics.")
@upstream_tls_options
@client_config_option(LOOPBACK_CLIENTS)
@click.option("--broker", "broker_kind", type=click.Choice(list(KINDS)), default=None,
              help=f"Embedded broker to start once and share [default: {DEFAULT_BROKER}].")
@click.option("--client", type=click.Choice(CLIENTS), default="confluent-kafka", show_default=True,
              help="Client library of the workload.")
@click.option("--duration", type=click.FloatRange(min=1), default=None,
              help="Length of the starting workload in seconds (default: the scenario's, about 20 s).")
@click.option("--runs-per-candidate", "runs", type=click.IntRange(1, 20), default=DEFAULT_RUNS_PER_CANDIDATE,
              show_default=True,
              help="K: a change is kept when the anomaly appears in at least one of K runs (same seed).")
@click.option("--budget", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_BUDGET_MINUTES,
              show_default=True, metavar="MINUTES",
              help="Stop trying candidates after this long and write the best so far.")
@click.option("--max-candidates", type=click.IntRange(1), default=None, metavar="N",
              help="Stop after N candidates (the starting run counts as one) and write the best so far.")
@click.option("--out", "out_dir", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output directory: minimal.yaml, replay.sh, report.json, shrink.json, candidates/N/.")
def shrink(rules_file, scenario, anomaly, seed, bootstrap, upstream_tls, upstream_ca, upstream_cert,  # noqa: ANN001
           upstream_key, upstream_skip_hostname_check, client_config, broker_kind, client, duration, runs, budget,
           max_candidates, out_dir) -> None:
    """Shrink a failing run: the shortest run and one process first (each
    later run is then quicker), then fewer rules, matcher conditions and
    schedule phases, smaller action parameters, then a smaller workload, keeping each
    change only when ANOMALY still appears (and, when the starting run blamed
    a rule for it, is still blamed on a rule). See docs/shrinking.md.

    Ctrl-C stops the search and still writes the best result so far.

    Exit codes: 0 a minimal candidate was written (the search finished or
    the budget ran out), 1 the anomaly did not appear in the starting run,
    2 bad usage, 3 the shrink itself failed, 130 interrupted (best result written).
    """
    from kproxy.cli.demo import _require_prerequisites
    from kproxy.faults.errors import RuleFileError
    from kproxy.faults.loader import load_rule_file
    from kproxy.shrink.runner import EarlierShrinkError, NotReproduced, ShrinkConfig, run_shrink

    tls_files = upstream_tls_files(upstream_tls, upstream_ca, upstream_cert, upstream_key, upstream_skip_hostname_check)
    check_target(broker_kind, bootstrap, tls_files)
    if scenario not in scenarios():
        raise click.BadParameter(f"unknown scenario; choose one of: {', '.join(scenarios())}", param_hint="--scenario")
    try:
        load_rule_file(rules_file)
    except RuleFileError as exc:
        raise click.UsageError(str(exc)) from None
    _require_prerequisites("shrink")
    config = ShrinkConfig(rules_file=rules_file, anomaly=anomaly, out_dir=out_dir, scenario=scenario, seed=seed,
                          bootstrap=bootstrap, broker=broker_kind, runs_per_candidate=runs, budget_s=budget * 60,
                          duration=duration, client=client, max_candidates=max_candidates,
                          upstream_tls=tls_files, client_config=client_config)
    try:
        outcome = run_shrink(config, say=lambda line: click.echo(line))
    except EarlierShrinkError as exc:  # refused before anything started
        raise click.UsageError(str(exc)) from None
    except NotReproduced as exc:
        click.echo(f"shrink: {exc}", err=True)
        sys.exit(1)
    except KeyboardInterrupt:
        click.echo("shrink interrupted", err=True)
        sys.exit(130)
    except Exception as exc:  # report, don't dump a trace at the user
        click.echo(f"shrink failed: {exc}", err=True)
        sys.exit(3)
    sys.exit(outcome.exit_code)
