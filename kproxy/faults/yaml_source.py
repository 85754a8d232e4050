"""Read YAML and remember the line of every key and list item.

PyYAML's composer keeps a start mark on every node; walking the node tree
ourselves (instead of `yaml.safe_load`) gives plain Python data plus a map
from each value's path to the line where it was written, so validation
errors can point at that line. The walk also refuses duplicate keys, which
PyYAML would otherwise silently collapse to the last one.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.nodes import MappingNode, Node, ScalarNode, SequenceNode

from kproxy.faults.errors import Path, Problem, RuleFileError


@dataclass
class SourceData:
    data: Any
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int:
        """The line of `path`, or of its nearest written ancestor (for a missing key)."""
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path, 1)


def read_yaml(text: str, source: str) -> SourceData:
    """Parse one YAML (or JSON) document; RuleFileError with file:line on any syntax problem."""
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        reason = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        raise RuleFileError([Problem(source, line, (), f"YAML syntax error: {reason}")]) from None
    except yaml.YAMLError as exc:
        raise RuleFileError([Problem(source, None, (), f"YAML error: {exc}")]) from None
    if node is None:
        return SourceData(None, {(): 1})
    walker = _Walker(source)
    result = SourceData(walker.build(node, ()), walker.lines)
    if walker.problems:
        raise RuleFileError(walker.problems)
    return result


class _Walker:
    def __init__(self, source: str) -> None:
        self.source = source
        self.lines: dict[Path, int] = {}
        self.problems: list[Problem] = []
        self.scalars = SafeConstructor()

    def build(self, node: Node, path: Path) -> Any:
        self.lines.setdefault(path, node.start_mark.line + 1)
        if isinstance(node, MappingNode):
            result: dict[Any, Any] = {}
            for key_node, value_node in node.value:
                line = key_node.start_mark.line + 1
                if key_node.tag == "tag:yaml.org,2002:merge":
                    self.problems.append(Problem(self.source, line, path, "YAML merge keys (<<) are not supported in rule files"))
                    continue
                if not isinstance(key_node, ScalarNode):
                    self.problems.append(Problem(self.source, line, path, "a key must be a plain value"))
                    continue
                key = self.scalars.construct_object(key_node)
                if key in result:
                    self.problems.append(Problem(self.source, line, path + (key,), f"duplicate key {key!r}"))
                    continue
                self.lines[path + (key,)] = line
                result[key] = self.build(value_node, path + (key,))
            return result
        if isinstance(node, SequenceNode):
            return [self.build(item, path + (i,)) for i, item in enumerate(node.value)]
        return self.scalars.construct_object(node)
