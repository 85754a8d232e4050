"""The `kproxy` command line.

Each subcommand lives in its own module and is imported only when used, so
`kproxy --help` stays fast and `kproxy run` never imports Spark.
"""

from __future__ import annotations

import importlib

import click

# name -> (module, attribute, one-line help shown by `kproxy --help`)
SUBCOMMANDS: dict[str, tuple[str, str, str]] = {
    "run": ("kproxy.cli.run", "run", "Run the proxy in front of a Kafka cluster."),
    "broker": ("kproxy.cli.broker", "broker", "Run an embedded broker, Tansu or noida-db (local use, demos, tests)."),
    "bench": ("kproxy.cli.bench", "bench", "Measure throughput and latency through the proxy against a direct connection."),
    "rules": ("kproxy.cli.rules", "rules", "Validate rule files, export their JSON Schema, manage a running proxy's rules."),
    "workload": ("kproxy.cli.workload", "workload", "Run a Jepsen-style queue workload with real clients and write its history."),
    "history": ("kproxy.cli.history", "history", "Work with client histories (import Jepsen EDN histories)."),
    "trace": ("kproxy.cli.trace", "trace", "Work with trace files (export them as JSON Lines for jq)."),
    "analyze": ("kproxy.cli.analyze", "analyze", "Check a history (and traces) with Spark; write report.json and report.html."),
    "engine": ("kproxy.cli.engine", "engine", "Keep a warm Spark engine running for repeated analyses (start, stop, status)."),
    "soak": ("kproxy.cli.soak", "soak", "Soak a proxy under load and rotating faults; check every request's outcome."),
    "demo": ("kproxy.cli.demo", "demo", "Broker, proxy, scenario rules, workload and analysis in one command."),
    "shrink": ("kproxy.cli.shrink", "shrink", "Shrink a failing run to the smallest rules and workload that still show its anomaly."),
    "test": ("kproxy.cli.test", "kproxy_test", "Run your own command or test suite through kproxy and judge its traffic."),
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(SUBCOMMANDS)

    def get_command(self, ctx: click.Context, name: str) -> click.Command | None:
        if name not in SUBCOMMANDS:
            return None
        module, attr, _ = SUBCOMMANDS[name]
        return getattr(importlib.import_module(module), attr)

    def format_commands(self, ctx: click.Context, formatter: click.HelpFormatter) -> None:
        # Short help comes from the table so listing commands imports nothing.
        with formatter.section("Commands"):
            formatter.write_dl([(name, help_) for name, (_, _, help_) in SUBCOMMANDS.items()])


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(package_name="kproxy")
def main() -> None:
    """kproxy: a Kafka protocol proxy and fault-injection gateway.

    It sits between Kafka clients and brokers, numbers transactions, injects
    faults from YAML rules, traces what crosses the wire, and analyses traces
    against client histories. See `kproxy COMMAND --help` and docs/.
    """
