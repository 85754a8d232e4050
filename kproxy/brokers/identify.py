"""Which broker is this? Asked over the wire, before a run and for its report.

ApiVersions says which APIs and versions a broker serves and, from Apache
Kafka 2.7 on, its finalized features (`metadata.version` on a KRaft
cluster). The Kafka protocol has no field for a broker's software name, so
the software is told by those features where present, else by matching the
API table against the ones recorded for the brokers kproxy ships
(FINGERPRINTS). DescribeCluster (or Metadata, on a broker without it) gives
the cluster id, the controller and the nodes.
"""

from __future__ import annotations

import socket
import struct
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from kproxy.brokers.process import BrokerError, host_port
from kproxy.protocol import apis
from kproxy.protocol.codec import decode_response, encode_request

if TYPE_CHECKING:
    from kproxy.io.tls import UpstreamTls

CLIENT_ID = "kproxy-identify"
UNSUPPORTED_VERSION = 35

# The API tables (api key -> max version) of the brokers kproxy ships, as
# their ApiVersions answered on this machine. A table says which software
# answered, and the version that table was recorded from; another version
# of the same software may answer differently and is then "unknown".
FINGERPRINTS: dict[str, tuple[str, str, dict[int, int]]] = {
    "tansu": ("tansu", "0.6.0", {
        0: 11, 1: 17, 2: 9, 3: 12, 8: 9, 9: 9, 10: 6, 11: 9, 12: 4, 13: 5, 14: 5, 15: 5, 16: 5, 17: 1, 18: 4,
        19: 7, 20: 6, 21: 2, 22: 5, 24: 5, 25: 4, 26: 4, 28: 4, 29: 3, 30: 3, 32: 4, 36: 2, 42: 2, 44: 1, 46: 0,
        50: 0, 51: 0, 60: 1, 69: 0, 71: 0, 75: 0,
    }),
    "noida": ("noida-db", "0.2.2", {
        0: 9, 1: 13, 2: 8, 3: 12, 8: 8, 9: 8, 10: 4, 11: 7, 12: 4, 13: 5, 14: 5, 15: 5, 16: 4, 17: 1, 18: 3,
        19: 7, 20: 6, 21: 2, 22: 4, 23: 4, 24: 3, 25: 3, 26: 3, 28: 3, 32: 4, 33: 2, 35: 2, 36: 2, 37: 3, 42: 2,
        44: 1, 47: 0, 60: 0, 61: 0, 65: 0, 66: 0,
    }),
}


@dataclass(frozen=True)
class BrokerIdentity:
    bootstrap: str
    software: str  # "tansu", "noida-db", "Apache Kafka", or "unknown"
    version: str | None  # as far as the wire tells it
    basis: str  # how the software was told
    nodes: int | None  # None: the broker would not describe the cluster before authentication
    node_addresses: tuple[str, ...]
    cluster_id: str | None
    controller_id: int | None
    api_versions: dict[int, tuple[int, int]] = field(default_factory=dict)
    features: dict[str, int] = field(default_factory=dict)

    def describe(self) -> str:
        soft = self.software + (f" {self.version}" if self.version else "")
        return f"{soft} at {self.bootstrap}: {nodes_text(self.nodes)}, cluster id {self.cluster_id or '?'} ({self.basis})"

    def to_json(self) -> dict[str, Any]:
        return {
            "bootstrap": self.bootstrap,
            "software": self.software,
            "version": self.version,
            "basis": self.basis,
            "nodes": self.nodes,
            "node_addresses": list(self.node_addresses),
            "cluster_id": self.cluster_id,
            "controller_id": self.controller_id,
            "features": dict(self.features),
            "api_versions": {apis.api_name(k): [lo, hi] for k, (lo, hi) in sorted(self.api_versions.items())},
        }


def nodes_text(nodes: int | None) -> str:
    return "nodes unknown" if nodes is None else f"{nodes} node{'s' if nodes != 1 else ''}"


class _Closed(BrokerError):
    """The broker closed the connection instead of answering."""


# What a SASL listener does to any request but ApiVersions and SaslHandshake before authentication.
UNAUTHENTICATED = ("the broker closed the connection when asked to describe the cluster (it requires "
                   "authentication first: a SASL listener?), so nodes and cluster id are unknown")


class _Connection:
    def __init__(self, host: str, port: int, timeout: float, tls: UpstreamTls | None = None) -> None:
        try:
            sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as exc:
            raise BrokerError(f"cannot connect to the broker at {host}:{port}: {exc.strerror or exc}") from None
        sock.settimeout(timeout)
        self.tls = tls
        if tls is not None:
            # As the proxy does: the bootstrap host is the name sent (SNI) and verified.
            from kproxy.io.tls import classify

            try:
                sock = tls.context.wrap_socket(sock, server_hostname=host)
            except (OSError, ValueError) as exc:
                sock.close()
                _, reason = classify(exc)
                raise BrokerError(f"TLS handshake with the broker at {host}:{port} failed: {reason}") from None
        self.sock = sock
        self.correlation = 0

    def close(self) -> None:
        self.sock.close()

    def _read_exactly(self, n: int) -> bytes:
        chunks = []
        while n:
            chunk = self.sock.recv(n)
            if not chunk:
                hint = "" if self.tls is not None else " (does it speak TLS? then add --upstream-tls)"
                raise _Closed(f"the broker closed the connection while answering{hint}")
            chunks.append(chunk)
            n -= len(chunk)
        return b"".join(chunks)

    def call(self, request: Any, version_of_reply: int | None = None) -> Any:
        """Send one request, return its decoded response (decoded at `version_of_reply`, default the request's)."""
        self.correlation += 1
        cls = type(request)
        try:
            self.sock.sendall(encode_request(request, self.correlation, CLIENT_ID))
            (size,) = struct.unpack(">i", self._read_exactly(4))
            payload = self._read_exactly(size)
        except ConnectionError as exc:
            raise _Closed(f"the broker closed the connection instead of answering {cls.__name__}: {exc}") from None
        except (OSError, socket.timeout) as exc:
            raise BrokerError(f"the broker did not answer {cls.__name__}: {exc}") from None
        version = cls.__version__ if version_of_reply is None else version_of_reply
        return decode_response(int(cls.__api_key__), int(version), payload)


def _api_versions(conn: _Connection) -> Any:
    from kio.schema.api_versions.v0.request import ApiVersionsRequest as V0
    from kio.schema.api_versions.v3.request import ApiVersionsRequest as V3

    import kproxy

    reply = conn.call(V3(client_software_name="kproxy", client_software_version=kproxy.__version__))
    if int(reply.error_code) == UNSUPPORTED_VERSION:
        # A broker older than v3 answers in v0's format with its own table.
        reply = conn.call(V0())
    if int(reply.error_code):
        raise BrokerError(f"the broker answered ApiVersions with error {int(reply.error_code)}")
    return reply


def _cluster(conn: _Connection, table: dict[int, tuple[int, int]]) -> tuple[str | None, int | None, list[tuple[int, str]]]:
    """(cluster id, controller id, [(node id, host:port)]) from DescribeCluster, else Metadata."""
    if apis.DESCRIBE_CLUSTER in table and table[apis.DESCRIBE_CLUSTER][0] == 0:
        from kio.schema.describe_cluster.v0.request import DescribeClusterRequest

        reply = conn.call(DescribeClusterRequest(include_cluster_authorized_operations=False))
        if not int(reply.error_code):
            nodes = [(int(b.broker_id), f"{b.host}:{int(b.port)}") for b in reply.brokers]
            return reply.cluster_id, int(reply.controller_id), nodes
    low, high = table.get(apis.METADATA, (0, 0))
    version = min(high, apis.DECODABLE[apis.METADATA][1])
    if version < max(low, 1):
        raise BrokerError(f"the broker serves Metadata v{low}-v{high} only; kproxy reads v1 and later")
    from kio.index import load_request_schema

    request_cls = load_request_schema(apis.METADATA, version)
    fields = request_cls.__dataclass_fields__
    kwargs: dict[str, Any] = {"topics": ()}
    for name, default in (("allow_auto_topic_creation", False),
                          ("include_cluster_authorized_operations", False),
                          ("include_topic_authorized_operations", False)):
        if name in fields:
            kwargs[name] = default
    reply = conn.call(request_cls(**kwargs))
    nodes = [(int(b.node_id), f"{b.host}:{int(b.port)}") for b in reply.brokers]
    return getattr(reply, "cluster_id", None), int(getattr(reply, "controller_id", -1)), nodes


def _software(table: dict[int, tuple[int, int]], features: dict[str, int]) -> tuple[str, str | None, str]:
    if "metadata.version" in features:
        shown = [f"{name}={features[name]}" for name in ("metadata.version", "transaction.version") if name in features]
        return "Apache Kafka", None, "KRaft finalized features " + ", ".join(shown)
    maxima = {key: high for key, (_, high) in table.items()}
    for software, (name, version, recorded) in FINGERPRINTS.items():
        if maxima == recorded:
            return name, version, f"its ApiVersions table is the one recorded from {name} {version}"
    if features:
        return "Apache Kafka", None, "finalized features " + ", ".join(f"{k}={v}" for k, v in sorted(features.items()))
    return "unknown", None, f"ApiVersions table of {len(table)} APIs matches no recorded broker"


def identify(bootstrap: str, timeout: float = 5.0, tls: UpstreamTls | None = None) -> BrokerIdentity:
    """Ask the broker at `bootstrap` what it is (over TLS with `tls`); BrokerError when it cannot be reached or read."""
    host, port = host_port(bootstrap.split(",")[0])
    conn = _Connection(host, port, timeout, tls)
    try:
        versions = _api_versions(conn)
        table = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in versions.api_keys}
        features = {f.name: int(f.max_version_level) for f in getattr(versions, "finalized_features", ())}
        described = True
        try:
            cluster_id, controller_id, nodes = _cluster(conn, table)
        except _Closed:
            # ApiVersions is answered before SASL authentication, nothing else is: the
            # software is still told; the cluster is for the clients, who authenticate.
            described, cluster_id, controller_id, nodes = False, None, None, []
    finally:
        conn.close()
    software, version, basis = _software(table, features)
    if not described:
        basis = f"{basis}; {UNAUTHENTICATED}"
    return BrokerIdentity(
        bootstrap=bootstrap, software=software, version=version, basis=basis,
        nodes=len(nodes) if described else None, node_addresses=tuple(addr for _, addr in sorted(nodes)),
        cluster_id=cluster_id, controller_id=controller_id, api_versions=table, features=features,
    )
