"""Shared test set-up. Fixture modules live in tests/fixtures/ and are all loaded here."""

import os
import tempfile
from pathlib import Path

# A warm engine the user left running (kproxy engine start) must not answer the suite's analyses: they
# would run with its settings and its code. The suite's own engine test names a directory of its own.
os.environ["KPROXY_ENGINE_DIR"] = tempfile.mkdtemp(prefix="kproxy-tests-engine-")

pytest_plugins = sorted(
    f"tests.fixtures.{p.stem}"
    for p in (Path(__file__).parent / "fixtures").glob("*.py")
    if p.stem != "__init__"
)

#: Files whose tests take minutes, longest first. scripts/run-tests.sh splits
#: the suite by file over two workers; xdist hands out the files with the most
#: tests first (its default --loadscope-reorder), and this order only breaks
#: ties. Strictly longest first (--no-loadscope-reorder) was tried: the two
#: broker-heavy files then ran side by side and slowed each other, the sum of
#: the tests' times 1,151 -> 1,206 s and the run 586 -> 612 s.
LONGEST_FIRST = ("test_scenarios_e2e.py", "test_kafka_live.py", "test_install.py", "test_shrink.py",
                 "test_spark_standalone.py", "test_spark_connect.py", "test_engine.py", "test_wire_causes.py",
                 "test_wire_checks.py")


def pytest_collection_modifyitems(items) -> None:  # noqa: ANN001 - pytest's hook
    rank = {name: i for i, name in enumerate(LONGEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.path.name, len(LONGEST_FIRST)))  # stable: the rest keep their order
