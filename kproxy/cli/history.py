"""`kproxy history`: import Jepsen EDN histories, validate history files."""

from __future__ import annotations

from pathlib import Path

import click


@click.group()
def history() -> None:
    """Work with client histories (JSON Lines, see docs/history.md)."""


@history.command("import")
@click.argument("source", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("-o", "--output", required=True, type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON Lines history here (overwritten).")
def import_(source: Path, output: Path) -> None:
    """Convert a Jepsen queue-workload EDN history (SOURCE) to a kproxy history.

    SOURCE is a vector of op maps or one op map per line (Jepsen's
    history.edn). Nemesis ops and ops the format does not know are skipped
    and counted. Keys and values that are keywords or strings are numbered;
    their originals go to OUTPUT.names.json, which `kproxy analyze` carries
    into the report (docs/history.md).
    """
    from kproxy.workload.edn_import import EdnImportError, import_edn

    try:
        summary = import_edn(source, output)
    except EdnImportError as exc:
        raise click.ClickException(str(exc)) from None
    skipped = sum(summary.skipped_unknown_f.values())
    detail = ", ".join(f"{f}: {n}" for f, n in sorted(summary.skipped_unknown_f.items()))
    click.echo(f"wrote {summary.written} ops to {output}; skipped {summary.skipped_nemesis} nemesis ops"
               f" and {skipped} ops of other functions{f' ({detail})' if detail else ''}")
    if summary.names_path is not None:
        click.echo(f"{summary.named_keys} named keys and {summary.named_values} named values: "
                   f"originals in {summary.names_path}")


@history.command()
@click.argument("path", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def validate(path: Path) -> None:
    """Check a history file; exit 1 naming file:line of the first problem."""
    from kproxy.workload.history import HistoryFormatError, validate_history

    try:
        stats = validate_history(path)
    except HistoryFormatError as exc:
        click.echo(f"invalid: {exc}", err=True)
        raise SystemExit(1) from None
    types = ", ".join(f"{n} {t}" for t, n in stats.by_type.items())
    click.echo(f"valid: {stats.ops} ops ({types}), {stats.processes} processes, {stats.keys} keys")
