"""`kproxy run`: the proxy itself."""

from __future__ import annotations

import logging
from pathlib import Path

import click
import trio

from kproxy.cli.options import upstream_tls_files, upstream_tls_options
from kproxy.faults.errors import RuleFileError
from kproxy.faults.limits import MAX_SEED
from kproxy.io.admin_token import AdminTokenError, read_token, write_new_token
from kproxy.io.config import (
    DEFAULT_MAX_OUTSTANDING_REQUESTS,
    DEFAULT_TRACE_QUEUE_EVENTS,
    ProxyConfig,
)
from kproxy.obs.logs import setup_logging
from kproxy.protocol.endpoints import parse_endpoint
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES

log = logging.getLogger("kproxy.run")


def _endpoint(ctx: click.Context, param: click.Parameter, value: object):  # noqa: ANN202
    if value is None:
        return None
    try:
        if isinstance(value, tuple):
            return [parse_endpoint(v, 9092) for v in value]
        return parse_endpoint(str(value))
    except ValueError as exc:
        raise click.BadParameter(str(exc)) from exc


@click.command(context_settings={"max_content_width": 100})
@click.option("--upstream", "upstreams", multiple=True, required=True, callback=_endpoint, metavar="HOST:PORT",
              help="Bootstrap address of the real cluster (repeat for fallbacks; the first reachable one is used).")
@click.option("--listen", default="127.0.0.1:19092", show_default=True, callback=_endpoint, metavar="HOST:PORT",
              help="Bootstrap listener clients connect to.")
@click.option("--advertise", default=None, metavar="HOST",
              help="Host clients are told in Metadata/FindCoordinator/DescribeCluster (default: the --listen host).")
@click.option("--broker-port-base", type=int, default=None, metavar="PORT",
              help="Broker node N gets a listener on PORT+N (default: listen port + 1). See docs/ports.md.")
@click.option("--admin", default="127.0.0.1:19080", show_default=True, callback=_endpoint, metavar="HOST:PORT",
              help="Admin HTTP: /metrics, /healthz, /readyz, /txns, /debug/memory and the rules API. Beyond "
                   "loopback it needs --admin-token-file (docs/security.md).")
@click.option("--admin-token-file", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Bearer token the rules API, /txns and /debug/memory require (/metrics, /healthz and /readyz "
                   "stay open): the file's one line. Required when --admin is not on loopback.")
@click.option("--generate-admin-token", is_flag=True,
              help="Write a fresh random token to --admin-token-file at start (replacing its content) and print it "
                   "once on stderr.")
@click.option("--no-admin", is_flag=True, help="Do not start the admin HTTP server.")
@click.option("--rules", "rules_path", type=click.Path(exists=True, dir_okay=False, path_type=Path), default=None,
              help="YAML fault rule file; reloaded when it changes and on SIGHUP.")
@click.option("--seed", type=click.IntRange(0, MAX_SEED), default=None,
              help="Seed for probabilistic rules (overrides the file's seed).")
@click.option("--guard", is_flag=True,
              help="Refuse to deliver hazardous transactional requests (stale EndTxn, late Produce).")
@click.option("--stage-latency", is_flag=True,
              help="Time each request's way through the data path's stages (decode, numbering, rules, rewrite, "
                   "trace, upstream, held) into the kproxy_stage_seconds histogram, by API and stage. Off the "
                   "fast path only; costs a clock read per stage (docs/observability.md).")
@click.option("--fetch-leader-hints", is_flag=True,
              help="Offer clients Fetch v16+ (KIP-951 leader hints). The proxy then holds every Fetch response "
                   "whole to rewrite the hints instead of streaming it, which costs consume throughput.")
@click.option("--traces", "traces_dir", type=click.Path(file_okay=False, path_type=Path), default=None,
              help="Write a trace of every request and response to this directory.")
@click.option("--trace-level", type=click.Choice(["headers", "records"]), default="headers", show_default=True,
              help="headers: one event per frame with headers, sizes, errors, txn numbers and faults; "
                   "records: also the keys, values and offsets of Produce and Fetch.")
@click.option("--trace-format", type=click.Choice(["segments", "jsonl", "parquet"]), default="segments", show_default=True,
              help="Trace file format: segments (fixed-layout columnar segments, the cheapest to write; "
                   "read them with `kproxy trace export`), jsonl (one JSON event a line) or parquet (needs pyarrow).")
@click.option("--trace-on-full", type=click.Choice(["block", "drop"]), default="block", show_default=True,
              help="When the trace writer falls behind: block (slow the proxy, lose nothing) or drop (count drops).")
@click.option("--trace-queue-events", type=click.IntRange(min=1), default=DEFAULT_TRACE_QUEUE_EVENTS,
              show_default=True, metavar="N",
              help="Trace events that may wait for the writer; when they are this many, --trace-on-full decides. "
                   "About half a KB each at level headers (docs/traces.md).")
@click.option("--trace-fold-idle-fetches/--no-trace-fold-idle-fetches", default=True, show_default=True,
              envvar="KPROXY_TRACE_FOLD_IDLE_FETCHES",
              help="Level records: trace a connection's run of identical record-free Fetch exchanges (an idle "
                   "consumer polling a broker that answers at once) as its first exchange and one folded "
                   "exchange with their count, times and latencies; the analysis counts them all "
                   "(docs/traces.md). --no-trace-fold-idle-fetches writes every event. "
                   "Env: KPROXY_TRACE_FOLD_IDLE_FETCHES=0.")
@click.option("--trace-rotate-mb", type=int, default=256, show_default=True, help="Rotate trace files at this size.")
@click.option("--trace-rotate-s", type=float, default=3600.0, show_default=True, help="Rotate trace files at this age.")
@click.option("--tls-cert", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="PEM certificate (chain) every client listener presents: clients then connect with TLS. "
                   "Needs --tls-key. Without it the listeners speak plaintext.")
@click.option("--tls-key", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="PEM private key of --tls-cert.")
@click.option("--tls-client-ca", type=click.Path(dir_okay=False, path_type=Path), default=None, metavar="FILE",
              help="Require client certificates signed by a CA in this PEM bundle (mutual TLS towards clients).")
@upstream_tls_options
@click.option("--max-frame-bytes", type=int, default=DEFAULT_MAX_FRAME_BYTES, show_default=True,
              help="Close a connection that announces a larger frame (Kafka's socket.request.max.bytes).")
@click.option("--connect-timeout", type=float, default=10.0, show_default=True,
              help="Seconds to wait for a broker connection before disconnecting the client; also the "
                   "longest a TLS handshake may take, with a client or a broker.")
@click.option("--idle-timeout", type=click.FloatRange(min=0), default=600.0, show_default=True, metavar="SECONDS",
              help="Close a client connection that sent nothing and awaited no answer this long, as a broker does "
                   "after connections.max.idle.ms. A connection that never sends a first request is closed after "
                   "this long too. 0: never.")
@click.option("--read-timeout", type=click.FloatRange(min=0), default=60.0, show_default=True, metavar="SECONDS",
              help="Close a client connection whose frame does not arrive whole within this long of its first "
                   "byte (a stalled or trickled request). 0: no limit.")
@click.option("--max-outstanding-requests", type=click.IntRange(min=0), default=DEFAULT_MAX_OUTSTANDING_REQUESTS,
              show_default=True, metavar="N",
              help="Read no more requests from a client connection while N of its requests await their answer "
                   "(at the broker, delayed or held by a rule, or answered and waiting for an earlier one's "
                   "turn); reading resumes as answers go back or the client hangs up. 0: no limit "
                   "(docs/reliability.md).")
@click.option("--proxy-id", default=None, help="Name of this proxy instance in traces (default: random).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True, help="Log verbosity (logs go to stderr).")
@click.option("--log-format", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text for people, json (one object per line) for log pipelines.")
def run(upstreams, listen, advertise, broker_port_base, admin, admin_token_file, generate_admin_token, no_admin,
        rules_path, seed, guard, stage_latency, fetch_leader_hints,
        traces_dir,  # noqa: ANN001
        trace_level, trace_format, trace_on_full, trace_queue_events, trace_fold_idle_fetches, trace_rotate_mb,
        trace_rotate_s, tls_cert, tls_key, tls_client_ca, upstream_tls, upstream_ca, upstream_cert, upstream_key,
        upstream_skip_hostname_check, max_frame_bytes, connect_timeout, idle_timeout, read_timeout,
        max_outstanding_requests, proxy_id, log_level, log_format) -> None:
    """Run the proxy between Kafka clients and a Kafka cluster.

    Clients bootstrap at --listen. Every response that names a broker is
    rewritten to the proxy's own listener for that broker, so clients never
    connect to a broker directly. Stop with Ctrl-C or SIGTERM: open
    connections close and every accepted trace event is written.
    """
    from kproxy.io.serve import serve

    setup_logging(log_level, log_format)
    admin_token = None if no_admin else _admin_token(admin, admin_token_file, generate_admin_token)
    client_tls, upstream_tls_settings = _tls_settings(
        tls_cert, tls_key, tls_client_ca, upstream_tls, upstream_ca, upstream_cert, upstream_key,
        upstream_skip_hostname_check,
    )
    config = ProxyConfig(
        upstreams=upstreams,
        listen=listen,
        advertise_host=advertise or (listen.host if listen.host not in ("0.0.0.0", "::") else "127.0.0.1"),
        broker_port_base=broker_port_base if broker_port_base is not None else listen.port + 1,
        admin=None if no_admin else admin,
        admin_token=admin_token,
        max_frame_bytes=max_frame_bytes,
        connect_timeout=connect_timeout,
        idle_timeout=idle_timeout,
        read_timeout=read_timeout,
        max_outstanding_requests=max_outstanding_requests,
        rules_path=rules_path,
        seed=seed,
        guard=guard,
        stage_latency=stage_latency,
        fetch_leader_hints=fetch_leader_hints,
        traces_dir=traces_dir,
        trace_level=trace_level,
        trace_format=trace_format,
        trace_on_full=trace_on_full,
        trace_queue_events=trace_queue_events,
        trace_fold_idle_fetches=trace_fold_idle_fetches,
        trace_rotate_bytes=trace_rotate_mb * 1024 * 1024,
        trace_rotate_seconds=trace_rotate_s,
        client_tls=client_tls,
        upstream_tls=upstream_tls_settings,
    )
    if proxy_id:
        config.proxy_id = proxy_id
    try:
        trio.run(serve, config)
    except (OSError, RuleFileError) as exc:  # a port in use, an unreadable or invalid rule file
        raise click.ClickException(str(exc)) from exc
    except KeyboardInterrupt:
        pass


def _admin_token(admin, token_file: Path | None, generate: bool) -> str | None:  # noqa: ANN001
    """The admin API's token, or None; refuses, before anything starts, an admin API open to the network."""
    from kproxy.io.admin_guard import AdminExposureError, check_exposure  # starlette: only when running

    if generate and token_file is None:
        raise click.UsageError("--generate-admin-token needs --admin-token-file FILE to keep the token in")
    try:
        if token_file is None:
            token = None
        elif generate:
            token = write_new_token(token_file)
            # Printed once, here: the file keeps it for `kproxy rules` (KPROXY_ADMIN_TOKEN_FILE).
            click.echo(f"kproxy admin API token (kept in {token_file}): {token}", err=True)
        else:
            token = read_token(token_file)
        check_exposure(admin.host, admin.port, token)
    except (AdminTokenError, AdminExposureError) as exc:
        raise click.ClickException(str(exc)) from None
    return token


def _tls_settings(tls_cert, tls_key, tls_client_ca, upstream_tls, upstream_ca, upstream_cert, upstream_key,  # noqa: ANN001, ANN202
                  skip_hostname_check):
    """TLS contexts for both sides, or a clear refusal naming the option or file, before anything starts."""
    from kproxy.io import tls

    if (tls_cert is None) != (tls_key is None):
        raise click.UsageError("--tls-cert and --tls-key go together: the listeners' certificate and its private key")
    if tls_client_ca is not None and tls_cert is None:
        raise click.UsageError("--tls-client-ca needs --tls-cert and --tls-key: client certificates are asked for over TLS")
    upstream = upstream_tls_files(upstream_tls, upstream_ca, upstream_cert, upstream_key, skip_hostname_check)
    try:
        client = tls.server_context(tls_cert, tls_key, tls_client_ca) if tls_cert is not None else None
    except tls.TlsConfigError as exc:
        raise click.ClickException(str(exc)) from None
    return client, upstream.settings() if upstream is not None else None
