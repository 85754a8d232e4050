#!/usr/bin/env python3
"""Regenerate docs/cli.md from the commands' own --help, so the two never disagree."""

from __future__ import annotations

from pathlib import Path

import click
from click.testing import CliRunner

from kproxy.cli import SUBCOMMANDS, main


def help_text(args: list[str]) -> str:
    result = CliRunner().invoke(main, [*args, "--help"], prog_name="kproxy", terminal_width=100)
    return result.output.rstrip()


def walk(args: list[str], command: click.Command, out: list[str]) -> None:
    out.append(f"\n## `kproxy {' '.join(args)}`\n\n```text\n{help_text(args)}\n```\n")
    if isinstance(command, click.Group):
        for name in command.list_commands(click.Context(command)):
            walk([*args, name], command.get_command(click.Context(command), name), out)


def main_() -> None:
    out = [
        "# Command line\n",
        "Generated from each command's `--help` by `scripts/gen-cli-docs.py`; rerun it after changing an option.\n",
        f"\n## `kproxy`\n\n```text\n{help_text([])}\n```\n",
    ]
    ctx = click.Context(main)
    for name in SUBCOMMANDS:
        walk([name], main.get_command(ctx, name), out)
    Path(__file__).resolve().parent.parent.joinpath("docs", "cli.md").write_text("".join(out))


if __name__ == "__main__":
    main_()
