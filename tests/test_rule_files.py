"""Every shipped rule file loads, and says in one machine-readable line what its run must show.

`# Expect: CLASS[, CLASS...]` names the anomaly classes (or informational
finding names) the analysis must attribute to one of the file's rules;
`# Expect: nothing` a file whose honest outcome is none. The end-to-end
scenario tests read it.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from kproxy.faults.loader import load_rule_file

RULE_FILES = sorted((Path(__file__).parent.parent / "rules").glob("*.yaml"))
EXPECT = re.compile(r"^# Expect: (nothing|[a-zA-Z0-9-]+(?:, [a-zA-Z0-9-]+)*)$")


def expectation(path: Path) -> list[str]:
    lines = [line for line in path.read_text().splitlines() if line.startswith("# Expect")]
    assert len(lines) == 1, f"{path.name}: one '# Expect:' line, found {len(lines)}"
    match = EXPECT.match(lines[0])
    assert match, f"{path.name}: {lines[0]!r} is not '# Expect: CLASS[, CLASS...]' or '# Expect: nothing'"
    return [] if match.group(1) == "nothing" else match.group(1).split(", ")


@pytest.mark.parametrize("path", RULE_FILES, ids=[p.stem for p in RULE_FILES])
def test_rule_file_loads_and_states_its_expectation(path: Path) -> None:
    rule_file = load_rule_file(path)
    expected = expectation(path)
    assert len(set(expected)) == len(expected)
    if not rule_file.rules:
        assert expected == [], "a file without rules can cause nothing"


def test_the_control_run_expects_nothing() -> None:
    assert expectation(Path(__file__).parent.parent / "rules" / "healthy.yaml") == []
