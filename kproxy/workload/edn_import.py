"""Import Jepsen EDN histories of the Kafka queue workload into kproxy's JSON Lines history.

Accepted input: a vector of op maps, or one op map per line (Jepsen's
history.edn). Keywords become strings (`:ok` -> "ok"), micro-ops keep their
shape (`[:send 1 [2 3]]` -> ["send", 1, [2, 3]], `[:poll {1 [[0 1]]}]` ->
["poll", {"1": [[0, 1]]}]), `:time` is kept. Ops of the nemesis (any
non-integer `:process`) and ops whose `:f` the format does not know (e.g.
`:debug-topic-partitions`) are skipped, so indices are renumbered from 0.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import edn_format
from edn_format import Keyword

from kproxy.workload.history import FUNCTIONS, HistoryWriter, Op, op_from_dict


class EdnImportError(ValueError):
    """The EDN input is not a queue-workload history."""


@dataclass(frozen=True)
class ImportSummary:
    written: int
    skipped_nemesis: int
    skipped_unknown_f: dict[str, int]


def _plain(x: Any) -> Any:
    """EDN values to JSON-ready Python values (keywords to their names, maps keyed by decimal text)."""
    if isinstance(x, Keyword):
        return x.name
    if isinstance(x, Mapping):
        return {(str(k) if isinstance(k, int) else _plain(k)): _plain(v) for k, v in x.items()}
    if isinstance(x, Sequence) and not isinstance(x, str):
        return [_plain(v) for v in x]
    if isinstance(x, Set):
        return sorted((_plain(v) for v in x), key=repr)
    return x


def _send_micro_op(mop: list[Any]) -> list[Any]:
    # Jepsen may leave the offset of an unacknowledged send as nil: keep the plain value.
    if len(mop) == 3 and isinstance(mop[2], list) and len(mop[2]) == 2 and mop[2][0] is None:
        return ["send", mop[1], mop[2][1]]
    return mop


def _micro_ops(value: Any) -> Any:
    if not isinstance(value, list):
        return value
    return [_send_micro_op(m) if isinstance(m, list) and m and m[0] == "send" else m for m in value]


def _error_text(error: Any) -> str | None:
    """Jepsen errors are keywords, strings, vectors or maps: keep a short name."""
    if error is None:
        return None
    if isinstance(error, Keyword):
        return error.name
    if isinstance(error, str):
        return error
    if isinstance(error, Sequence) and error and isinstance(error[0], Keyword):
        return error[0].name
    if isinstance(error, Mapping):
        for field in ("type", "cause", "class"):
            v = error.get(Keyword(field))
            if v is not None:
                return _error_text(v)
    return edn_format.dumps(error)


def _ops(text: str) -> Iterator[Mapping[Any, Any]]:
    top = edn_format.loads_all(text)
    if len(top) == 1 and isinstance(top[0], Sequence) and not isinstance(top[0], str):
        top = list(top[0])
    for i, item in enumerate(top):
        if not isinstance(item, Mapping):
            raise EdnImportError(f"top-level item {i} is a {type(item).__name__}, not an op map")
        yield item


def convert(edn_ops: Iterable[Mapping[Any, Any]]) -> tuple[list[Op], ImportSummary]:
    """EDN op maps to history ops (indices renumbered, every op checked against the format)."""
    ops: list[Op] = []
    nemesis = 0
    unknown: dict[str, int] = {}
    last_time = 0
    for n, m in enumerate(edn_ops):
        get = lambda k: m.get(Keyword(k))  # noqa: E731
        process = get("process")
        if not isinstance(process, int) or isinstance(process, bool):
            nemesis += 1
            continue
        f = _plain(get("f"))
        if f not in FUNCTIONS:
            unknown[str(f)] = unknown.get(str(f), 0) + 1
            continue
        time = get("time")
        time = time if isinstance(time, int) and time >= last_time else last_time
        last_time = time
        d: dict[str, Any] = {
            "index": len(ops),
            "time": time,
            "process": process,
            "type": _plain(get("type")),
            "f": f,
            "value": _micro_ops(_plain(get("value"))),
        }
        error = _error_text(get("error"))
        if error is not None and d["type"] not in ("invoke", "ok"):
            d["error"] = error
        try:
            ops.append(op_from_dict(d))
        except ValueError as exc:
            raise EdnImportError(f"op {n} (index {get('index')}): {exc}") from None
    return ops, ImportSummary(len(ops), nemesis, unknown)


def import_edn(source: str | Path, destination: str | Path) -> ImportSummary:
    """Convert the EDN history at source into a JSON Lines history at destination."""
    source = Path(source)
    try:
        edn_ops = list(_ops(source.read_text()))
    except EdnImportError as exc:
        raise EdnImportError(f"{source}: {exc}") from None
    except Exception as exc:  # edn_format's parser raises assorted exception types
        raise EdnImportError(f"{source}: not readable as EDN: {exc}") from None
    try:
        ops, summary = convert(edn_ops)
    except EdnImportError as exc:
        raise EdnImportError(f"{source}: {exc}") from None
    with HistoryWriter(destination) as writer:
        for op in ops:
            writer.write_op(op)
    return summary
