"""Import Jepsen EDN histories of the Kafka queue workload into kproxy's JSON Lines history.

Accepted input: a vector of op maps, or one op map per line (Jepsen's
history.edn). Keywords become strings (`:ok` -> "ok"), micro-ops keep their
shape (`[:send 1 [2 3]]` -> ["send", 1, [2, 3]], `[:poll {1 [[0 1]]}]` ->
["poll", {"1": [[0, 1]]}]), `:time` is kept. Ops of the nemesis (any
non-integer `:process`) and ops whose `:f` the format does not know (e.g.
`:debug-topic-partitions`) are skipped, so indices are renumbered from 0.
Keys and values that are keywords or strings (`[:send :x [1 :a]]`) become
integers, and the originals go to a sidecar beside the history
(kproxy.workload.names).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence, Set
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import edn_format
from edn_format import Keyword, Symbol

from kproxy.workload.history import FUNCTIONS, HistoryWriter, Op, op_from_dict
from kproxy.workload.names import NameMapper, Token, write_names


class EdnImportError(ValueError):
    """The EDN input is not a queue-workload history."""


@dataclass(frozen=True)
class ImportSummary:
    written: int
    skipped_nemesis: int
    skipped_unknown_f: dict[str, int]
    named_keys: int = 0  # keys that were names (keywords, strings), now integers
    named_values: int = 0
    names_path: Path | None = None  # the sidecar with their originals, when any


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


def _field(op: Mapping[Any, Any], name: str) -> Any:
    return op.get(Keyword(name))


def _token(x: Any) -> Token | None:
    """An integer as itself, a name as its EDN text (`:x`, `"a"`); None for
    anything else (a map, a float, nil), which stays as it is and fails the
    format check with the op named."""
    if isinstance(x, int) and not isinstance(x, bool):
        return x
    if isinstance(x, (Keyword, Symbol, str)):
        return edn_format.dumps(x)
    return None


def _is_seq(x: Any) -> bool:
    return isinstance(x, Sequence) and not isinstance(x, str)


def _kind(mop: Any) -> str | None:
    return mop[0].name if _is_seq(mop) and mop and isinstance(mop[0], Keyword) else None


KeyFn = Callable[[Any], Any]
ValueFn = Callable[[Any, Any], Any]


def _map_keys_values(f: str, value: Any, key_fn: KeyFn, value_fn: ValueFn) -> Any:
    """The op's EDN value with every key replaced by key_fn(key) and every
    value by value_fn(key, value), visited in the order they appear. Keys sit
    in send and poll micro-ops and in assign/subscribe lists; values in sends
    (`[:send k v]`, `[:send k [offset v]]`) and poll records (`[offset v]`)."""
    if f in ("assign", "subscribe") and _is_seq(value):
        return [key_fn(k) for k in value]
    if f not in ("send", "poll", "txn") or not _is_seq(value):
        return value
    mapped = []
    for mop in value:
        kind = _kind(mop)
        if kind == "send" and len(mop) == 3:
            key, sent = mop[1], mop[2]
            if _is_seq(sent) and len(sent) == 2:
                sent = [sent[0], value_fn(key, sent[1])]
            else:
                sent = value_fn(key, sent)
            mapped.append([mop[0], key_fn(key), sent])
        elif kind == "poll" and len(mop) == 2 and isinstance(mop[1], Mapping):
            polled = {}
            for key, records in mop[1].items():
                new_key = key_fn(key)
                if _is_seq(records):
                    records = [[r[0], value_fn(key, r[1])] if _is_seq(r) and len(r) == 2 else r for r in records]
                polled[new_key] = records
            mapped.append([mop[0], polled])
        else:
            mapped.append(mop)
    return mapped


def _number_names(ops: list[tuple[str, Mapping[Any, Any]]]) -> tuple[list[Any], NameMapper]:
    """Each op's value with names replaced by integers (two passes: every
    integer must be seen before the first name is numbered)."""
    mapper = NameMapper()

    def observe_key(key: Any) -> Any:
        token = _token(key)
        if token is not None:
            mapper.observe_key(token)
        return key

    def observe_value(key: Any, value: Any) -> Any:
        key_token, value_token = _token(key), _token(value)
        if key_token is not None and value_token is not None:
            mapper.observe_value(key_token, value_token)
        return value

    def key_id(key: Any) -> Any:
        token = _token(key)
        return key if token is None else mapper.key_id(token)

    def value_id(key: Any, value: Any) -> Any:
        key_token, value_token = _token(key), _token(value)
        return value if key_token is None or value_token is None else mapper.value_id(key_token, value_token)

    for f, m in ops:
        _map_keys_values(f, _field(m, "value"), observe_key, observe_value)
    values = [_map_keys_values(f, _field(m, "value"), key_id, value_id) for f, m in ops]
    return values, mapper


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


def convert(edn_ops: Iterable[Mapping[Any, Any]]) -> tuple[list[Op], ImportSummary, dict | None]:
    """EDN op maps to history ops (indices renumbered, every op checked
    against the format), the summary, and the names sidecar's content (None
    when every key and value was an integer)."""
    kept: list[tuple[int, str, Mapping[Any, Any]]] = []
    nemesis = 0
    unknown: dict[str, int] = {}
    for n, m in enumerate(edn_ops):
        process = _field(m, "process")
        if not isinstance(process, int) or isinstance(process, bool):
            nemesis += 1
            continue
        f = _plain(_field(m, "f"))
        if f not in FUNCTIONS:
            unknown[str(f)] = unknown.get(str(f), 0) + 1
            continue
        kept.append((n, f, m))
    values, mapper = _number_names([(f, m) for _, f, m in kept])
    ops: list[Op] = []
    last_time = 0
    for (n, f, m), value in zip(kept, values):
        time = _field(m, "time")
        time = time if isinstance(time, int) and time >= last_time else last_time
        last_time = time
        d: dict[str, Any] = {
            "index": len(ops),
            "time": time,
            "process": _field(m, "process"),
            "type": _plain(_field(m, "type")),
            "f": f,
            "value": _micro_ops(_plain(value)),
        }
        error = _error_text(_field(m, "error"))
        if error is not None and d["type"] not in ("invoke", "ok"):
            d["error"] = error
        try:
            ops.append(op_from_dict(d))
        except ValueError as exc:
            raise EdnImportError(f"op {n} (index {_field(m, 'index')}): {exc}") from None
    names = mapper.sidecar()
    named_keys = len(names["keys"]) if names else 0
    named_values = sum(len(v) for v in names["values"].values()) if names else 0
    return ops, ImportSummary(len(ops), nemesis, unknown, named_keys, named_values), names


def import_edn(source: str | Path, destination: str | Path) -> ImportSummary:
    """Convert the EDN history at source into a JSON Lines history at
    destination, and the originals of named keys and values into its sidecar."""
    source = Path(source)
    try:
        edn_ops = list(_ops(source.read_text()))
    except EdnImportError as exc:
        raise EdnImportError(f"{source}: {exc}") from None
    except Exception as exc:  # edn_format's parser raises assorted exception types
        raise EdnImportError(f"{source}: not readable as EDN: {exc}") from None
    try:
        ops, summary, names = convert(edn_ops)
    except EdnImportError as exc:
        raise EdnImportError(f"{source}: {exc}") from None
    with HistoryWriter(destination) as writer:
        for op in ops:
            writer.write_op(op)
    return replace(summary, names_path=write_names(destination, names))
