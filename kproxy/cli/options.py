"""Options that several commands share, defined and checked once.

The upstream TLS options are `kproxy run`'s; `kproxy demo --bootstrap` and
`kproxy shrink --bootstrap` take the same ones for the user's cluster and
hand them to the proxy each run starts, so every command accepts and refuses
the same things with the same words. The broker-or-address checks of the two
commands that run the demo's loop live here too.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

from kproxy.proxy_process import UpstreamTlsFiles

_FILE = click.Path(dir_okay=False, path_type=Path)

_UPSTREAM_TLS = (
    click.option("--upstream-tls", is_flag=True,
                 help="Connect to brokers with TLS, verifying each broker's certificate against the name it "
                      "advertises (also sent as SNI)."),
    click.option("--upstream-ca", type=_FILE, default=None, metavar="FILE",
                 help="PEM CA bundle that brokers' certificates must chain to (default: the system's CAs)."),
    click.option("--upstream-cert", type=_FILE, default=None, metavar="FILE",
                 help="PEM client certificate for brokers that require mutual TLS (with --upstream-key)."),
    click.option("--upstream-key", type=_FILE, default=None, metavar="FILE",
                 help="PEM private key of --upstream-cert."),
    click.option("--upstream-skip-hostname-check", is_flag=True,
                 help="Accept a broker certificate that does not name the broker (the chain is still verified). "
                      "For test clusters only."),
)


def upstream_tls_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """Add --upstream-tls, --upstream-ca, --upstream-cert, --upstream-key and --upstream-skip-hostname-check."""
    for option in reversed(_UPSTREAM_TLS):
        command = option(command)
    return command


def upstream_tls_files(upstream_tls: bool, upstream_ca: Path | None, upstream_cert: Path | None,
                       upstream_key: Path | None, upstream_skip_hostname_check: bool) -> UpstreamTlsFiles | None:
    """The upstream TLS options, checked: None without --upstream-tls; a usage error for a file option
    without it; a clear error naming the file for a certificate, key or CA that cannot be used."""
    from kproxy.io import tls

    if not upstream_tls:
        given = [name for name, value in (("--upstream-ca", upstream_ca), ("--upstream-cert", upstream_cert),
                                          ("--upstream-key", upstream_key)) if value is not None]
        if upstream_skip_hostname_check:
            given.append("--upstream-skip-hostname-check")
        if given:
            verb = "applies" if len(given) == 1 else "apply"
            raise click.UsageError(f"{', '.join(given)} {verb} to TLS towards brokers: add --upstream-tls")
        return None
    files = UpstreamTlsFiles(upstream_ca, upstream_cert, upstream_key, upstream_skip_hostname_check)
    try:
        files.settings()  # reads every file now, before anything starts
    except tls.TlsConfigError as exc:
        raise click.ClickException(str(exc)) from None
    return files


def check_target(broker_kind: str | None, bootstrap: str | None, tls: UpstreamTlsFiles | None) -> None:
    """`--broker` (start one), `--bootstrap` (the user's) and the upstream TLS options, checked together:
    usage errors for both a kind and an address, an address that is not one HOST:PORT, and TLS
    without an address (the embedded brokers speak plaintext)."""
    if broker_kind is not None and bootstrap is not None:
        raise click.UsageError("--broker starts a broker and --bootstrap names one: give one of them")
    if bootstrap is not None and not is_host_port(bootstrap):
        raise click.BadParameter(f"{bootstrap!r} is not one HOST:PORT", param_hint="--bootstrap")
    if tls is not None and bootstrap is None:
        raise click.UsageError("--upstream-tls is for a cluster of your own (--bootstrap HOST:PORT): "
                               "the embedded brokers speak plaintext")


def is_host_port(text: str) -> bool:
    # One address: the proxy learns every other broker from its metadata.
    from kproxy.protocol.endpoints import parse_endpoint

    if "," in text:
        return False
    try:
        return parse_endpoint(text, default_host=None).port > 0
    except ValueError:
        return False


def parse_settings(ctx: click.Context, param: click.Parameter, values: tuple[str, ...]) -> dict[str, str]:
    """KEY=VALUE options into a dict (a callback)."""
    from kproxy.workload.clients.base import parse_setting

    out = {}
    for text in values:
        try:
            key, value = parse_setting(text)
        except ValueError as exc:
            raise click.BadParameter(str(exc), ctx, param) from None
        out[key] = value
    return out


#: What --client-config adds for the commands whose clients reach a proxy of their own (demo, shrink).
LOOPBACK_CLIENTS = ("The clients reach the proxy on loopback in plaintext: with SASL, "
                    "security.protocol=SASL_PLAINTEXT (the proxy speaks TLS to the cluster).")


def client_config_option(more_help: str = "") -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """--client-config KEY=VALUE: a setting of every client a run makes (a secured cluster's SASL and TLS)."""
    return click.option(
        "--client-config", multiple=True, callback=parse_settings, metavar="KEY=VALUE",
        help="Setting of every client the run makes, the admin client that creates topics included, in the "
             "client's own naming (repeatable): security.protocol, SASL and CA settings for a secured "
             "cluster (docs/security.md)." + (f" {more_help}" if more_help else ""),
    )
