"""The layering docs/architecture.md promises, checked on the source itself.

- Imports run one way: no import circle anywhere in kproxy/ or the analysis
  (a module importing a package also runs that package's __init__, so that
  counts as an import of it).
- The sans-IO layers (protocol, txn, faults, pipeline) import no trio,
  socket, clock or random source: the shell passes those in.
- No module of the trio shell or of the analysis grows past 600 lines.
"""

from __future__ import annotations

import ast
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = {"kproxy": ROOT / "kproxy", "kproxy_spark": ROOT / "spark" / "kproxy_spark"}
SANS_IO = ("kproxy.protocol", "kproxy.txn", "kproxy.faults", "kproxy.pipeline")
FORBIDDEN_IN_SANS_IO = ("trio", "socket", "time", "random")
MAX_LINES = 600
LIMITED_DIRS = (ROOT / "kproxy" / "io", ROOT / "spark" / "kproxy_spark")


def _modules() -> dict[str, Path]:
    modules = {}
    for root in PACKAGES.values():
        for path in root.rglob("*.py"):
            parts = path.relative_to(root.parent).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            modules[".".join(parts)] = path
    return modules


def _imports(name: str, path: Path) -> set[str]:
    """Every module `name` imports, anywhere in the file (lazy and type-checking imports too)."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = name.split(".")
                anchor = anchor[: len(anchor) - node.level + (1 if is_package else 0)]
                base = ".".join(anchor + ([node.module] if node.module else []))
            found.add(base)
            found.update(f"{base}.{alias.name}" for alias in node.names)
    return found


def _graph() -> dict[str, set[str]]:
    modules = _modules()
    graph: dict[str, set[str]] = defaultdict(set)
    for name, path in modules.items():
        for target in _imports(name, path):
            parts = target.split(".")
            for k in range(1, len(parts) + 1):
                prefix = ".".join(parts[:k])
                # A module's own enclosing packages are already running when it is imported.
                if prefix in modules and prefix != name and not name.startswith(prefix + "."):
                    graph[name].add(prefix)
    return graph


def _circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    circles = []
    counter = 0
    for start in list(graph):
        if start in index:
            continue
        work = [(start, iter(sorted(graph[start])))]
        index[start] = low[start] = counter
        counter += 1
        stack.append(start)
        on_stack.add(start)
        while work:
            node, children = work[-1]
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(graph[child]))))
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            else:
                work.pop()
                if work:
                    low[work[-1][0]] = min(low[work[-1][0]], low[node])
                if low[node] == index[node]:
                    component = []
                    while True:
                        member = stack.pop()
                        on_stack.discard(member)
                        component.append(member)
                        if member == node:
                            break
                    if len(component) > 1:
                        circles.append(sorted(component))
    return circles


def test_no_import_circle_anywhere():
    assert _circles(_graph()) == []


def test_the_circle_finder_finds_a_circle():
    assert _circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_sans_io_layers_import_no_trio_socket_clock_or_randomness():
    offenders = []
    for name, path in _modules().items():
        if name.startswith(SANS_IO):
            for target in _imports(name, path):
                if target.split(".")[0] in FORBIDDEN_IN_SANS_IO:
                    offenders.append(f"{name} imports {target}")
    assert offenders == []


def test_no_shell_or_analysis_module_over_600_lines():
    long = []
    for directory in LIMITED_DIRS:
        for path in directory.rglob("*.py"):
            lines = len(path.read_text().splitlines())
            if lines > MAX_LINES:
                long.append(f"{path.relative_to(ROOT)}: {lines} lines")
    assert long == []
