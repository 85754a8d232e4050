"""How the default suite is laid out for its two workers (README, "Tests").

scripts/run-tests.sh gives each xdist worker whole files, and a session
fixture is set up once per worker that asks for it. The costly ones (a
Kafka JVM; every shipped scenario run and analysed) are therefore asked for
from one file each: a second file would set the same thing up again on the
other worker.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).parent

#: Session fixtures that cost a JVM or minutes, and the one file that uses each.
ONE_FILE_EACH = {"kafka_broker": "test_kafka_live.py", "scenario_runs": "test_scenarios_e2e.py"}


def _requested(path: Path) -> set[str]:
    """Names a file's functions take as arguments (tests and fixtures) or name in getfixturevalue/usefixtures."""
    names: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.update(a.arg for a in node.args.args + node.args.kwonlyargs)
        elif isinstance(node, ast.Constant) and isinstance(node.value, str):
            names.add(node.value)  # request.getfixturevalue("..."), pytest.mark.usefixtures("...")
    return names


def test_each_costly_session_fixture_is_used_from_one_file():
    users: dict[str, list[str]] = {name: [] for name in ONE_FILE_EACH}
    for path in sorted(TESTS.glob("test_*.py")):
        if path.name == Path(__file__).name:
            continue
        for name in ONE_FILE_EACH.keys() & _requested(path):
            users[name].append(path.name)
    assert users == {name: [where] for name, where in ONE_FILE_EACH.items()}, (
        "a costly session fixture is set up again on each worker whose files ask for it; "
        "put its tests in the one file that uses it")
