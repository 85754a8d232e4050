"""Kafka API keys, names and the versions kio can decode: the one API table.

Built once at import from kio's generated index, so the proxy's idea of
"what can be decoded" is exactly what the installed kio ships. The ways
rules spell an API (EndTxn, end_txn, a key number) are read by
kproxy.faults.apis, against this table.
"""

from __future__ import annotations

from kio.schema.index import api_key_map, schema_name_map
from kio.static.constants import EntityType

API_NAMES: dict[int, str] = dict(api_key_map)
API_KEYS: dict[str, int] = {name: key for key, name in API_NAMES.items()}

# api key -> (min, max) version kio has request *and* response schemas for.
DECODABLE: dict[int, tuple[int, int]] = {}
for _key, _name in API_NAMES.items():
    _versions = [
        v
        for v, types in schema_name_map[_name].items()
        if EntityType.request in types and EntityType.response in types
    ]
    if _versions:
        DECODABLE[_key] = (min(_versions), max(_versions))

PRODUCE = API_KEYS["produce"]
FETCH = API_KEYS["fetch"]
METADATA = API_KEYS["metadata"]
FIND_COORDINATOR = API_KEYS["find_coordinator"]
API_VERSIONS = API_KEYS["api_versions"]
DESCRIBE_CLUSTER = API_KEYS["describe_cluster"]
INIT_PRODUCER_ID = API_KEYS["init_producer_id"]
ADD_PARTITIONS_TO_TXN = API_KEYS["add_partitions_to_txn"]
ADD_OFFSETS_TO_TXN = API_KEYS["add_offsets_to_txn"]
END_TXN = API_KEYS["end_txn"]
TXN_OFFSET_COMMIT = API_KEYS["txn_offset_commit"]

TRANSACTIONAL_APIS = frozenset(
    {INIT_PRODUCER_ID, ADD_PARTITIONS_TO_TXN, ADD_OFFSETS_TO_TXN, END_TXN, TXN_OFFSET_COMMIT}
)


def api_name(api_key: int) -> str:
    """Name for metrics and traces; unknown keys get a bounded fallback."""
    return API_NAMES.get(api_key, "unknown")


def can_decode(api_key: int, api_version: int) -> bool:
    bounds = DECODABLE.get(api_key)
    return bounds is not None and bounds[0] <= api_version <= bounds[1]
