"""`kproxy trace`: work with the proxy's trace files (docs/traces.md)."""

from __future__ import annotations

import sys
from pathlib import Path

import click


@click.group()
def trace() -> None:
    """Work with trace files written by `kproxy run --traces` (docs/traces.md)."""


@trace.command()
@click.argument("source", type=click.Path(exists=True, path_type=Path))
@click.option("-o", "--output", type=click.Path(dir_okay=False, path_type=Path),
              help="Write the JSON Lines here (overwritten) instead of to standard output.")
@click.option("--records/--no-records", default=True, show_default=True,
              help="Decode each partition's records from the side files (trace schema 3 and later), "
                   "as schema 2 carried them inline; --no-records leaves them null (faster).")
@click.option("--compact", is_flag=True, help="Leave out fields that are null.")
def export(source: Path, output: Path | None, records: bool, compact: bool) -> None:
    """Print the events of a trace as JSON Lines, one event a line (for jq and friends).

    SOURCE is a trace directory (every trace file in it, in the order the
    proxy wrote them: per proxy id, by sequence number) or one trace file of
    any format: segments (.events), JSON Lines (.jsonl, or .jsonl.gz once
    compressed) or Parquet (.parquet, needs pyarrow). A file cut short by a
    killed proxy is read up to its last complete segment (or line); damage
    anywhere else is an error naming the file and byte offset (or line), and
    the command exits 1.

    Example: kproxy trace export traces/ | jq -c 'select(.hazard != null)'
    """
    from kproxy.obs.trace_files import TraceFileError, export_jsonl

    out = open(output, "wb") if output is not None else sys.stdout.buffer  # noqa: SIM115 - closed below
    try:
        count = export_jsonl(source, out, records=records, compact=compact)
    except TraceFileError as exc:
        raise click.ClickException(str(exc)) from None
    except BrokenPipeError:
        # `| head`: the reader has what it wanted.
        sys.stderr.close()
        return
    finally:
        if output is not None:
            out.close()
        else:
            try:
                out.flush()
            except BrokenPipeError:
                pass
    if output is not None:
        click.echo(f"wrote {count} events to {output}", err=True)
