"""`kproxy engine start|stop|status`: a warm analysis engine for loops over the verdict."""

from __future__ import annotations

import sys
import time

import click

from kproxy.cli.analyze import _spark_conf

EPILOG = """\b
While an engine runs, `kproxy analyze` (without --master or --conf) and
`kproxy test` send their analyses to it instead of starting Spark: no
start-up, and a JVM that has already compiled the analysis. One analysis
runs at a time; others wait their turn. `kproxy analyze --no-engine` starts
its own Spark anyway. docs/analysis.md, "A warm engine".

\b
Examples:
  kproxy engine start                      # local[*]; stops after 30 idle minutes
  kproxy engine start --idle-stop 0 --conf spark.driver.memory=4g
  kproxy engine status
  kproxy engine stop
"""


@click.group(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
def engine() -> None:
    """A warm local Spark engine that analyses on request, for loops over the verdict (shrink, the
    version matrix, a CI gate over many `kproxy test` runs)."""


@engine.command(epilog=EPILOG)
@click.option("--master", default="local[*]", show_default=True, help="Spark master of the engine's session.")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE", callback=_spark_conf,
              help="A Spark setting for the engine's session (repeatable), e.g. spark.driver.memory=4g.")
@click.option("--idle-stop", "idle_stop", type=click.FloatRange(min=0), default=30.0, show_default=True,
              metavar="MINUTES", help="Stop after this many minutes without an analysis; 0: never.")
def start(master: str, spark_conf: dict[str, str], idle_stop: float) -> None:
    """Start the engine in the background and wait until it is warm (Spark, then one small analysis)."""
    from kproxy.engine.client import EngineError
    from kproxy.engine.client import start as start_engine
    from kproxy.prereqs import MissingPrerequisite, check_spark_prerequisites

    try:
        check_spark_prerequisites("engine")
        start_engine(master=master, idle_stop_min=idle_stop, conf=spark_conf,
                     say=lambda line: click.echo(f"[engine] {line}", err=True))
    except MissingPrerequisite as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(2)
    except EngineError as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(3)


@engine.command()
def status() -> None:
    """Say whether an engine runs, with its pid, master, analyses so far and idle time; exit 1 if none."""
    from kproxy.engine.client import status as engine_status

    state = engine_status()
    if state is None:
        click.echo("no engine is running (kproxy engine start)")
        sys.exit(1)
    up = time.time() - state["started"]
    click.echo(f"engine pid {state['pid']} on {state['master']}: {'warm' if state.get('ready') else 'warming up'},"
               f" up {up / 60:.1f} min, {state['analyses']} analyses, "
               f"{'busy' if state['busy'] else 'idle for ' + format(state['idle_s'], '.0f') + ' s'}"
               + (f", stops after {state['idle_stop_s'] / 60:g} idle min" if state.get("idle_stop_s") else "")
               + f"; log {state['log']}")


@engine.command()
def stop() -> None:
    """Stop the running engine (after the analysis it is running, if any)."""
    from kproxy.engine.client import stop as stop_engine

    last = stop_engine()
    click.echo("no engine was running" if last is None else
               f"stopped the engine (pid {last['pid']}) after {last['analyses']} analyses")
