"""Shared test set-up. Fixture modules live in tests/fixtures/ and are all loaded here."""

from pathlib import Path

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}"
    for p in (Path(__file__).parent / "fixtures").glob("*.py")
    if p.stem != "__init__"
)
