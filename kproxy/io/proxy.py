"""A proxy instance: listeners, connections, broker discovery, shutdown.

Port scheme (docs/ports.md): the bootstrap listener is `--listen`; broker
node N gets a listener on `broker_port_base + N` (default base: listen port
+ 1), opened as soon as the proxy learns of the broker (at start-up and from
any response that names it).
"""

from __future__ import annotations

import errno
import functools
import itertools
import logging
import socket
import time
from typing import Any

import trio

from kproxy.faults.engine import CompiledRuleFile, FaultEngine
from kproxy.faults.model import RuleFile
from kproxy.io import net, readiness
from kproxy.io.config import ProxyConfig
from kproxy.io.connection import ClientConnection
from kproxy.io.delivery import Delivery
from kproxy.io.ghost import GhostLink
from kproxy.obs import metrics
from kproxy.obs.trace_events import TraceEvents
from kproxy.pipeline.path import Pipeline
from kproxy.pipeline.timing import StageTimer
from kproxy.protocol import apis
from kproxy.protocol.errors import ERROR_NAMES
from kproxy.protocol.codec import decode_response, encode_request
from kproxy.protocol.framing import FrameBuffer
from kproxy.protocol.broker_addresses import STREAMING_VERSION_CAPS, AddressMap, Endpoint
from kproxy.txn.tracker import TxnTracker

log = logging.getLogger("kproxy.proxy")

BOOTSTRAP_NODE = -1
PHASE_TICK_SECONDS = 0.5
# How often client connections are checked against the read and idle timeouts (at most).
SWEEP_SECONDS = 1.0
# A listener that fails to accept waits this long, doubling up to the maximum while failures last.
ACCEPT_BACKOFF_SECONDS = (0.05, 1.0)
# Accept failures are logged at most once per this many seconds (the first at once, then a count).
ACCEPT_LOG_SECONDS = 10.0


# Readiness: how long an answer is reused (the probe itself: kproxy/io/readiness.py).
READY_CACHE_SECONDS = 0.25


class AcceptFailures:
    """Back-off and rate-limited logging for one listener's failed accepts."""

    def __init__(self, where: object) -> None:
        self.where = where
        self.backoff = ACCEPT_BACKOFF_SECONDS[0]
        self.unlogged = 0
        self.logged_at: float | None = None

    def failed(self, exc: OSError, now: float) -> float:
        """Count and maybe log one failure; returns how long to wait before the next accept."""
        name = errno.errorcode.get(exc.errno or 0, "")
        metrics.accept_errors.labels(name if name in metrics.ACCEPT_ERRORS else "other").inc()
        self.unlogged += 1
        if self.logged_at is None or now - self.logged_at >= ACCEPT_LOG_SECONDS:
            more = f" ({self.unlogged - 1} more since the last report)" if self.unlogged > 1 else ""
            log.error("accept failed on %s: %s%s; backing off, next report in %gs at the earliest",
                      self.where, exc, more, ACCEPT_LOG_SECONDS)
            self.logged_at = now
            self.unlogged = 0
        wait = self.backoff
        self.backoff = min(self.backoff * 2, ACCEPT_BACKOFF_SECONDS[1])
        return wait

    def succeeded(self) -> None:
        # The log interval runs on: a listener that flaps at its limit still logs once per interval.
        self.backoff = ACCEPT_BACKOFF_SECONDS[0]


class Proxy:
    def __init__(self, config: ProxyConfig, engine: FaultEngine | None = None, trace: Any = None) -> None:
        self.config = config
        self.engine = engine if engine is not None else FaultEngine(RuleFile(version=1), seed=config.seed)
        self.tracker = TxnTracker()
        self.trace = trace  # a TraceWriter, or None when not tracing
        self.trace_records = trace is not None and config.trace_level == "records"
        self.version_caps = {} if config.fetch_leader_hints else STREAMING_VERSION_CAPS
        self.topic_names: dict[Any, str] = {}
        self.ghost_links: dict[int, GhostLink] = {}
        self._error_counters: dict[tuple[int, int], Any] = {}
        self._published_phases: set[str] = set()
        self.addresses = AddressMap(config.advertise_host, config.broker_port_base)
        self.listeners: dict[int, trio.socket.SocketType] = {}
        self.connections: set[ClientConnection] = set()
        self._conn_ids = itertools.count(1)
        self.nursery: trio.Nursery | None = None
        self.request_frame_counters: dict[int, Any] = {}
        self.response_frame_counters: dict[int, Any] = {}
        self.client_latency_histograms: dict[int, Any] = {}
        self.started = trio.Event()
        self._readiness: tuple[float, bool, dict[str, str | None]] | None = None
        self._readiness_lock = trio.Lock()
        self.pipeline = Pipeline(
            self.engine, self.tracker, self.addresses, self.version_caps, self.topic_names, guard=config.guard,
            timer=StageTimer(time.perf_counter) if config.stage_latency else None,
        )
        self.events = (
            TraceEvents(config.proxy_id, self.trace_records, self.topic_names, trace.raw_ledger)
            if trace is not None else None
        )
        self.delivery = Delivery(
            self.pipeline, self.events, self.emit_trace,
            nursery=lambda: self.nursery,
            ghost_link=self.ghost_link,
            ensure_listener=self.ensure_listener,
            count_error=self.count_error,
            latency_histogram=self.latency_histogram,
            hold_timeout=config.hold_timeout,
        )
        metrics.pending_requests.labels("in_flight").set_function(self.in_flight_count)
        metrics.txn_producers.set_function(lambda: self.tracker.stats().producers)
        metrics.txn_open.labels("client").set_function(lambda: self.tracker.stats().open_client)
        metrics.txn_open.labels("broker").set_function(lambda: self.tracker.stats().open_broker)

    # ------------------------------------------------------------------ helpers used per frame

    @staticmethod
    def clock() -> float:
        return trio.current_time()

    def next_conn_id(self) -> int:
        return next(self._conn_ids)

    def request_counter(self, api_key: int) -> Any:
        counter = metrics.frames.labels(apis.api_name(api_key), "request", "client")
        self.request_frame_counters[api_key] = counter
        return counter

    def response_counter(self, api_key: int) -> Any:
        counter = metrics.frames.labels(apis.api_name(api_key), "response", "broker")
        self.response_frame_counters[api_key] = counter
        return counter

    def latency_histogram(self, api_key: int) -> Any:
        hist = self.client_latency_histograms.get(api_key)
        if hist is None:
            hist = metrics.client_latency.labels(apis.api_name(api_key))
            self.client_latency_histograms[api_key] = hist
        return hist

    def in_flight_count(self) -> int:
        return sum(len(c.in_flight) for c in self.connections)

    def connection_closed(self, conn: ClientConnection) -> None:
        self.connections.discard(conn)
        self.delivery.connection_closed(conn)

    def count_error(self, api_key: int, code: int) -> None:
        counter = self._error_counters.get((api_key, code))
        if counter is None:
            # Label values are bounded by Kafka's error table: a code it does not know is `unknown`.
            name = ERROR_NAMES.get(code, "UNKNOWN").lower()
            counter = metrics.response_errors.labels(apis.api_name(api_key), name)
            self._error_counters[(api_key, code)] = counter
        counter.inc()

    def flush_txn_stats(self) -> None:
        self.pipeline.numbering.flush_stats()

    async def emit_trace(self, event: Any) -> None:
        if not self.trace.offer(event):
            await self.trace.put(event)

    def ghost_link(self, node_id: int) -> GhostLink:
        link = self.ghost_links.get(node_id)
        if link is None:
            link = GhostLink(
                self._upstream_for(node_id),
                self.config.connect_timeout,
                self.delivery.on_ghost_response,
                functools.partial(self.delivery.on_ghost_link_closed, node_id),
                tls=self.config.upstream_tls,
            )
            self.ghost_links[node_id] = link
        return link

    def set_rules(self, rules: RuleFile | CompiledRuleFile) -> None:
        """Install a new rule file (hot reload); counters of unchanged rules carry over."""
        self.engine.replace(rules)
        self.rules_changed()

    async def _publish_phases(self) -> None:
        """Keep kproxy_schedule_phase_active current as the schedule's clock runs."""
        while True:
            self.publish_phase()
            await trio.sleep(PHASE_TICK_SECONDS)

    def publish_phase(self) -> None:
        schedule = self.engine.rule_file.schedule
        names = [p.name for p in schedule.phases] if schedule is not None else []
        active = self.engine.active_phase(self.clock()) if names else None
        for name in set(names) | self._published_phases:
            metrics.schedule_phase.labels(name).set(1 if name == active else 0)
        self._published_phases = set(names)

    def rules_changed(self) -> None:
        self.pipeline.rules_changed()
        rules = self.engine.list_rules()
        enabled = sum(1 for r in rules if r.get("enabled", True))
        metrics.rules_loaded.labels("enabled").set(enabled)
        metrics.rules_loaded.labels("disabled").set(len(rules) - enabled)
        self.publish_phase()

    # ------------------------------------------------------------------ lifecycle

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        async with trio.open_nursery() as nursery:
            self.nursery = nursery
            await self._open_listener(BOOTSTRAP_NODE, self.config.listen.port)
            await self._discover_brokers()
            nursery.start_soon(self._publish_phases)
            if self.config.idle_timeout or self.config.read_timeout:
                nursery.start_soon(self._sweep_connections)
            self.started.set()
            log.info(
                "proxy %s listening on %s (bootstrap%s) for upstream %s%s; brokers: %s",
                self.config.proxy_id,
                self.config.listen,
                ", TLS" if self.config.client_tls is not None else "",
                ", ".join(map(str, self.config.upstreams)),
                " over TLS" if self.config.upstream_tls is not None else "",
                ", ".join(
                    f"node {n} -> {self.config.listen.host}:{self.addresses.port_for(n)}"
                    for n in sorted(self.addresses.upstream)
                )
                or "none yet",
            )
            task_status.started()

    def shutdown(self) -> None:
        for conn in list(self.connections):
            conn.close("proxy_shutdown", "proxy is shutting down")
        if self.nursery is not None:
            self.nursery.cancel_scope.cancel()

    # ------------------------------------------------------------------ listeners

    async def ensure_listener(self, node_id: int) -> None:
        if node_id not in self.listeners:
            await self._open_listener(node_id, self.addresses.port_for(node_id))

    async def _open_listener(self, node_id: int, port: int) -> None:
        host = self.config.listen.host
        sock = trio.socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            await sock.bind((host, port))
        except OSError as exc:
            sock.close()
            what = "bootstrap listener" if node_id == BOOTSTRAP_NODE else f"listener for broker node {node_id}"
            raise OSError(f"cannot open the {what} on {host}:{port}: {exc.strerror or exc}") from exc
        sock.listen(512)
        self.listeners[node_id] = sock
        if node_id != BOOTSTRAP_NODE:
            log.info("broker node %d: listening on %s:%d", node_id, host, port)
        assert self.nursery is not None
        self.nursery.start_soon(self._accept_loop, node_id, sock)

    async def _accept_loop(self, node_id: int, listener: trio.socket.SocketType) -> None:
        assert self.nursery is not None
        failures = AcceptFailures(listener.getsockname())
        with listener:
            while True:
                try:
                    client, addr = await listener.accept()
                except OSError as exc:
                    # Running out of file descriptors must not kill the listener, nor flood the log:
                    # back off (the connections wait in the backlog) and log once per interval.
                    await trio.sleep(failures.failed(exc, trio.current_time()))
                    continue
                failures.succeeded()
                client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
                upstream = self._upstream_for(node_id)
                conn = ClientConnection(self, client, f"{addr[0]}:{addr[1]}", node_id, upstream)
                self.connections.add(conn)
                self.nursery.start_soon(conn.serve)

    async def _sweep_connections(self) -> None:
        """Close client connections that stall inside a frame (read timeout) or say nothing (idle timeout).

        One task for every connection rather than a deadline per read: the data
        path then pays an attribute store per read, nothing more.
        """
        config = self.config
        read_timeout, idle_timeout = config.read_timeout, config.idle_timeout
        interval = min(SWEEP_SECONDS, *(t / 4 for t in (read_timeout, idle_timeout) if t))
        while True:
            await trio.sleep(interval)
            now = trio.current_time()
            for conn in list(self.connections):
                if conn.nursery is None:
                    continue  # still waiting for its first frame, under deadlines of its own
                started = conn.frame_started
                if read_timeout and started is not None and now - started > read_timeout:
                    conn.close("read_timeout", f"client sent part of a frame and not the rest within {read_timeout:g}s")
                elif conn.order or started is not None:
                    conn.busy_at = now
                elif idle_timeout and now - max(conn.last_read, conn.busy_at) > idle_timeout:
                    conn.close("idle_timeout", f"client sent nothing and awaited nothing for {idle_timeout:g}s")

    async def readiness(self) -> tuple[bool, dict[str, str | None]]:
        """Whether any upstream broker can be reached now as the proxy forwards to it (TLS
        included), and each one's answer: None when it can, else why not.

        Probed when asked (by /readyz), at most once per READY_CACHE_SECONDS,
        rather than by a task that would connect to the brokers all the time.
        """
        now = trio.current_time()
        cached = self._readiness
        if cached is not None and now - cached[0] < READY_CACHE_SECONDS:
            return cached[1], cached[2]
        async with self._readiness_lock:  # concurrent /readyz calls share one probe
            cached = self._readiness
            if cached is not None and trio.current_time() - cached[0] < READY_CACHE_SECONDS:
                return cached[1], cached[2]
            endpoints = {str(e): e for e in (*self.config.upstreams, *self.addresses.upstream.values())}
            answers: dict[str, str | None] = {}

            async def probe(name: str, endpoint: Endpoint) -> None:
                answers[name] = await readiness.probe(endpoint, self.config.upstream_tls)

            async with trio.open_nursery() as nursery:
                for name, endpoint in endpoints.items():
                    nursery.start_soon(probe, name, endpoint)
            ready = self.started.is_set() and any(why is None for why in answers.values())
            self._readiness = (trio.current_time(), ready, answers)
        return ready, answers

    def _upstream_for(self, node_id: int) -> Endpoint:
        if node_id == BOOTSTRAP_NODE:
            return self.config.upstreams[0]
        return self.addresses.upstream[node_id]

    # ------------------------------------------------------------------ discovery

    async def _discover_brokers(self) -> None:
        """Ask the cluster for its brokers so their listeners exist before any client needs them."""
        from kio.schema.metadata.v1.request import MetadataRequest

        for upstream in self.config.upstreams:
            try:
                brokers = await self._fetch_brokers(upstream, MetadataRequest(topics=()))
            except (OSError, trio.TooSlowError, ValueError) as exc:
                log.warning("cannot discover brokers through %s: %s", upstream, exc or "timed out")
                continue
            for node_id, host, port in brokers:
                self.addresses.learn(node_id, host, port)
                await self.ensure_listener(node_id)
            return
        log.warning(
            "no upstream answered at start-up; broker listeners open when a client's Metadata request gets through"
        )

    async def _fetch_brokers(self, upstream: Endpoint, request: Any) -> list[tuple[int, str, int]]:
        sock = await net.connect(upstream.host, upstream.port, self.config.connect_timeout, self.config.upstream_tls)
        with sock, trio.fail_after(self.config.connect_timeout):
            await net.send_all(sock, encode_request(request, 1, "kproxy"))
            frames = FrameBuffer()
            while True:
                data = await sock.recv(net.RECV_BYTES)
                if not data:
                    raise OSError("broker closed the connection during discovery")
                block, offsets = frames.feed(data)
                if offsets:
                    payload = block[offsets[0] + 4 :]
                    break
        response = decode_response(apis.METADATA, 1, payload)
        return [(int(b.node_id), b.host, int(b.port)) for b in response.brokers]
