"""`kproxy test`: run the user's own command through kproxy and judge what it did on the wire."""

from __future__ import annotations

import signal
import sys
from pathlib import Path

import click

from kproxy.brokers import KINDS
from kproxy.cli.analyze import remote_url
from kproxy.testing.harness import DEFAULT_KIND

# Kept in step with kproxy.testing.runner (importing it here would start nothing, but --help needs none of it).
EXIT_USAGE, EXIT_KPROXY, EXIT_COMMAND, EXIT_INTERRUPTED = 2, 3, 5, 130

EPILOG = """\b
The command finds the proxy's address in $KAFKA_BOOTSTRAP_SERVERS and in
place of every {bootstrap} inside its arguments; the proxy's admin API
(add or remove rules while it runs: kproxy rules) is in $KPROXY_ADMIN.
Its output goes to the terminal and to OUT/command.log; its stdin is
/dev/null.

\b
Exit codes (the first that applies):
  3  kproxy itself failed: a broker or proxy that would not start or
     died, an analysis that failed (as kproxy analyze's 3)
  1  the verdict found error-level anomalies (whatever the command did)
  5  the command failed: not found, a non-zero exit status, or not one
     request through the proxy (a command stopped at --duration has not
     failed)
  4  the verdict is unknown: nothing could be judged (as kproxy analyze)
  0  the command succeeded and the verdict is valid (or --no-analyze)
  2  bad usage or input; nothing was started
  130 interrupted (Ctrl-C, SIGTERM): everything was stopped, nothing analysed

\b
Output in OUT: traces/, report/report.json and report.html, run.json
(the statuses above), command.log, kproxy.log, broker.log.

\b
Examples:
  kproxy test --out out -- python app.py {bootstrap}
  kproxy test --broker kafka --transaction-version 2 --out out -- \\
      env KGO_SEEDS={bootstrap} KGO_TEST_RF=1 ./kgo.test -test.run TestTxnEtl
  kproxy test --rules rules/torn-transaction.yaml --duration 60 --out out -- ./my-service
  kproxy test --bootstrap kafka.example:9092 --guard --out out -- mvn -q verify
  kproxy test --no-analyze --out out -- pytest tests/kafka   # trace only; analyse later
"""


def _terminate(signum: int, frame: object) -> None:
    # SIGTERM unwinds as Ctrl-C does: the command, the proxy and the broker are stopped on the way out.
    raise KeyboardInterrupt


@click.command(name="test", epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100,
                                                "allow_interspersed_args": False})
@click.option("--broker", "broker_kind", type=click.Choice(list(KINDS)), default=None,
              help=f"Embedded broker to start and stop [default: {DEFAULT_KIND}]. See docs/brokers.md for what "
                   "each does wrong on its own.")
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Put the proxy in front of this broker or cluster instead of starting one; kproxy leaves it "
                   "running and touches nothing in it.")
@click.option("--rules", "rules_file", type=click.Path(dir_okay=False, exists=True, path_type=Path), default=None,
              help="YAML fault rule file for the proxy, as kproxy run --rules (docs/rules.md).")
@click.option("--guard", is_flag=True, help="Run the proxy in guard mode: refuse hazardous transactional deliveries.")
@click.option("--seed", type=click.IntRange(min=0), default=None,
              help="Seed for probabilistic rules (overrides the rule file's).")
@click.option("--transaction-version", type=click.IntRange(0, 2), default=None,
              help="--broker kafka: the transaction.version feature of the Kafka 4.x broker [default: 2]; "
                   "refused for the other brokers.")
@click.option("--duration", type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS",
              help="Stop the command after this long (SIGTERM to its process group, SIGKILL 10 s later) and "
                   "judge what it did; for services that run until stopped. Default: wait for it to exit.")
@click.option("--master", default="local[*]", show_default=True, metavar="URL", help="Spark master URL of the analysis.")
@click.option("--remote", default=None, metavar="sc://HOST:PORT", callback=remote_url,
              help="Analyse on this Spark Connect server instead of a Spark of its own (instead of --master; "
                   "docs/analysis.md, \"Spark Connect\").")
@click.option("--final-read/--no-final-read", "final_read", default=True, show_default=True,
              help="After the command, read every topic it made back from offset 0 through kproxy "
                   "(read_committed, client id kproxy-final-read), so a write no consumer read is judged lost "
                   "rather than unknown. With --bootstrap only topics created during the run are read.")
@click.option("--no-analyze", "no_analyze", is_flag=True,
              help="Keep the trace but do not analyse it (no Spark needed): the exit status is the command's.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False, path_type=Path),
              help="Output directory (created): traces, report, logs. One that holds traces already is refused.")
@click.option("--quiet", "-q", is_flag=True, help="No progress lines on stderr (the summary is still printed).")
@click.argument("command", nargs=-1, type=click.UNPROCESSED, metavar="-- COMMAND [ARGS]...")
def kproxy_test(broker_kind, bootstrap, rules_file, guard, seed, transaction_version, duration, master, remote,
         final_read, no_analyze, out, quiet, command) -> None:
    """Run COMMAND (your application or test suite) through kproxy and judge
    what it did on the wire.

    Starts an embedded broker (or uses --bootstrap), then a proxy in front
    of it that traces every record (with --rules and --guard as kproxy run
    takes them), runs COMMAND against the proxy until it exits or --duration
    passes, stops everything, and analyses the trace with Spark. No client
    history is needed: it is derived from the trace. The verdict is printed
    as kproxy analyze prints it and written to OUT/report (docs/testing.md).
    """
    from kproxy.cli.options import is_host_port
    from kproxy.obs.trace_files import EarlierTracesError, refuse_earlier_traces
    from kproxy.testing.command import find_executable, substitute

    if not command:
        raise click.UsageError("no command to run: give it after --, e.g. kproxy test --out out -- python app.py {bootstrap}")
    if remote is not None and master != "local[*]":
        raise click.UsageError("give --master or --remote, not both")
    if bootstrap is not None and not is_host_port(bootstrap):
        raise click.BadParameter(f"{bootstrap!r} is not one HOST:PORT", param_hint="--bootstrap")
    _check_setup(broker_kind, bootstrap, transaction_version)
    if rules_file is not None:
        _check_rules(rules_file)
    try:
        refuse_earlier_traces(out)
    except EarlierTracesError as exc:
        raise click.UsageError(str(exc)) from None
    if not no_analyze:
        _require_analysis(remote=remote is not None)
    program = substitute(command, "127.0.0.1:0")[0]
    if find_executable(program) is None:
        click.echo(f"kproxy test: command not found: {program} (nothing was started)", err=True)
        sys.exit(EXIT_COMMAND)

    from kproxy.testing.runner import RunSettings, run_test

    def say(line: str) -> None:
        if not quiet:
            click.echo(f"[kproxy test] {line}", err=True)

    settings = RunSettings(
        command=tuple(command), out=out, broker=None if bootstrap else (broker_kind or DEFAULT_KIND),
        bootstrap=bootstrap, rules=rules_file, guard=guard, seed=seed, transaction_version=transaction_version,
        # A Connect URL in place of the master: the analysis opens a Connect session for it.
        duration=duration, master=remote or master, analyze=not no_analyze, final_read=final_read,
    )
    signal.signal(signal.SIGTERM, _terminate)
    try:
        result = run_test(settings, say=say, echo=click.echo)
    except KeyboardInterrupt:
        click.echo("kproxy test: interrupted; the command, the proxy and the broker are stopped", err=True)
        sys.exit(EXIT_INTERRUPTED)
    sys.exit(result.exit_code)


def _check_setup(broker_kind: str | None, bootstrap: str | None, transaction_version: int | None) -> None:
    """Usage errors (exit 2) for options that do not go together; exit 3 for a broker binary that cannot run here."""
    from kproxy.brokers import BrokerError
    from kproxy.testing.harness import SetupError, check_upstream

    try:
        check_upstream(broker_kind, bootstrap, transaction_version)
    except SetupError as exc:
        raise click.UsageError(str(exc)) from None
    except BrokerError as exc:
        click.echo(f"kproxy test: {exc}", err=True)
        sys.exit(EXIT_KPROXY)


def _check_rules(rules_file: Path) -> None:
    from kproxy.faults.errors import RuleFileError
    from kproxy.faults.loader import load_rule_file

    try:
        load_rule_file(rules_file)
    except RuleFileError as exc:
        raise click.UsageError(str(exc)) from None


def _require_analysis(remote: bool) -> None:
    """Exit 2 at once, with the fix, when the analysis could not run (as kproxy analyze does).
    On Spark Connect (`remote`) no JVM runs here: the analysis extra alone is needed."""
    from kproxy.prereqs import MissingPrerequisite, check_analysis, check_spark_prerequisites

    try:
        check_analysis("test") if remote else check_spark_prerequisites("test")
    except MissingPrerequisite as exc:
        click.echo(f"error: {exc}\n(or run with --no-analyze to keep the trace and analyse it elsewhere)", err=True)
        sys.exit(EXIT_USAGE)
