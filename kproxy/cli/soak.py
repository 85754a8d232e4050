"""`kproxy soak`: a long run under load and rotating faults, every request accounted for."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from kproxy.brokers import KINDS


@click.command(context_settings={"max_content_width": 100})
@click.option("--out", "out_dir", type=click.Path(file_okay=False, path_type=Path), default=Path("soak-out"),
              show_default=True, help="Directory for the trace, logs, rule file and soak.json.")
@click.option("--bootstrap", default=None, metavar="HOST:PORT",
              help="Broker to put the proxy in front of (default: start an embedded one).")
@click.option("--broker-kind", type=click.Choice(sorted(KINDS)), default="tansu", show_default=True,
              help="Which embedded broker to start when --bootstrap is not given (see `kproxy broker --help`).")
@click.option("--duration", type=click.FloatRange(min=1), default=600.0, show_default=True, help="Seconds of load.")
@click.option("--connections", type=click.IntRange(min=4), default=100, show_default=True,
              help="Client connections to keep busy (about 2/3 as many clients, half producers, half consumers).")
@click.option("--rotate", "rotate_s", type=click.FloatRange(min=1), default=30.0, show_default=True,
              help="Seconds between rule file rotations (the next fault action each time).")
@click.option("--sample", "sample_s", type=click.FloatRange(min=0.5), default=5.0, show_default=True,
              help="Seconds between samples of the proxy's RSS, descriptors and connections.")
def soak(out_dir: Path, bootstrap: str | None, broker_kind: str, duration: float, connections: int, rotate_s: float,
         sample_s: float) -> None:
    """Soak a real kproxy run: load, rotating faults, and every request's outcome checked in the trace.

    Real confluent-kafka producers (acks=all) and consumers keep about
    --connections client connections busy through a tracing proxy while its
    rule file is rewritten every --rotate seconds with the next fault action
    (delay, duplicate, drop, drop_response, respond, replace_error,
    disconnect, hold, rewrite, disconnect after, none). The proxy's RSS and
    descriptors are sampled, with its memory by allocator and the requests it
    holds (admin API /debug/memory). At the end the proxy is stopped and its trace
    read back: every request must be answered, unanswered by design, or
    listed by a connection's close event. Exit status 1 if any request has no
    outcome, the proxy died, or it logged an internal error. The summary goes
    to stdout and OUT/soak.json. See docs/reliability.md.
    """
    from kproxy.soak import run_soak

    result = run_soak(out_dir, bootstrap=bootstrap, broker_kind=broker_kind, duration_s=duration, connections=connections,
                      rotate_s=rotate_s, sample_s=sample_s, progress=lambda line: click.echo(line, err=True))
    summary = result.summary()
    click.echo(json.dumps(summary, indent=1))
    failed = result.without_outcome or result.proxy_exit != 0 or result.proxy_errors
    if failed:
        click.echo(f"soak failed: {len(result.without_outcome)} requests without outcome, proxy exit "
                   f"{result.proxy_exit}, {len(result.proxy_errors)} internal errors (see {out_dir})", err=True)
        sys.exit(1)
