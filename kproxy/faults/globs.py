"""Shell-style globs for ids, client ids and topics, checked and compiled when rules load.

fnmatch silently treats a malformed pattern (an unclosed `[`) as literal text,
which would make a rule that never matches. Rules are validated strictly, so
such patterns are refused with a clear message instead.

Each rule compiles its globs once, when it is loaded (off the event loop), and
keeps the compiled matcher: matching never compiles and never goes through a
shared cache, so its cost does not depend on how many other globs were seen.
"""

from __future__ import annotations

import fnmatch
import re
from collections.abc import Callable

from kproxy.faults.limits import MAX_GLOB_BYTES

GlobMatcher = Callable[[str], bool]


def check_glob(pattern: str) -> str:
    """Return `pattern` if it is a well-formed glob; ValueError otherwise."""
    if pattern == "":
        raise ValueError("a glob may not be empty (use '*' to match anything)")
    size = len(pattern.encode("utf-8", "surrogatepass"))
    if size > MAX_GLOB_BYTES:
        raise ValueError(f"a glob may be at most {MAX_GLOB_BYTES} bytes long, this one is {size}")
    i = 0
    while i < len(pattern):
        if pattern[i] == "[":
            j = i + 1
            if j < len(pattern) and pattern[j] == "!":
                j += 1
            if j < len(pattern) and pattern[j] == "]":
                j += 1  # a leading ']' is a literal member of the class
            close = pattern.find("]", j)
            if close == -1:
                raise ValueError(f"bad glob {pattern!r}: '[' at position {i} is never closed")
            i = close + 1
        else:
            i += 1
    return pattern


def compile_glob(pattern: str) -> GlobMatcher:
    """A matcher for a checked glob: call it with a value, get whether it matches."""
    if not any(c in pattern for c in "*?["):
        return pattern.__eq__  # most ids and topics are written out: no regex at all
    if pattern == "*":
        return lambda value: True
    if "?" not in pattern and "[" not in pattern:
        return _stars_only(pattern)
    # Case-sensitive on every platform: Kafka ids and topics are. Compiled
    # directly, not through re's module cache, which holds only a few hundred.
    regex = re.compile(fnmatch.translate(pattern))
    return lambda value: regex.match(value) is not None


def _stars_only(pattern: str) -> GlobMatcher:
    # Literal pieces between stars, found left to right: linear in the value,
    # and nothing to compile (a regex of thousands of stars takes tens of ms).
    head, *middle, tail = pattern.split("*")
    pieces = [piece for piece in middle if piece]
    shortest = len(head) + len(tail) + sum(map(len, pieces))

    def matches(value: str) -> bool:
        if len(value) < shortest or not value.startswith(head) or not value.endswith(tail):
            return False
        at, end = len(head), len(value) - len(tail)
        for piece in pieces:
            found = value.find(piece, at, end)
            if found < 0:
                return False
            at = found + len(piece)
        return True

    return matches
