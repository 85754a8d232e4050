"""Kafka API names and keys, as rules may spell them.

Rules name APIs the way people write them: `end_txn`, `EndTxn`, `ENDTXN`, or
by key number. kproxy.protocol.apis (kio's index) is the table of record, so a
rule can name any API the protocol library knows.
"""

from __future__ import annotations

from kproxy.protocol.apis import API_NAMES

# Authentication: a rule meets these only if it names them (docs/security.md).
# A fault here would be an authentication failure, not the Kafka behaviour
# under test; a rule without `api` (every API) must not lock clients out.
SASL_APIS: frozenset[int] = frozenset(key for key, name in API_NAMES.items() if name.startswith("sasl_"))
# What a rule without `api` covers.
UNNAMED_APIS: tuple[int, ...] = tuple(key for key in API_NAMES if key not in SASL_APIS)
# Underscores and case are ignored when matching, so `EndTxn` == `end_txn`.
_BY_FOLDED_NAME: dict[str, int] = {name.replace("_", "").lower(): key for key, name in API_NAMES.items()}


def resolve_api(spec: str | int) -> int:
    """The API key named by `spec`; ValueError if it is not a known API."""
    if isinstance(spec, bool):
        raise ValueError("an API is a name or a key number, not a boolean")
    if isinstance(spec, int):
        if spec not in API_NAMES:
            raise ValueError(f"unknown API key {spec}")
        return spec
    folded = spec.replace("_", "").replace("-", "").lower()
    if folded in _BY_FOLDED_NAME:
        return _BY_FOLDED_NAME[folded]
    raise ValueError(f"unknown API name {spec!r} (for example end_txn, EndTxn, produce or a key number)")
