"""`kproxy rules`: check rule files offline, and manage a running proxy's rules.

`validate` and `schema` need no proxy. The other subcommands talk to the
proxy's admin HTTP API (see docs/rules.md), at --admin HOST:PORT, with the
bearer token of --admin-token-file when the proxy has one (docs/security.md).
"""

from __future__ import annotations

import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import click

DEFAULT_ADMIN = "127.0.0.1:19080"


def _admin_options(command: Callable[..., Any]) -> Callable[..., Any]:
    """--admin and --admin-token-file, which every subcommand that calls the proxy takes."""
    command = click.option(
        "--admin-token-file", "token_file", type=click.Path(dir_okay=False, path_type=Path), default=None,
        envvar="KPROXY_ADMIN_TOKEN_FILE", metavar="FILE",
        help="File holding the admin API's bearer token, for a proxy started with one "
             "(or set KPROXY_ADMIN_TOKEN_FILE).",
    )(command)
    return click.option(
        "--admin", default=DEFAULT_ADMIN, show_default=True, envvar="KPROXY_ADMIN", metavar="HOST:PORT",
        help="Address of the proxy's admin API (or set KPROXY_ADMIN).",
    )(command)


timeout_option = click.option("--timeout", default=10.0, show_default=True, type=float,
                              help="Seconds to wait for the admin API.")


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
def rules() -> None:
    """Validate rule files, export their JSON Schema, manage a running proxy's rules.

    Rule files are YAML (docs/rules.md; examples in rules/). `validate` and
    `schema` work offline; list, add, enable, disable, delete, reset and
    reload talk to a running proxy's admin API.
    """


@rules.command()
@click.argument("files", nargs=-1, required=True, type=click.Path(dir_okay=False, path_type=Path))
def validate(files: tuple[Path, ...]) -> None:
    """Check rule FILES strictly: print "ok: FILE (N rules)" for each good file,
    and FILE:LINE: PATH: PROBLEM on stderr for each problem. Exit status 1 if
    any file has a problem.
    """
    from kproxy.faults.errors import RuleFileError
    from kproxy.faults.loader import load_rule_file

    failed = False
    for path in files:
        try:
            rule_file = load_rule_file(path)
        except RuleFileError as exc:
            failed = True
            click.echo(str(exc), err=True)
            continue
        count = len(rule_file.rules)
        click.echo(f"ok: {path} ({count} rule{'' if count == 1 else 's'})")
    if failed:
        sys.exit(1)


@rules.command()
@click.option("--indent", default=2, show_default=True, type=int, help="JSON indentation.")
def schema(indent: int) -> None:
    """Print the JSON Schema of rule files, for editors.

    For example, save it as kproxy-rules.schema.json and put
    `# yaml-language-server: $schema=kproxy-rules.schema.json` at the top of a
    rule file.
    """
    from kproxy.faults.loader import json_schema

    click.echo(json.dumps(json_schema(), indent=indent))


@rules.command(name="list")
@_admin_options
@timeout_option
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON instead of a table.")
def list_(admin: str, token_file: Path | None, timeout: float, as_json: bool) -> None:
    """List the running proxy's rules with their counters and the active phase."""
    body = _call(admin, token_file, timeout, "GET", "/rules")
    if as_json:
        click.echo(json.dumps(body, indent=2))
        return
    click.echo(f"phase: {body.get('phase') or '-'}")
    rows = [("ID", "ENABLED", "MATCH", "ACTION", "MATCHED", "APPLIED")]
    for rule in body.get("rules", []):
        counters = rule.get("counters", {})
        rows.append((
            rule["id"], "yes" if rule.get("enabled", True) else "no", _summarise_match(rule.get("match", {})),
            rule["action"]["type"], str(counters.get("matched", 0)), str(counters.get("applied", 0)),
        ))
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip())


@rules.command()
@_admin_options
@timeout_option
@click.argument("source", metavar="FILE_OR_-")
def add(admin: str, token_file: Path | None, timeout: float, source: str) -> None:
    """Add rules to the running proxy, or replace those with the same id.

    FILE_OR_- (a file, or - for stdin) holds YAML or JSON: one rule, a list of
    rules, or a whole rule file. The rules are validated here first (with
    file and line), then sent one by one (PUT /rules/ID).
    """
    from kproxy.faults.errors import RuleFileError
    from kproxy.faults.loader import decode_rule_bytes, load_rules_document

    name = "<stdin>" if source == "-" else source
    try:
        raw = sys.stdin.buffer.read() if source == "-" else Path(source).read_bytes()
    except OSError as exc:
        raise click.ClickException(f"cannot read {source}: {exc}") from exc
    try:
        # Not UTF-8, or too large: refused at its line, as the proxy refuses such a file.
        rules_to_add = load_rules_document(decode_rule_bytes(raw, name), name)
    except RuleFileError as exc:
        click.echo(str(exc), err=True)
        sys.exit(1)
    if not rules_to_add:
        raise click.ClickException(f"{name} holds no rules")
    for raw, rule in rules_to_add:
        _call(admin, token_file, timeout, "PUT", f"/rules/{rule.id}", json_body=raw)
        click.echo(f"put: {rule.id}")


def _simple_command(name: str, help_: str, method: str, path_of: Callable[[str], str], done: str) -> None:
    @rules.command(name=name, help=help_)
    @_admin_options
    @timeout_option
    @click.argument("rule_id", metavar="ID")
    def command(admin: str, token_file: Path | None, timeout: float, rule_id: str) -> None:
        _call(admin, token_file, timeout, method, path_of(rule_id))
        click.echo(f"{done}: {rule_id}")


_simple_command("enable", "Enable the rule ID on the running proxy.", "POST", lambda i: f"/rules/{i}/enable", "enabled")
_simple_command("disable", "Disable the rule ID on the running proxy (it stays listed, with its counters).",
                "POST", lambda i: f"/rules/{i}/disable", "disabled")
_simple_command("delete", "Delete the rule ID from the running proxy.", "DELETE", lambda i: f"/rules/{i}", "deleted")


@rules.command()
@_admin_options
@timeout_option
def reset(admin: str, token_file: Path | None, timeout: float) -> None:
    """Zero every rule's counters (and restart its seeded random stream)."""
    _call(admin, token_file, timeout, "POST", "/rules/reset")
    click.echo("counters reset")


@rules.command()
@_admin_options
@timeout_option
def reload(admin: str, token_file: Path | None, timeout: float) -> None:
    """Make the proxy re-read its rule file now (like SIGHUP).

    A bad file is refused with its file:line errors and the running rules stay.
    """
    body = _call(admin, token_file, timeout, "POST", "/rules/reload")
    click.echo(f"reloaded: {body.get('rules', '?')} rules")


def _call(admin: str, token_file: Path | None, timeout: float, method: str, path: str, json_body: Any = None) -> Any:
    from urllib.parse import quote

    import httpx

    headers = {}
    if token_file is not None:
        from kproxy.io.admin_token import AdminTokenError, read_token

        try:
            headers["Authorization"] = f"Bearer {read_token(token_file)}"
        except AdminTokenError as exc:
            raise click.ClickException(str(exc)) from None
    url = f"http://{admin}{quote(path)}"
    try:
        response = httpx.request(method, url, json=json_body, headers=headers, timeout=timeout)
    except httpx.HTTPError as exc:
        raise click.ClickException(f"cannot reach the admin API at {admin}: {exc}") from exc
    try:
        body = response.json()
    except ValueError:
        body = None
    if response.status_code >= 400:
        message = body.get("error") if isinstance(body, dict) else None
        click.echo(message or f"{method} {path}: HTTP {response.status_code} {response.text.strip()}", err=True)
        sys.exit(1)
    return body


def _summarise_match(match: dict[str, Any]) -> str:
    shown = {k: v for k, v in match.items() if not (k == "direction" and v == "request")}
    if not shown:
        return "*"
    return " ".join(f"{k}={json.dumps(v, separators=(',', ':')) if not isinstance(v, str) else v}" for k, v in shown.items())
