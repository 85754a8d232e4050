"""Rule errors that say where: `rules/foo.yaml:12: rules[0].action.ms: message`."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

Path = tuple[str | int, ...]


def format_path(path: Path) -> str:
    text = ""
    for part in path:
        text += f"[{part}]" if isinstance(part, int) else (f".{part}" if text else str(part))
    return text


@dataclass(frozen=True)
class Problem:
    source: str  # a file name, or a description such as "rule 'x'" for the admin API
    line: int | None  # 1-based; None when the input had no lines (JSON from the admin API)
    path: Path
    message: str

    def __str__(self) -> str:
        where = self.source if self.line is None else f"{self.source}:{self.line}"
        # One problem a line, even when a parser's own message spans several.
        message = " ".join(self.message.split())
        return f"{where}: {format_path(self.path)}: {message}" if self.path else f"{where}: {message}"


class RuleFileError(ValueError):
    """A rule file or rule was refused. `str()` gives one problem a line, in file order."""

    def __init__(self, problems: Sequence[Problem]) -> None:
        self.problems = sorted(problems, key=lambda p: (p.source, p.line or 0))
        super().__init__("\n".join(str(p) for p in self.problems))
