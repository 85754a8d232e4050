"""Every kproxy metric, declared once.

Naming follows Prometheus practice: `kproxy_` prefix, base units (seconds,
bytes), `_total` for counters. Labels come only from bounded sets: api names
(from the protocol's API key table), direction, side, action, rule ids and
phase names (from the loaded rule file), error names (Kafka's error table),
hazard kinds and close reasons (enumerated below). Never a client id, topic or
correlation id.

Metrics live in their own registry so several proxies can run in one process
(tests) without colliding; `/metrics` serves this registry.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable

import trio
from prometheus_client import (
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

REGISTRY = CollectorRegistry(auto_describe=True)

DIRECTIONS = ("request", "response")
# Where a frame came from, per direction (kproxy_frames_total's source label).
FRAME_SOURCES = {"request": ("client", "ghost"), "response": ("broker", "proxy", "ghost")}
SIDES = ("client", "upstream")
PENDING_STATES = ("in_flight", "delayed", "held", "ghost")
HAZARD_KINDS = ("stale_end_txn", "late_produce", "fenced")
CLOSE_REASONS = (
    "client_closed",
    "upstream_closed",
    "upstream_unreachable",
    "tls_handshake",
    "frame_too_large",
    "negative_length",
    "truncated_frame",
    "undecodable",
    "fault_disconnect",
    "read_timeout",
    "idle_timeout",
    "proxy_shutdown",
    "error",
)
# Why a TLS handshake failed (kproxy/io/tls.py classifies).
TLS_HANDSHAKE_REASONS = ("not_tls", "certificate", "hostname", "peer_refused", "timeout", "closed", "protocol")
TRACE_OUTCOMES = ("written", "dropped", "folded")
ACCEPT_ERRORS = ("EMFILE", "ENFILE", "ENOBUFS", "ENOMEM", "other")
# The APIs every producer, consumer and transaction uses: their per-API series
# exist from start-up, so a burst that begins and ends between two scrapes
# still shows as an increase from zero (a series born with its final value
# has no rate). Rarer APIs get their series on first use.
EVERYDAY_APIS = (
    "produce", "fetch", "list_offsets", "metadata", "offset_commit", "offset_fetch",
    "find_coordinator", "join_group", "heartbeat", "leave_group", "sync_group",
    "api_versions", "create_topics", "init_producer_id", "add_partitions_to_txn",
    "add_offsets_to_txn", "end_txn", "txn_offset_commit",
)
# refused: the file is invalid; error: reading it failed in a way the loader did not foresee.
# Either way the running rules stay.
RELOAD_RESULTS = ("accepted", "refused", "error")

# Latency buckets: the proxy adds tens of microseconds, brokers take ms, faults take seconds.
LATENCY_BUCKETS = (
    0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)

frames = Counter(
    "kproxy_frames_total",
    "Kafka frames that crossed the proxy, by API, direction (request or response) and source: client (requests "
    "from clients), broker (the broker's responses to them), proxy (responses the proxy made itself: respond "
    "rules, guard refusals), ghost (copies the proxy delivered on its own connection, and their responses). "
    "Counts what the trace counts (docs/observability.md).",
    ["api", "direction", "source"],
    registry=REGISTRY,
)
bytes_ = Counter(
    "kproxy_bytes_total",
    "Bytes that crossed the proxy, by direction (request: client to broker; response: broker to client).",
    ["direction"],
    registry=REGISTRY,
)
client_latency = Histogram(
    "kproxy_client_request_duration_seconds",
    "Time from a request arriving from the client to its response being sent back, as the client sees it.",
    ["api"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
upstream_latency = Histogram(
    "kproxy_upstream_request_duration_seconds",
    "Time from a request being sent to the broker to its response arriving, for the requests the proxy "
    "inspects (rules, transaction tracking, address rewriting). Pass-through requests are forwarded as "
    "they arrive, so their client-side latency stands for it.",
    ["api"],
    buckets=LATENCY_BUCKETS,
    registry=REGISTRY,
)
connections_open = Gauge(
    "kproxy_connections_open",
    "Open connections, by side (client: clients to the proxy; upstream: proxy to brokers).",
    ["side"],
    registry=REGISTRY,
)
connections_opened = Counter(
    "kproxy_connections_opened_total",
    "Connections opened, by side.",
    ["side"],
    registry=REGISTRY,
)
connections_closed = Counter(
    "kproxy_connections_closed_total",
    "Connections closed, by side and reason.",
    ["side", "reason"],
    registry=REGISTRY,
)
tls_handshake_failures = Counter(
    "kproxy_tls_handshake_failures_total",
    "TLS handshakes that failed, by side (client: with a client; upstream: with a broker) and reason.",
    ["side", "reason"],
    registry=REGISTRY,
)
accept_errors = Counter(
    "kproxy_accept_errors_total",
    "Failed accepts on the Kafka listeners, by errno name (EMFILE: out of file descriptors); "
    "the listener backs off and keeps going.",
    ["reason"],
    registry=REGISTRY,
)
protocol_errors = Counter(
    "kproxy_protocol_errors_total",
    "Malformed input that made the proxy close a connection, by reason.",
    ["reason"],
    registry=REGISTRY,
)
pending_requests = Gauge(
    "kproxy_pending_requests",
    "Requests the proxy holds right now: in flight to the broker, delayed, held until an event, or ghost (delivered after the client left).",
    ["state"],
    registry=REGISTRY,
)
ghost_deliveries = Counter(
    "kproxy_ghost_deliveries_total",
    "Requests delivered over the proxy's own upstream connection (late duplicates, deliveries after the client hung up).",
    registry=REGISTRY,
)
response_errors = Counter(
    "kproxy_response_errors_total",
    "Non-zero error codes seen in responses, by API and Kafka error name.",
    ["api", "error"],
    registry=REGISTRY,
)
faults_applied = Counter(
    "kproxy_faults_applied_total",
    "Fault actions applied, by rule id and action.",
    ["rule", "action"],
    registry=REGISTRY,
)
fault_failures = Counter(
    "kproxy_fault_failures_total",
    "Fault actions that failed on a frame they matched (the frame went on unchanged), by rule id and action.",
    ["rule", "action"],
    registry=REGISTRY,
)
rules_loaded = Gauge(
    "kproxy_rules_loaded",
    "Rules currently loaded, by state (enabled or disabled).",
    ["state"],
    registry=REGISTRY,
)
rule_reloads = Counter(
    "kproxy_rule_reloads_total",
    "Rule file reloads, by result (accepted; refused: an invalid file; error: the reload itself failed).",
    ["result"],
    registry=REGISTRY,
)
schedule_phase = Gauge(
    "kproxy_schedule_phase_active",
    "1 for the schedule phase now active, 0 for the others.",
    ["phase"],
    registry=REGISTRY,
)
txn_producers = Gauge(
    "kproxy_txn_producers",
    "Transactional producers the tracker knows.",
    registry=REGISTRY,
)
txn_open = Gauge(
    "kproxy_txn_open_transactions",
    "Transactions open right now, by side (client: as requests arrive; broker: as they are delivered).",
    ["side"],
    registry=REGISTRY,
)
txn_started = Counter(
    "kproxy_txn_transactions_total",
    "Synthetic transaction numbers opened, by side (client or broker).",
    ["side"],
    registry=REGISTRY,
)
txn_ended = Counter(
    "kproxy_txn_end_txn_total",
    "EndTxn requests delivered to the broker, by outcome asked for (commit or abort).",
    ["result"],
    registry=REGISTRY,
)
txn_hazards = Counter(
    "kproxy_txn_hazards_total",
    "Requests delivered while their client-side transaction number differed from the broker-side one, by kind.",
    ["kind"],
    registry=REGISTRY,
)
guard_refusals = Counter(
    "kproxy_guard_refusals_total",
    "Hazardous requests guard mode refused to deliver, by kind.",
    ["kind"],
    registry=REGISTRY,
)
trace_queue_depth = Gauge(
    "kproxy_trace_queue_depth",
    "Trace events accepted but not yet written.",
    registry=REGISTRY,
)
trace_events = Counter(
    "kproxy_trace_events_total",
    "Trace events, by outcome (written; dropped when the queue was full in drop mode; folded: an idle Fetch "
    "exchange's, written as part of a folded one).",
    ["outcome"],
    registry=REGISTRY,
)
# The data path's stages (docs/observability.md, "Per-stage latency"): opt-in
# (`kproxy run --stage-latency`), as timing every stage costs the data path.
STAGES = ("decode", "numbering", "rules", "rewrite", "trace", "upstream", "held")
STAGE_BUCKETS = (
    0.000005, 0.00001, 0.000025, 0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05,
    0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0,
)
stage_latency = Histogram(
    "kproxy_stage_seconds",
    "Time requests spent in each stage of the data path (off the fast path), by API and stage: decode, "
    "numbering, rules, rewrite (the response's addresses and rule rewrites), trace (building and queueing "
    "the events), upstream (waiting for the broker), held (delayed or parked by a rule). Only with --stage-latency.",
    ["api", "stage"],
    buckets=STAGE_BUCKETS,
    registry=REGISTRY,
)
trace_wait = Counter(
    "kproxy_trace_backpressure_seconds_total",
    "Time the proxy waited for room in the trace queue (backpressure mode).",
    registry=REGISTRY,
)


def initialise_label_sets() -> None:
    """Create every series of the bounded label sets at zero.

    A dashboard query over a series that has never been touched returns no
    data; pre-creating the children makes "zero" visible as zero.
    """
    for direction in DIRECTIONS:
        bytes_.labels(direction)
        for api in EVERYDAY_APIS:
            for source in FRAME_SOURCES[direction]:
                frames.labels(api, direction, source)
    for api in EVERYDAY_APIS:
        client_latency.labels(api)
        upstream_latency.labels(api)
    for side in SIDES:
        connections_open.labels(side)
        connections_opened.labels(side)
        for reason in CLOSE_REASONS:
            connections_closed.labels(side, reason)
    for reason in CLOSE_REASONS:
        protocol_errors.labels(reason)
    for side in SIDES:
        for reason in TLS_HANDSHAKE_REASONS:
            tls_handshake_failures.labels(side, reason)
    for reason in ACCEPT_ERRORS:
        accept_errors.labels(reason)
    for state in PENDING_STATES:
        pending_requests.labels(state)
    for kind in HAZARD_KINDS:
        txn_hazards.labels(kind)
        guard_refusals.labels(kind)
    for side in ("client", "broker"):
        txn_open.labels(side)
        txn_started.labels(side)
    for result in ("commit", "abort"):
        txn_ended.labels(result)
    for outcome in TRACE_OUTCOMES:
        trace_events.labels(outcome)
    for result in RELOAD_RESULTS:
        rule_reloads.labels(result)
    for state in ("enabled", "disabled"):
        rules_loaded.labels(state)


initialise_label_sets()


class SharedRender:
    """`/metrics`' text, rendered off the event loop; scrapes that arrive together share one render.

    prometheus_client renders in pure Python: about 100 KB of series took
    6-8 ms of CPU, 22 ms on a busy machine, and on the loop every connection
    waited that long, for each scrape. Here the render runs on a worker thread
    (the registry and every value are behind prometheus_client's own locks,
    so collecting while the loop counts is safe; a histogram may show an
    observation in its sum a moment before its bucket, as in any threaded
    prometheus_client program).

    A scrape is answered by a render that started after it arrived, so it
    never reads numbers older than itself. Scrapes arriving during a render
    wait for the next one and share it. The next render starts once the time
    since the last one ended is `idle_ratio` times what that one took, so
    however many clients scrape in a loop, a thread rendering holds the
    interpreter a twentieth of the time by default, and the loop gets it
    back within the interpreter's switch interval. That wait is capped at
    `max_wait`: Prometheus times a scrape out after its interval (1 s at the
    shortest), and a large registry (with --stage-latency, 340 KB) renders
    in 25 ms or more. A scraper every few seconds never waits. `prepare`
    runs on the loop before each render (state only the loop may touch is
    copied into the metrics there).
    """

    def __init__(self, registry: CollectorRegistry = REGISTRY, prepare: Callable[[], None] | None = None, *,
                 idle_ratio: float = 19.0, max_wait: float = 0.25,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self._registry = registry
        self._prepare = prepare
        self._idle_ratio = idle_ratio
        self._max_wait = max_wait
        # time.monotonic, not trio's clock: an app may serve more than one trio run (tests), and
        # each run's clock has an offset of its own.
        self._clock = clock
        self._body = b""
        self._started = -math.inf  # when the render that made _body started
        self._earliest = -math.inf  # the next render starts no sooner
        self._rendering: trio.Event | None = None
        self.renders = 0

    async def latest(self) -> bytes:
        arrived = self._clock()
        while self._started < arrived:
            if self._rendering is not None:
                await self._rendering.wait()
                continue
            self._rendering = trio.Event()
            try:
                await self._render()
            finally:
                self._rendering.set()
                self._rendering = None
        return self._body

    async def _render(self) -> None:
        wait = self._earliest - self._clock()
        if wait > 0:
            await trio.sleep(wait)
        if self._prepare is not None:
            self._prepare()
        started = self._clock()
        body = await trio.to_thread.run_sync(generate_latest, self._registry)
        ended = self._clock()
        self.renders += 1
        self._body, self._started = body, started
        self._earliest = ended + min((ended - started) * self._idle_ratio, self._max_wait)
