"""Read a JSON document (a rule sent to the admin API), within the bounds YAML files keep.

Python's json module accepts what JSON forbids (NaN, Infinity, and numbers
such as 1e999 that overflow to infinity) and raises RecursionError, not a
decoding error, on deep nesting. Here each of those is a RuleFileError, as
are documents deeper or larger than `kproxy.faults.limits` allows, so a rule
that could not be listed back as JSON is never installed. So is an object
that names a key twice: Python keeps the last, other readers the first, and
the YAML reader refuses it in a rule file (`{"action": {"type": "delay"},
"action": {"type": "drop"}}` would be a drop rule to one tool and a delay to
the next).
"""

from __future__ import annotations

import json
import math
from typing import Any

from kproxy.faults.errors import Problem, RuleFileError
from kproxy.faults.limits import MAX_DOCUMENT_BYTES, MAX_NESTING_DEPTH, MAX_VALUES


def read_json(body: bytes, source: str) -> Any:
    """The JSON value in `body`; RuleFileError naming `source` if it is not one, or breaks a bound."""
    if len(body) > MAX_DOCUMENT_BYTES:
        raise _refused(source, f"the document is larger than {MAX_DOCUMENT_BYTES} bytes")
    try:
        data = json.loads(body, parse_constant=_non_finite, parse_float=_finite_float,
                          object_pairs_hook=_refuse_repeated_keys)
    except (_NonFinite, _RepeatedKey) as exc:
        raise _refused(source, str(exc)) from None
    except RecursionError:
        raise _refused(source, f"the document nests deeper than {MAX_NESTING_DEPTH} levels") from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _refused(source, f"not JSON: {exc}") from None
    _check_shape(data, source)
    return data


class _NonFinite(ValueError):
    pass


class _RepeatedKey(ValueError):
    pass


def _refuse_repeated_keys(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
    obj = dict(pairs)
    if len(obj) != len(pairs):
        seen: set[str] = set()
        for key, _ in pairs:
            if key in seen:
                raise _RepeatedKey(f"the key {json.dumps(key)} appears twice in one object: which one counts "
                                   "is ambiguous, so the document is refused")
            seen.add(key)
    return obj


def _non_finite(text: str) -> float:
    raise _NonFinite(f"a number must be finite, not {text}")


def _finite_float(text: str) -> float:
    value = float(text)
    if not math.isfinite(value):
        raise _NonFinite(f"a number must be finite, not {text[:40]}")
    return value


def _check_shape(data: Any, source: str) -> None:
    """Depth and value count, walked with a stack of our own: the data may be as deep as json allows."""
    values = 0
    pending = [(data, 0)]
    while pending:
        value, depth = pending.pop()
        values += 1 + (len(value) if isinstance(value, dict) else 0)  # keys count, as in YAML
        if values > MAX_VALUES:
            raise _refused(source, f"the document holds more than {MAX_VALUES} values")
        if isinstance(value, (dict, list)):
            if depth + 1 > MAX_NESTING_DEPTH:
                raise _refused(source, f"the document nests deeper than {MAX_NESTING_DEPTH} levels")
            items = value.values() if isinstance(value, dict) else value
            pending.extend((item, depth + 1) for item in items)


def _refused(source: str, message: str) -> RuleFileError:
    return RuleFileError([Problem(source, None, (), message)])
