"""Parsers for the match fields that accept several spellings.

Each field keeps what the user wrote (so listing a rule shows it back as it was
written) and is parsed here into the form the matcher uses. Every parser raises
ValueError with one clear sentence, which pydantic reports at the field.
"""

from __future__ import annotations

import re
from typing import Any

from kproxy.faults.apis import resolve_api
from kproxy.faults.limits import MAX_API_VERSION, MAX_COUNT

VersionRange = tuple[int, int | None]  # inclusive; None: no upper bound

_VERSION_SPEC = re.compile(r"^\s*(\d+)\s*(?:(-)\s*(\d+)?|(\+))?\s*$")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _as_list(value: Any) -> list[Any]:
    if isinstance(value, list):
        if not value:
            raise ValueError("the list may not be empty (leave the key out to match anything)")
        return value
    return [value]


def parse_apis(value: Any) -> frozenset[int]:
    """`end_txn`, `EndTxn`, 26, or a list of those -> API keys."""
    keys = set()
    for item in _as_list(value):
        if not (isinstance(item, str) or _is_int(item)):
            raise ValueError(f"an API is a name like end_txn or a key number, not {item!r}")
        keys.add(resolve_api(item))
    return frozenset(keys)


def parse_versions(value: Any) -> tuple[VersionRange, ...]:
    """3, "3-5", "3+" ("3-" too), or a list of those -> inclusive ranges."""
    ranges = []
    for item in _as_list(value):
        if _is_int(item):
            if not 0 <= item <= MAX_API_VERSION:
                raise ValueError(f"a version is a number from 0 to {MAX_API_VERSION}, not {item}")
            ranges.append((item, item))
            continue
        if not isinstance(item, str):
            raise ValueError(f"a version is a number, a range like \"3-5\" or \"3+\", not {item!r}")
        m = _VERSION_SPEC.match(item)
        if not m:
            raise ValueError(f"bad version range {item[:40]!r} (use 3, \"3-5\" or \"3+\")")
        # Compared as text first: int() of a thousand digits is slow, and no version has six.
        if any(len(bound) > 5 or int(bound) > MAX_API_VERSION for bound in (m.group(1), m.group(3)) if bound):
            raise ValueError(f"bad version range {item[:40]!r}: versions go from 0 to {MAX_API_VERSION}")
        low = int(m.group(1))
        if m.group(4) or (m.group(2) and m.group(3) is None):
            ranges.append((low, None))
        elif m.group(2):
            high = int(m.group(3))
            if high < low:
                raise ValueError(f"bad version range {item!r}: {high} is below {low}")
            ranges.append((low, high))
        else:
            ranges.append((low, low))
    return tuple(ranges)


def parse_partitions(value: Any) -> frozenset[int]:
    parts = set()
    for item in _as_list(value):
        if not _is_int(item) or not 0 <= item <= MAX_COUNT:
            raise ValueError(f"a partition is a number from 0 to {MAX_COUNT}, not {item!r}")
        parts.add(item)
    return frozenset(parts)


def parse_txn_number(value: Any) -> tuple[int, int | None]:
    """2 or {min: 2, max: 4} (either bound optional) -> inclusive range."""
    if _is_int(value):
        if not 1 <= value <= MAX_COUNT:
            raise ValueError(f"a transaction number is from 1 to {MAX_COUNT}, not {value}")
        return (value, value)
    if isinstance(value, dict):
        unknown = set(value) - {"min", "max"}
        if unknown:
            raise ValueError(f"txn_number takes only min and max, not {', '.join(sorted(map(str, unknown)))}")
        if not value:
            raise ValueError("txn_number needs min, max or both")
        low, high = value.get("min", 1), value.get("max")
        for name, bound in (("min", low), ("max", high)):
            if bound is not None and (not _is_int(bound) or not 1 <= bound <= MAX_COUNT):
                raise ValueError(f"txn_number {name} is a number from 1 to {MAX_COUNT}, not {bound!r}")
        if high is not None and high < low:
            raise ValueError(f"txn_number max {high} is below min {low}")
        return (low, high)
    raise ValueError(f"txn_number is a number or {{min, max}}, not {value!r}")
