"""Shell-style globs for ids, client ids and topics, checked when rules load.

fnmatch silently treats a malformed pattern (an unclosed `[`) as literal text,
which would make a rule that never matches. Rules are validated strictly, so
such patterns are refused with a clear message instead.
"""

from __future__ import annotations

import fnmatch
import re
from functools import lru_cache


def check_glob(pattern: str) -> str:
    """Return `pattern` if it is a well-formed glob; ValueError otherwise."""
    if pattern == "":
        raise ValueError("a glob may not be empty (use '*' to match anything)")
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


@lru_cache(maxsize=1024)
def compile_glob(pattern: str) -> re.Pattern[str]:
    # Case-sensitive on every platform: Kafka ids and topics are.
    return re.compile(fnmatch.translate(pattern))


def glob_matches(pattern: str, value: str) -> bool:
    return compile_glob(pattern).match(value) is not None
