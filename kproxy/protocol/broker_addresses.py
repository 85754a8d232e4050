"""Broker addresses: rewriting every response that names a broker, and capping ApiVersions, sans-IO.

Every response that names a broker is rewritten so clients only ever learn
proxy listeners. The port scheme is deterministic: the listener for broker
node N is `broker_port_base + N` on the advertised host (docs/ports.md).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from kio.static.primitive import i16, i32

from kproxy.protocol import apis
from kproxy.protocol.endpoints import Endpoint

# Responses whose body always names brokers.
ADDRESS_APIS = frozenset({apis.METADATA, apis.FIND_COORDINATOR, apis.DESCRIBE_CLUSTER})
# Responses that carry leader endpoints (a tagged field) from these versions on.
LEADER_HINT_MIN_VERSION = {apis.PRODUCE: 10, apis.FETCH: 16}


@dataclass
class AddressMap:
    """What the proxy learnt about upstream brokers and how it advertises them."""

    advertise_host: str
    broker_port_base: int
    upstream: dict[int, Endpoint] = field(default_factory=dict)
    # Upstream host names as bytes: if none occurs in a Produce/Fetch response,
    # it cannot carry a broker endpoint and is passed through undecoded.
    needles: set[bytes] = field(default_factory=set)

    def port_for(self, node_id: int) -> int:
        port = self.broker_port_base + node_id
        if node_id < 0 or port > 65535:
            raise ValueError(
                f"broker node id {node_id} does not fit the port scheme (base {self.broker_port_base}); "
                "lower --broker-port-base"
            )
        return port

    def learn(self, node_id: int, host: str, port: int) -> bool:
        """Record a broker's upstream address; True if it is new or moved."""
        endpoint = Endpoint(host, port)
        if self.upstream.get(node_id) == endpoint:
            return False
        self.upstream[node_id] = endpoint
        self.needles.add(host.encode())
        return True

    def may_name_brokers(self, payload: bytes) -> bool:
        return self.may_name_brokers_in(payload, 0, len(payload))

    def may_name_brokers_in(self, block: bytes, start: int, end: int) -> bool:
        """may_name_brokers for block[start:end], without copying it out."""
        return any(block.find(needle, start, end) != -1 for needle in self.needles)


def _rewrite_endpoints(value: Any, amap: AddressMap, learnt: list[int]) -> Any:
    """Return `value` with every (node_id, host, port) triple pointed at the proxy."""
    if isinstance(value, tuple):
        new = tuple(_rewrite_endpoints(v, amap, learnt) for v in value)
        return new if any(a is not b for a, b in zip(new, value)) else value

    fields = getattr(value, "__dataclass_fields__", None)
    if not fields:
        return value
    changes: dict[str, Any] = {}
    id_field = "node_id" if "node_id" in fields else "broker_id"  # DescribeCluster says broker_id
    if "host" in fields and "port" in fields and id_field in fields:
        node_id = int(getattr(value, id_field))
        if node_id >= 0 and value.host:
            if amap.learn(node_id, value.host, int(value.port)):
                learnt.append(node_id)
            changes["host"] = amap.advertise_host
            changes["port"] = i32(amap.port_for(node_id))
    for name in fields:
        if name in changes:
            continue
        v = getattr(value, name)
        nested = (isinstance(v, tuple) and v and hasattr(v[0], "__dataclass_fields__")) or hasattr(
            v, "__dataclass_fields__"
        )
        if nested:
            nv = _rewrite_endpoints(v, amap, learnt)
            if nv is not v:
                changes[name] = nv
    return dataclasses.replace(value, **changes) if changes else value


def rewrite_addresses(payload: Any, amap: AddressMap) -> tuple[Any, list[int]]:
    """Rewrite broker endpoints in a decoded response.

    Returns the new payload (the same object when nothing named a broker) and
    the node ids whose upstream address was new, so the shell can open
    listeners for them.
    """
    learnt: list[int] = []
    return _rewrite_endpoints(payload, amap, learnt), learnt


# Fetch v16 added leader hints (KIP-951: node endpoints in the response's
# last bytes). The proxy must rewrite them, so it would have to hold every
# Fetch response whole instead of streaming it (kproxy.io.connection); by
# default clients are offered Fetch up to v15, which differs from v16 only by
# those hints (after a leader change a v15 client refreshes its metadata
# instead). `kproxy run --fetch-leader-hints` lifts the cap.
STREAMING_VERSION_CAPS = {apis.FETCH: LEADER_HINT_MIN_VERSION[apis.FETCH] - 1}


def cap_api_versions(payload: Any, caps: dict[int, int] | None = None) -> Any:
    """Cap each advertised max version to what kio can decode, and to `caps` (api key -> max).

    APIs kio does not know are left as the broker advertised them: the proxy
    passes those through untouched and never needs to decode them.
    """
    keys = getattr(payload, "api_keys", None)
    if not keys:
        return payload
    caps = caps or {}
    capped = []
    for entry in keys:
        key = int(entry.api_key)
        bounds = apis.DECODABLE.get(key)
        top = bounds[1] if bounds is not None else None
        if key in caps:
            top = caps[key] if top is None else min(top, caps[key])
        if top is not None and entry.max_version > top:
            if entry.min_version > top:
                continue  # nothing both sides understand: do not advertise it
            entry = dataclasses.replace(entry, max_version=i16(top))
        capped.append(entry)
    return dataclasses.replace(payload, api_keys=tuple(capped))
