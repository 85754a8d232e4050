"""Read YAML, within bounds, and remember the line of every key and list item.

The reader builds plain Python data from PyYAML's event stream with a stack
of its own instead of PyYAML's recursive composer, so any input, however deep
or however aliased, costs bounded time and memory and fails as a
RuleFileError with file and line (see `kproxy.faults.limits`):

- nesting deeper than MAX_NESTING_DEPTH, or more than MAX_VALUES values once
  aliases are expanded (alias bombs), stops the reading at once;
- an alias to a collection that contains it (a recursive document) is refused;
- explicit tags other than the core ones (!!str, !!int, !!float, !!bool,
  !!null, !!map, !!seq) are refused, and so are numbers that are not finite
  (.inf, .nan) or longer than any rule needs;
- duplicate keys and merge keys (<<) are refused, where PyYAML would
  silently keep the last key or copy one mapping into another.

Each value's path (as pydantic reports locations) maps to the line where it
was written, so validation errors can point at that line.
"""

from __future__ import annotations

import copy
import math
from dataclasses import dataclass, field
from typing import Any

import yaml
from yaml.constructor import SafeConstructor
from yaml.events import (
    AliasEvent,
    DocumentStartEvent,
    Event,
    MappingEndEvent,
    MappingStartEvent,
    ScalarEvent,
    SequenceEndEvent,
    SequenceStartEvent,
)
from yaml.nodes import ScalarNode
from yaml.resolver import Resolver

from kproxy.faults.errors import Path, Problem, RuleFileError
from kproxy.faults.limits import MAX_DOCUMENT_BYTES, MAX_NESTING_DEPTH, MAX_VALUES

# libyaml's parser is a state machine in C, about fifteen times faster than
# PyYAML's own; both emit the same events.
_LOADER = getattr(yaml, "CSafeLoader", yaml.SafeLoader)

_CORE = "tag:yaml.org,2002:"
_STR, _INT, _FLOAT, _MERGE = _CORE + "str", _CORE + "int", _CORE + "float", _CORE + "merge"
_MAP, _SEQ = _CORE + "map", _CORE + "seq"
_EXPLICIT_SCALAR_TAGS = frozenset(_CORE + t for t in ("str", "int", "float", "bool", "null"))
# Plain scalars may also resolve to a timestamp (which validation then refuses
# with its line), to `merge` (<<) or to `value` (=); the last two are text
# anywhere but in a key.
_CONSTRUCTED_TAGS = _EXPLICIT_SCALAR_TAGS | {_CORE + "timestamp"}
_CONSTRUCTORS = SafeConstructor.yaml_constructors
# The longest number a rule needs is a 64-bit seed (20 digits). YAML 1.1 reads
# 1:2:3 as base 60, and a megabyte of it would take minutes to convert.
_MAX_NUMBER_CHARS = 64


@dataclass
class SourceData:
    data: Any
    lines: dict[Path, int] = field(default_factory=dict)

    def line_of(self, path: Path) -> int | None:
        """The line of `path`, or of its nearest written ancestor (for a missing key);
        None for data that came with no lines (built in code, not read from text)."""
        if not self.lines:
            return None
        while path not in self.lines and path:
            path = path[:-1]
        return self.lines.get(path, 1)


def read_yaml(text: str, source: str) -> SourceData:
    """Parse one YAML (or JSON) document; RuleFileError with file:line on any problem."""
    if len(text) > MAX_DOCUMENT_BYTES:
        line = text.count("\n", 0, MAX_DOCUMENT_BYTES) + 1
        raise RuleFileError([Problem(source, line, (), f"the document is larger than {MAX_DOCUMENT_BYTES} bytes: "
                                                       "the limit falls on this line")])
    builder = _Builder(source)
    try:
        for event in yaml.parse(text, Loader=_LOADER):
            builder.feed(event)
    except _Stop:
        pass
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        line = mark.line + 1 if mark is not None else None
        reason = " ".join(str(part) for part in (exc.context, exc.problem) if part)
        if "nesting depth" in reason:
            # Newer PyYAML (6.0.4) bounds nesting in its scanner, which reads
            # ahead of the events, so its own limit can fire before ours.
            builder.problems.append(Problem(source, line, (), f"the document nests deeper than {MAX_NESTING_DEPTH} levels"))
        else:
            builder.problems.append(Problem(source, line, (), f"YAML syntax error: {reason}"))
    except yaml.reader.ReaderError as exc:
        # Raised before any mark exists; its position is a character offset.
        line = text.count("\n", 0, exc.position) + 1
        builder.problems.append(Problem(source, line, (), f"YAML error: {exc.reason} (character {exc.character!r})"))
    except yaml.YAMLError as exc:
        builder.problems.append(Problem(source, None, (), f"YAML error: {exc}"))
    if builder.problems:
        raise RuleFileError(builder.problems)
    return builder.result()


class _Stop(Exception):
    """The input broke a bound: reading it further would cost without limit."""


@dataclass
class _Anchored:
    value: Any
    lines: list[tuple[Path, int]]  # paths relative to the anchored value, for the lines below it
    size: int  # values it holds, itself included
    height: int  # nesting levels it spans: 0 for a scalar


_DROPPED = object()  # the key of a refused entry: its value is read and dropped


@dataclass
class _Open:
    """A collection being read."""

    container: dict[Any, Any] | list[Any]
    path: Path | None  # None: it will be dropped (the key or the value of a refused entry)
    level: int  # 1 for the document's top collection
    anchor: str | None
    values_before: int
    log_start: int
    deepest: int  # the deepest level reached inside it so far
    # mappings only: the key whose value comes next, or None while a key is awaited
    key: Any = None
    key_line: int = 0
    awaiting_key: bool = True


class _Builder:
    def __init__(self, source: str) -> None:
        self.source = source
        self.problems: list[Problem] = []
        self.stack: list[_Open] = []
        self.root: Any = None
        self.values = 0
        # (path, line) of each value written in the document, in document order,
        # so that the entries of one collection's contents are one slice.
        self.line_log: list[tuple[Path, int]] = []
        self.anchors: dict[str, _Anchored] = {}
        self.anchor_names: set[str] = set()  # defined or being defined
        self.documents = 0
        self.resolver = Resolver()
        self.constructor = SafeConstructor()

    def result(self) -> SourceData:
        if not self.line_log:
            return SourceData(None, {(): 1})
        return SourceData(self.root, dict(self.line_log))

    # -- events --------------------------------------------------------------

    def feed(self, event: Event) -> None:
        line = event.start_mark.line + 1
        if isinstance(event, ScalarEvent):
            self._count(1, line)
            self._define_anchor(event.anchor, line)
            if self._in_key_position():
                key = self._scalar(event, line, None)
                self._remember_scalar_anchor(event, key)
                self._take_key(key, line, is_merge=self._is_merge_key(event))
            else:
                value = self._scalar(event, line, self._begin_value(line))
                self._remember_scalar_anchor(event, value)
                self._finish_value(value)
        elif isinstance(event, AliasEvent):
            self._alias(event.anchor, line)
        elif isinstance(event, (MappingStartEvent, SequenceStartEvent)):
            self._open(event, line)
        elif isinstance(event, (MappingEndEvent, SequenceEndEvent)):
            self._close()
        elif isinstance(event, DocumentStartEvent):
            self.documents += 1
            if self.documents > 1:
                self._stop(line, "a rule file is one YAML document, but a second one starts here")

    def _open(self, event: MappingStartEvent | SequenceStartEvent, line: int) -> None:
        is_mapping = isinstance(event, MappingStartEvent)
        level = len(self.stack) + 1
        if level > MAX_NESTING_DEPTH:
            self._stop(line, f"the document nests deeper than {MAX_NESTING_DEPTH} levels")
        self._count(1, line)
        self._define_anchor(event.anchor, line)
        if self._in_key_position():
            self._problem(line, "a key must be a plain value")
            path = None  # the collection is read and dropped, and so will its value be
        else:
            path = self._begin_value(line)
        if event.tag not in (None, "!", _MAP if is_mapping else _SEQ):
            self._problem(line, f"unknown tag {_short_tag(event.tag)}: rule files use plain YAML, without tags",
                          path or ())
        self.stack.append(_Open(
            container={} if is_mapping else [], path=path, level=level, anchor=event.anchor,
            values_before=self.values - 1, log_start=len(self.line_log), deepest=level,
        ))

    def _close(self) -> None:
        done = self.stack.pop()
        if done.anchor is not None:
            prefix = 0 if done.path is None else len(done.path)
            below = [(p[prefix:], ln) for p, ln in self.line_log[done.log_start:]] if done.path is not None else []
            self.anchors[done.anchor] = _Anchored(done.container, below, self.values - done.values_before,
                                                  done.deepest - done.level + 1)
        if self.stack:
            self.stack[-1].deepest = max(self.stack[-1].deepest, done.deepest)
        parent = self.stack[-1] if self.stack else None
        if parent is not None and isinstance(parent.container, dict) and parent.awaiting_key:
            parent.key, parent.awaiting_key = _DROPPED, False  # it was a collection used as a key
            return
        self._finish_value(done.container)

    def _alias(self, name: str, line: int) -> None:
        anchored = self.anchors.get(name)
        if anchored is None:
            recursive = any(frame.anchor == name for frame in self.stack)
            self._problem(line, f"alias *{name} is used inside the collection it names" if recursive
                          else f"alias *{name} names no anchor defined before it")
            anchored = _Anchored(None, [], 1, 0)
        if self.values + anchored.size > MAX_VALUES:
            self._stop(line, f"aliases expand the document beyond {MAX_VALUES} values")
        deepest = len(self.stack) + anchored.height
        if deepest > MAX_NESTING_DEPTH:
            self._stop(line, f"alias *{name} nests the document deeper than {MAX_NESTING_DEPTH} levels")
        self.values += anchored.size
        if self._in_key_position():
            if anchored.height:
                self._problem(line, "a key must be a plain value")
                self._take_key(_DROPPED, line, is_merge=False)
            else:
                self._take_key(anchored.value, line, is_merge=False)
            return
        path = self._begin_value(line)
        if path is not None:
            self.line_log.extend((path + relative, ln) for relative, ln in anchored.lines)
        if self.stack:
            self.stack[-1].deepest = max(self.stack[-1].deepest, deepest)
        self._finish_value(copy.deepcopy(anchored.value) if anchored.height else anchored.value)

    # -- placing values ------------------------------------------------------

    def _in_key_position(self) -> bool:
        return bool(self.stack) and isinstance(self.stack[-1].container, dict) and self.stack[-1].awaiting_key

    def _take_key(self, key: Any, line: int, *, is_merge: bool) -> None:
        parent = self.stack[-1]
        if is_merge:
            self._problem(line, "YAML merge keys (<<) are not supported in rule files")
            key = _DROPPED
        elif key is not _DROPPED and key in parent.container:
            self._problem(line, f"duplicate key {key!r}", () if parent.path is None else parent.path + (key,))
            key = _DROPPED
        parent.key, parent.key_line, parent.awaiting_key = key, line, False

    def _begin_value(self, line: int) -> Path | None:
        """The path of the value starting at `line` (None if it will be dropped), its line logged."""
        if not self.stack:
            path: Path | None = ()
        else:
            parent = self.stack[-1]
            if parent.path is None:
                path = None
            elif isinstance(parent.container, dict):
                path = None if parent.key is _DROPPED else parent.path + (parent.key,)
                line = parent.key_line  # a value's line is its key's
            else:
                path = parent.path + (len(parent.container),)
        if path is not None:
            self.line_log.append((path, line))
        return path

    def _finish_value(self, value: Any) -> None:
        if not self.stack:
            self.root = value
            return
        parent = self.stack[-1]
        if isinstance(parent.container, list):
            parent.container.append(value)
            return
        if parent.key is not _DROPPED:
            parent.container[parent.key] = value
        parent.key, parent.awaiting_key = None, True

    # -- scalars, anchors, bounds ----------------------------------------------

    def _scalar(self, event: ScalarEvent, line: int, path: Path | None) -> Any:
        """The scalar's value; a problem (reported at `path`, when known) if it cannot be read."""
        where = path or ()
        tag = event.tag
        if tag in (None, "!"):
            tag = self.resolver.resolve(ScalarNode, event.value, event.implicit)
        elif tag not in _EXPLICIT_SCALAR_TAGS:
            self._problem(line, f"unknown tag {_short_tag(tag)}: rule files use plain YAML, without tags", where)
            return event.value
        if tag not in _CONSTRUCTED_TAGS:
            tag = _STR
        if tag in (_INT, _FLOAT) and len(event.value) > _MAX_NUMBER_CHARS:
            self._problem(line, f"a number of more than {_MAX_NUMBER_CHARS} characters", where)
            return None
        node = ScalarNode(tag, event.value, event.start_mark, event.end_mark, event.style)
        try:
            value = _CONSTRUCTORS[tag](self.constructor, node)
        except Exception as exc:  # PyYAML's constructors fail on odd text in many ways (ValueError, IndexError, ...)
            self._problem(line, f"cannot read {_shorten(event.value)} as {_short_tag(tag)}: {exc}", where)
            return None
        if isinstance(value, float) and not math.isfinite(value):
            self._problem(line, f"a number must be finite, not {_shorten(event.value)}", where)
        return value

    def _remember_scalar_anchor(self, event: ScalarEvent, value: Any) -> None:
        if event.anchor is not None:
            self.anchors[event.anchor] = _Anchored(value, [], 1, 0)

    def _is_merge_key(self, event: ScalarEvent) -> bool:
        return event.tag is None and event.implicit[0] and \
            self.resolver.resolve(ScalarNode, event.value, event.implicit) == _MERGE

    def _define_anchor(self, name: str | None, line: int) -> None:
        if name is None:
            return
        if name in self.anchor_names:
            self._problem(line, f"anchor &{name} is defined twice")
        self.anchor_names.add(name)

    def _count(self, values: int, line: int) -> None:
        self.values += values
        if self.values > MAX_VALUES:
            self._stop(line, f"the document holds more than {MAX_VALUES} values")

    def _problem(self, line: int, message: str, path: Path = ()) -> None:
        self.problems.append(Problem(self.source, line, path, message))

    def _stop(self, line: int, message: str) -> None:
        self._problem(line, message)
        raise _Stop


def _short_tag(tag: str) -> str:
    return "!!" + tag.removeprefix(_CORE) if tag.startswith(_CORE) else tag


def _shorten(text: str, limit: int = 40) -> str:
    return repr(text if len(text) <= limit else text[:limit] + "...")

