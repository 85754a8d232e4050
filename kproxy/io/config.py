"""Runtime configuration of a proxy instance (filled by `kproxy run`)."""

from __future__ import annotations

import ssl
import uuid
from dataclasses import dataclass, field
from pathlib import Path

from kproxy.io.tls import UpstreamTls
from kproxy.protocol.framing import DEFAULT_MAX_FRAME_BYTES
from kproxy.protocol.broker_addresses import Endpoint

# Requests a client connection may have awaiting their answer before the proxy stops reading it.
# Clients keep far fewer in flight (5 for an idempotent or Java producer, one Fetch per broker for
# a consumer); a connection reaches it only when its answers are stuck behind one the rules dropped
# or held, or its broker falls far behind. 64 held requests cost a connection about 32 KiB.
DEFAULT_MAX_OUTSTANDING_REQUESTS = 64
# Trace events waiting to be written: about half a KB each at level headers (65,536 of them held
# about 35 MB in a soak), so about 8 MB at most, and 2-3 s of a busy proxy's events (6,000 a
# second in the soak against Kafka) when the disk stalls.
DEFAULT_TRACE_QUEUE_EVENTS = 16384


def new_proxy_id() -> str:
    """A proxy's id when the operator names none (`kproxy run --proxy-id`): eight hex digits, new per start."""
    return uuid.uuid4().hex[:8]


@dataclass
class ProxyConfig:
    upstreams: list[Endpoint]
    listen: Endpoint
    advertise_host: str
    broker_port_base: int
    admin: Endpoint | None = None
    # Bearer token of the admin API's control routes (required beyond loopback; see io/admin_guard.py).
    admin_token: str | None = None
    max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES
    connect_timeout: float = 10.0
    # A client connection with nothing to say (no bytes, no request awaiting an answer) this
    # long is closed, as a broker does after connections.max.idle.ms (0: never).
    idle_timeout: float = 600.0
    # A frame must arrive whole within this many seconds of its first byte (0: no limit).
    read_timeout: float = 60.0
    # Longest a held duplicate waits for its event before it is sent anyway.
    hold_timeout: float = 30.0
    # A client connection whose requests awaiting their answer reach this many is read no further
    # until some are answered (backpressure; docs/reliability.md, "Requests held per connection").
    # 0: no limit.
    max_outstanding_requests: int = DEFAULT_MAX_OUTSTANDING_REQUESTS
    rules_path: Path | None = None
    seed: int | None = None
    guard: bool = False
    # Time each request's stages into kproxy_stage_seconds (costs the data path a clock read per stage).
    stage_latency: bool = False
    fetch_leader_hints: bool = False  # offer Fetch v16+ (responses then held whole for the rewrite)
    traces_dir: Path | None = None
    trace_level: str = "headers"
    trace_format: str = "segments"
    trace_on_full: str = "block"
    trace_rotate_bytes: int = 256 * 1024 * 1024
    trace_rotate_seconds: float = 3600.0
    # Events waiting for the trace writer, at most (docs/traces.md, "Backpressure or counted drops").
    trace_queue_events: int = DEFAULT_TRACE_QUEUE_EVENTS
    # Level records: an idle consumer's identical empty Fetch exchanges traced as one with a count (docs/traces.md).
    trace_fold_idle_fetches: bool = True
    # TLS towards clients (every listener) and towards brokers; None: plaintext (docs/security.md).
    client_tls: ssl.SSLContext | None = None
    upstream_tls: UpstreamTls | None = None
    proxy_id: str = field(default_factory=new_proxy_id)
