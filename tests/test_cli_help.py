"""Every command's --help works and documents every option; docs/cli.md is current."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from kproxy.cli import SUBCOMMANDS, main

ROOT = Path(__file__).resolve().parent.parent


def all_commands() -> list[tuple[list[str], click.Command]]:
    found = []

    def walk(args: list[str], command: click.Command) -> None:
        found.append((args, command))
        if isinstance(command, click.Group):
            ctx = click.Context(command)
            for name in command.list_commands(ctx):
                walk([*args, name], command.get_command(ctx, name))

    ctx = click.Context(main)
    for name in SUBCOMMANDS:
        walk([name], main.get_command(ctx, name))
    return found


@pytest.mark.parametrize("args,command", all_commands(), ids=lambda v: " ".join(v) if isinstance(v, list) else "")
def test_help_is_complete(args: list[str], command: click.Command) -> None:
    result = CliRunner().invoke(main, [*args, "--help"])
    assert result.exit_code == 0, result.output
    assert command.help, f"kproxy {' '.join(args)} has no description"
    for param in command.params:
        if isinstance(param, click.Option) and not param.hidden:
            assert param.help, f"kproxy {' '.join(args)}: option {param.opts} has no help"


def test_cli_docs_are_current(tmp_path: Path) -> None:
    before = (ROOT / "docs" / "cli.md").read_text()
    subprocess.run([sys.executable, str(ROOT / "scripts" / "gen-cli-docs.py")], check=True)
    after = (ROOT / "docs" / "cli.md").read_text()
    assert before == after, "docs/cli.md is stale: run scripts/gen-cli-docs.py"


def test_top_level_help_does_not_import_spark() -> None:
    probe = subprocess.run(
        [sys.executable, "-c", "import sys, kproxy.cli\ntry:\n kproxy.cli.main(['--help'])\nexcept SystemExit: pass\nprint('pyspark' in sys.modules)"],
        capture_output=True, text=True,
    )
    assert "analyze" in probe.stdout  # the commands are listed ...
    assert probe.stdout.strip().endswith("False")  # ... without importing Spark
