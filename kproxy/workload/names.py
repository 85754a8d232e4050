"""Integer identifiers for the names (keywords, strings) that Jepsen histories
use as keys and values, and the sidecar file that keeps the originals.

A kproxy history holds integer keys and values only: the analysis matches
sends to reads and to the wire by `(key, value)` as numbers. Jepsen's Kafka
workload may use `:x` or `"a"` instead. The importer gives each such name a
number and writes the originals beside the history, in `<history>.names.json`:

    {"format": 1,
     "keys":   {"3": ":x"},                 key id -> original
     "values": {"3": {"0": ":a"}}}          key id -> value id -> original

The numbering is deterministic for a given input: an integer keeps its own
number, and names get the numbers above the largest integer seen (keys:
among all keys; values: among that key's values), in the order they first
appear in the history. Values are numbered per key because they are unique
per key only. Originals are written as EDN text (`:x` keyword, `"a"` string),
so a keyword and a string of the same letters stay apart. The analysis reads
the sidecar with `load_names` and carries it into report.json.
"""

from __future__ import annotations

import json
from pathlib import Path

SIDECAR_SUFFIX = ".names.json"
FORMAT = 1

#: A key or value as the importer sees it: an integer, or the EDN text of a name.
Token = int | str


class NamesFormatError(ValueError):
    """A names sidecar that cannot be read; the message names the file."""


class Identifiers:
    """One numbering: integers are their own identifier; names are numbered
    after the largest integer, in order of first appearance.

    Every token must be observed before the first `id_of`, since a later,
    larger integer would move every name's number."""

    def __init__(self) -> None:
        self._largest: int | None = None
        self._positions: dict[str, int] = {}  # name -> order of first appearance

    def observe(self, token: Token) -> None:
        if isinstance(token, int):
            self._largest = token if self._largest is None else max(self._largest, token)
        else:
            self._positions.setdefault(token, len(self._positions))

    def _first_name_id(self) -> int:
        return 0 if self._largest is None else self._largest + 1

    def id_of(self, token: Token) -> int:
        if isinstance(token, int):
            return token
        return self._first_name_id() + self._positions[token]

    def names(self) -> dict[int, str]:
        first = self._first_name_id()
        return {first + position: name for name, position in self._positions.items()}


class NameMapper:
    """Keys numbered over the whole history, values numbered per key."""

    def __init__(self) -> None:
        self._keys = Identifiers()
        self._values: dict[Token, Identifiers] = {}

    def observe_key(self, key: Token) -> None:
        self._keys.observe(key)

    def observe_value(self, key: Token, value: Token) -> None:
        self._keys.observe(key)
        self._values.setdefault(key, Identifiers()).observe(value)

    def key_id(self, key: Token) -> int:
        return self._keys.id_of(key)

    def value_id(self, key: Token, value: Token) -> int:
        return self._values[key].id_of(value)

    def sidecar(self) -> dict | None:
        """The sidecar's content, or None when every key and value was an integer."""
        keys = {str(i): name for i, name in self._keys.names().items()}
        values = {}
        for key, identifiers in self._values.items():
            named = identifiers.names()
            if named:
                values[str(self.key_id(key))] = {str(i): name for i, name in named.items()}
        if not keys and not values:
            return None
        return {"format": FORMAT, "keys": keys, "values": values}


def sidecar_path(history_path: str | Path) -> Path:
    return Path(f"{history_path}{SIDECAR_SUFFIX}")


def write_names(history_path: str | Path, content: dict | None) -> Path | None:
    """Write the sidecar beside the history; with nothing to write, remove a
    stale one, which would rename the keys of this history wrongly."""
    path = sidecar_path(history_path)
    if content is None:
        path.unlink(missing_ok=True)
        return None
    path.write_text(json.dumps(content, indent=1, sort_keys=False) + "\n")
    return path


def _is_id(text: str) -> bool:
    return text.removeprefix("-").isdigit()


def _check_id_map(path: Path, where: str, mapping: object) -> dict[str, str]:
    if not isinstance(mapping, dict):
        raise NamesFormatError(f"{path}: {where} must be an object, got {type(mapping).__name__}")
    for ident, name in mapping.items():
        if not _is_id(ident) or not isinstance(name, str):
            raise NamesFormatError(f"{path}: {where} maps the decimal text of an integer to a name, "
                                   f"got {ident!r}: {name!r}")
    return mapping


def load_names(history_path: str | Path) -> dict | None:
    """The originals of a history's keys and values, `{"keys": {id: name},
    "values": {key id: {value id: name}}}` (ids as decimal text), or None
    when the history has no sidecar (its keys and values are its own) or is
    not a local path (a URL such as hdfs://, whose neighbours are not read here)."""
    if "://" in str(history_path):
        return None
    path = sidecar_path(history_path)
    if not path.is_file():
        return None
    try:
        content = json.loads(path.read_text())
    except (OSError, ValueError) as exc:
        raise NamesFormatError(f"{path}: not readable as JSON: {exc}") from None
    if not isinstance(content, dict) or content.get("format") != FORMAT:
        raise NamesFormatError(f"{path}: not a names sidecar of format {FORMAT}")
    keys = _check_id_map(path, "keys", content.get("keys", {}))
    values_by_key = content.get("values", {})
    if not isinstance(values_by_key, dict):
        raise NamesFormatError(f"{path}: values must be an object, got {type(values_by_key).__name__}")
    for key in values_by_key:
        if not _is_id(key):
            raise NamesFormatError(f"{path}: values are keyed by the decimal text of a key id, got {key!r}")
    values = {key: _check_id_map(path, f"values of key {key}", mapping) for key, mapping in values_by_key.items()}
    return {"keys": keys, "values": values}
