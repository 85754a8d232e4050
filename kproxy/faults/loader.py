"""Load and validate rule files and single rules, with file and line in every error.

Validation is one pass of pydantic (each value on its own) and one pass of
`kproxy.faults.consistency` (how parts relate); both report paths, which are
mapped back to the lines the YAML reader recorded.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterable
from os import PathLike
from typing import Any

from pydantic import ValidationError

from kproxy.faults.consistency import file_problems, rule_problems
from kproxy.faults.errors import Path, Problem, RuleFileError
from kproxy.faults.limits import MAX_DOCUMENT_BYTES
from kproxy.faults.model import Rule, RuleFile
from kproxy.faults.yaml_source import SourceData, read_yaml


def load_rule_file(path: str | PathLike[str]) -> RuleFile:
    """Read, parse and validate a rule file; RuleFileError names the file and line of each problem."""
    source = str(path)
    try:
        # Non-blocking, so a FIFO opens at once (a plain open waits for a writer, for
        # ever); what was opened is then checked, so nothing swapped in between slips by.
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
    except OSError as exc:
        raise RuleFileError([Problem(source, None, (), f"cannot read the rule file: {exc}")]) from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            raise RuleFileError([Problem(source, None, (), f"the rule file is {_kind_of(mode)}, not a regular file: refused")])
        os.set_blocking(fd, True)
        with os.fdopen(fd, "rb") as file:
            fd = -1  # the file object closes it now
            # One byte past the limit tells a file that is too large without reading all of it.
            raw = file.read(MAX_DOCUMENT_BYTES + 1)
    except OSError as exc:
        raise RuleFileError([Problem(source, None, (), f"cannot read the rule file: {exc}")]) from None
    finally:
        if fd >= 0:
            os.close(fd)
    return load_rule_text(decode_rule_bytes(raw, source), source)


def decode_rule_bytes(raw: bytes, source: str) -> str:
    """The text of a rule file's bytes; RuleFileError naming the line where it passes the size
    limit or stops being UTF-8 (an editor goes to a line, not to a byte offset)."""
    if len(raw) > MAX_DOCUMENT_BYTES:
        line = raw.count(b"\n", 0, MAX_DOCUMENT_BYTES) + 1
        raise RuleFileError([Problem(source, line, (), f"the rule file is larger than {MAX_DOCUMENT_BYTES} bytes: "
                                                       "its byte past the limit is on this line")])
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw.count(b"\n", 0, exc.start) + 1
        column = exc.start - (raw.rfind(b"\n", 0, exc.start) + 1) + 1
        raise RuleFileError([Problem(source, line, (), f"not UTF-8: byte 0x{raw[exc.start]:02x} at byte {column} of "
                                                       f"the line ({exc.reason}); a rule file is UTF-8 text")]) from None


def _kind_of(mode: int) -> str:
    kinds = ((stat.S_ISFIFO, "a FIFO (named pipe)"), (stat.S_ISDIR, "a directory"), (stat.S_ISCHR, "a character device"),
             (stat.S_ISBLK, "a block device"), (stat.S_ISSOCK, "a socket"))
    return next((name for test, name in kinds if test(mode)), "something else")


def load_rule_text(text: str, source_name: str) -> RuleFile:
    return validate_rule_file(read_yaml(text, source_name), source_name)


def validate_rule_file(src: SourceData, source: str) -> RuleFile:
    if not isinstance(src.data, dict):
        raise RuleFileError([Problem(source, src.line_of(()), (),
                                     "a rule file is a mapping with `version: 1` and `rules: [...]`")])
    try:
        rule_file = RuleFile.model_validate(src.data)
    except ValidationError as exc:
        raise RuleFileError(_pydantic_problems(exc, src, source)) from None
    problems = file_problems(rule_file)
    if problems:
        raise RuleFileError([Problem(source, src.line_of(p.path), p.path, p.message) for p in problems])
    return rule_file


def validate_rule(data: Any, source: str, phase_names: Iterable[str] | None = None,
                  src: SourceData | None = None, prefix: Path = ()) -> Rule:
    """Validate one rule (from the admin API or `kproxy rules add`).

    `phase_names` are those of the schedule the rule joins (None: no schedule);
    `src` and `prefix` locate the rule in a YAML document, when there is one.
    """
    lines = src or SourceData(data, {})
    try:
        rule = Rule.model_validate(data)
    except ValidationError as exc:
        raise RuleFileError(_pydantic_problems(exc, lines, source, prefix)) from None
    problems = rule_problems(rule, phase_names)
    if problems:
        raise RuleFileError([_locate(prefix + p.path, p.message, lines, source) for p in problems])
    return rule


def load_rules_document(text: str, source: str) -> list[tuple[dict[str, Any], Rule]]:
    """Rules to add from a document holding one rule, a list of rules, or a whole rule file.

    Returns each rule as written (to send on) with its validated model.
    Phase references are left to the proxy, which knows its schedule.
    """
    src = read_yaml(text, source)
    data = src.data
    if isinstance(data, dict) and ("rules" in data or "version" in data):
        validate_rule_file(src, source)
        return [(raw, Rule.model_validate(raw)) for raw in data.get("rules", [])]
    if isinstance(data, dict):
        return [(data, _rule_without_phases(data, source, src, ()))]
    if isinstance(data, list):
        problems: list[Problem] = []
        rules = []
        for i, raw in enumerate(data):
            try:
                rules.append((raw, _rule_without_phases(raw, source, src, (i,))))
            except RuleFileError as exc:
                problems.extend(exc.problems)
        if problems:
            raise RuleFileError(problems)
        return rules
    raise RuleFileError([Problem(source, src.line_of(()), (), "expected a rule, a list of rules, or a rule file")])


def _rule_without_phases(data: Any, source: str, src: SourceData, prefix: Path) -> Rule:
    try:
        rule = Rule.model_validate(data)
    except ValidationError as exc:
        raise RuleFileError(_pydantic_problems(exc, src, source, prefix)) from None
    phase_names = [rule.match.phase] if rule.match.phase else None
    problems = rule_problems(rule, phase_names)
    if problems:
        raise RuleFileError([_locate(prefix + p.path, p.message, src, source) for p in problems])
    return rule


def json_schema() -> dict[str, Any]:
    """JSON Schema of a rule file, for editors (yaml-language-server, VS Code, IntelliJ)."""
    schema = RuleFile.model_json_schema()
    schema["$schema"] = "https://json-schema.org/draft/2020-12/schema"
    schema["title"] = "kproxy rule file"
    return schema


def _pydantic_problems(exc: ValidationError, src: SourceData, source: str, prefix: Path = ()) -> list[Problem]:
    problems = []
    seen = set()
    for error in exc.errors(include_url=False):
        message = error["msg"].removeprefix("Value error, ")
        problem = _locate(prefix + tuple(error["loc"]), message, src, source)
        if (problem.line, problem.path, problem.message) not in seen:
            seen.add((problem.line, problem.path, problem.message))
            problems.append(problem)
    return problems


def _locate(loc: Path, message: str, src: SourceData, source: str) -> Problem:
    """Follow a pydantic location through the data; parts not in the data are union tags, skipped."""
    node: Any = src.data
    path: Path = ()
    for i, part in enumerate(loc):
        if isinstance(node, dict) and part in node:
            node, path = node[part], path + (part,)
        elif isinstance(node, list) and isinstance(part, int) and 0 <= part < len(node):
            node, path = node[part], path + (part,)
        elif i == len(loc) - 1 and isinstance(node, dict) and isinstance(part, str):
            path = path + (part,)  # a missing key: named in the path, reported at its mapping's line
    line = src.line_of(path)
    return Problem(source, line, path, message)
