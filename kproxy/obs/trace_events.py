"""Trace events, built in one place from the schema's one list of fields.

Every event is a row: a list in `trace_schema.EVENT` order (the segment
format packs rows column by column, and a list costs a fraction of a 33-key
dict). The rows' builders are made from `CELLS` below, which names, per
field, what fills it; a field it does not name is null. A new trace field is
one line in trace_schema.EVENT and, if the data path fills it, one line here.

Events for what the fast path forwards untouched are not built on the data
path: it hands the writer a `PendingRow` (the facts, fixed by then), which the
writer builds in its idle time, scanning the frame for its error codes there.
"""

from __future__ import annotations

import time
from typing import Any

from kproxy.obs.trace_frame_pool import FramePool
from kproxy.obs.trace_records import (
    DECODED_REQUEST_APIS,
    DECODED_RESPONSE_APIS,
    DecodedResponseRecords,
    FetchResponseRecords,
    ProduceRequestRecords,
    ProduceResponseRecords,
    RawPartitions,
    RequestRecords,
    RequestViews,
    RESPONSE_VIEWS,
)
from kproxy.obs.trace_schema import FIELD_NAMES
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis, record_views
from kproxy.protocol.error_scan import response_error_codes
from kproxy.protocol.produce_peek import body_start
from kproxy.protocol.request_peek import FACT_APIS, request_facts

# What fills each field of an exchange's event, as an expression over the
# builder's arguments: conn (its conn_id, client_addr, node_id; None for a
# delivery of the proxy's own), ex (the Exchange), direction, size, wall,
# mono, proxy_id, latency, upstream, codes, partitions, upstream_partitions,
# isolation_level, group_id.
CELLS = {
    "wall_time": "wall",
    "mono_ns": "mono",
    "proxy_id": "proxy_id",
    "conn_id": "conn.conn_id if conn is not None else -1",
    "client_addr": "conn.client_addr if conn is not None else None",
    "broker_id": "conn.node_id if conn is not None else -1",
    "direction": "direction",
    "api": "api_name(ex.api_key)",
    "api_key": "ex.api_key",
    "api_version": "ex.api_version",
    "correlation_id": "ex.correlation_id",
    "client_id": "ex.client_id",
    "size": "size",
    "latency_ms": "latency",
    "upstream_latency_ms": "upstream",
    "error_code": "(codes[0] if codes else 0) if codes is not None else None",
    "error_codes": "codes",
    "transactional_id": "txn.transactional_id if txn is not None else None",
    "producer_id": "txn.producer_id if txn is not None else None",
    "producer_epoch": "txn.producer_epoch if txn is not None else None",
    "txn_client": "ex.txn_client",
    "txn_broker": "ex.txn_broker",
    "hazard": "ex.hazard.kind if ex.hazard is not None else None",
    "end_txn_commit": "txn.committed if txn is not None and txn.kind == 'end_txn' else None",
    "rule": "ex.decision.rule_id if ex.decision is not None else None",
    "action": "ex.decision.action if ex.decision is not None else None",
    "outcome": "ex.outcome",
    "copy": "ex.copy",
    "partitions": "partitions",
    "upstream_partitions": "upstream_partitions",
    "isolation_level": "isolation_level",
    "group_id": "group_id",
}
# A close event: why a connection (or a link of the proxy's own) closed, and what it left unanswered.
CLOSE_CELLS = {
    "wall_time": "wall",
    "mono_ns": "mono",
    "proxy_id": "proxy_id",
    "conn_id": "conn_id",
    "client_addr": "client_addr",
    "broker_id": "broker_id",
    "direction": "'close'",
    "rule": "rule",
    "action": "'disconnect' if rule is not None else None",
    "close_reason": "reason",
    "in_flight": "in_flight",
}


def _compile(name: str, params: str, cells: dict[str, str], prelude: str = "") -> Any:
    """A function returning the row `cells` describe, as one list literal (no per-field loop)."""
    unknown = set(cells) - set(FIELD_NAMES)
    if unknown:
        raise RuntimeError(f"trace cells for fields the schema does not have: {sorted(unknown)}")
    cells_in_order = ",\n        ".join(cells.get(field, "None") for field in FIELD_NAMES)
    source = f"def {name}({params}):\n{prelude}    return [\n        {cells_in_order},\n    ]\n"
    namespace: dict[str, Any] = {"api_name": apis.api_name}
    exec(compile(source, f"<trace row {name}>", "exec"), namespace)  # noqa: S102 - our own literal source
    return namespace[name]


exchange_row = _compile(
    "exchange_row",
    "conn, ex, direction, size, wall, mono, proxy_id, latency=None, upstream=None, codes=None, "
    "partitions=None, upstream_partitions=None, isolation_level=None, group_id=None",
    CELLS,
    "    txn = ex.txn[0] if ex.txn else None\n",
)
close_row = _compile("close_row", "conn_id, client_addr, broker_id, reason, rule, in_flight, wall, mono, proxy_id", CLOSE_CELLS)


def in_flight_entry(conn_id: int, ex: Exchange, state: str) -> dict[str, Any]:
    return {
        "conn_id": conn_id,
        "correlation_id": ex.correlation_id,
        "copy": ex.copy,
        "api": apis.api_name(ex.api_key),
        "api_key": ex.api_key,
        "api_version": ex.api_version,
        "state": state,
    }


class PendingRow:
    """A fast-path event the trace writer builds later (`build`), with the frame or records it scans then."""

    __slots__ = ("conn", "ex", "direction", "size", "raw", "codes", "now", "wall", "mono", "proxy_id")

    def __init__(
        self, conn: Any, ex: Exchange, direction: str, size: int, raw: Any, codes: list[int] | None,
        now: float, wall: float, mono: int, proxy_id: str | None,
    ) -> None:
        self.conn = conn
        self.ex = ex
        self.direction = direction
        self.size = size
        # A small response frame, or RawPartitions at level `records`, or a
        # request's (frame, body start, RequestViews at `records` else None), or None.
        self.raw = raw
        self.codes = codes
        self.now = now
        self.wall = wall
        self.mono = mono
        self.proxy_id = proxy_id

    def build(self) -> list[Any]:
        ex = self.ex
        raw = self.raw
        codes = self.codes
        partitions = None
        if isinstance(raw, RawPartitions):
            partitions = raw
            if codes is None:
                # The records' walk reads the error codes too: no second walk of the frame.
                codes = raw.error_codes()
                if codes is None and isinstance(raw, (FetchResponseRecords, ProduceResponseRecords)):
                    frame = raw.frame
                    if isinstance(frame, bytes) and frame:
                        codes = response_error_codes(ex.api_key, ex.api_version, frame)
            raw = None
        if self.direction != "response":
            isolation = group = None
            if type(raw) is tuple:
                # A consumer's request: its facts, read in place, and at `records` its positions.
                frame, body, views = raw
                isolation, group = request_facts(ex.api_key, ex.api_version, frame, body)
                if views is not None and ex.api_key in DECODED_REQUEST_APIS:
                    partitions = RequestRecords(ex.api_key, ex.api_version, frame, body, views)
            return exchange_row(self.conn, ex, "request", self.size, self.wall, self.mono, self.proxy_id,
                                partitions=partitions, isolation_level=isolation, group_id=group)
        if codes is None:
            codes = response_error_codes(ex.api_key, ex.api_version, raw) if raw is not None else []
        return exchange_row(
            self.conn, ex, "response", self.size, self.wall, self.mono, self.proxy_id,
            latency=(self.now - ex.arrived) * 1000.0,
            upstream=(self.now - ex.sent) * 1000.0 if ex.sent else None,
            codes=codes, partitions=partitions,
        )


class TraceEvents:
    """The data path's events, stamped with this proxy's id and clocks; `records` adds the records."""

    # Small frames travel to the writer for their error codes; a Fetch frame
    # is scanned at once, so no large frame waits in the trace queue.
    DEFER_FRAME_BYTES = 4096

    def __init__(self, proxy_id: str | None, records: bool, topic_names: dict[Any, str], ledger: Any) -> None:
        self.proxy_id = proxy_id
        self.records = records
        self.topic_names = topic_names
        self.ledger = ledger
        self.request_views = RequestViews(topic_names)
        self.frame_pool = FramePool()  # buffers of streamed Produce requests kept for the writer
        # Fast-path requests whose frame goes to the writer with their event:
        # a Fetch's isolation level and a group API's group id are read from
        # it at either level, and at `records` the Produce batches, the Fetch
        # positions, the committed offsets and the deleted topics.
        self.framed_requests = FACT_APIS | DECODED_REQUEST_APIS | {apis.PRODUCE} if records else FACT_APIS

    def produce_records(self, ex: Exchange, frame: bytes | memoryview, header: Any) -> None:
        """At level `records`: the Produce request's batches, scanned by the writer later."""
        ex.request_partitions = ProduceRequestRecords(
            ex.api_version, frame, body_start(frame, 4, header), self.topic_names, self.ledger
        )

    def request_records(self, ex: Exchange) -> None:
        """At level `records`, a request off the fast path: what the writer traces of it later."""
        if ex.api_key == apis.PRODUCE:
            self.produce_records(ex, ex.request_frame, ex.header)
        elif ex.api_key in DECODED_REQUEST_APIS and ex.header.body_offset >= 0:
            ex.request_partitions = RequestRecords(
                ex.api_key, ex.api_version, ex.request_frame, 4 + ex.header.body_offset, self.request_views,
                self.ledger, decoded=ex.request_body,
            )

    def request(self, conn: Any, ex: Exchange) -> list[Any]:
        frame = ex.request_frame
        isolation = group = None
        if ex.api_key in FACT_APIS and frame and ex.header is not None and ex.header.body_offset >= 0:
            isolation, group = request_facts(ex.api_key, ex.api_version, frame, 4 + ex.header.body_offset)
        return exchange_row(conn, ex, "request", len(frame) - 4 if frame else 0, time.time(), time.monotonic_ns(),
                            self.proxy_id, partitions=ex.request_partitions, isolation_level=isolation,
                            group_id=group)

    def response(
        self, conn: Any, ex: Exchange, size: int, codes: list[int], decoded: Any, now: float, upstream: Any = None
    ) -> list[Any]:
        """A response the stages looked at; `upstream` is the broker's own when a rule changed it."""
        partitions = upstream_partitions = None
        if self.records and decoded is not None:
            names = self.topic_names
            if ex.api_key == apis.PRODUCE and ex.request_partitions is not None:
                partitions = ProduceResponseRecords(
                    ex.request_partitions, ex.api_version,
                    parts=record_views.produce_response_partitions(decoded, None, names),
                )
            elif ex.api_key == apis.FETCH:
                partitions = record_views.fetch_response_partitions(decoded, names)
                if upstream is not None:
                    upstream_partitions = record_views.fetch_response_partitions(upstream, names)
            elif ex.api_key in DECODED_RESPONSE_APIS:
                partitions = RESPONSE_VIEWS[ex.api_key](decoded, names)
        return exchange_row(
            conn, ex, "response", size, time.time(), time.monotonic_ns(), self.proxy_id,
            latency=(now - ex.arrived) * 1000.0,
            upstream=(now - ex.sent) * 1000.0 if ex.sent else None,
            codes=codes, partitions=partitions, upstream_partitions=upstream_partitions,
        )

    def close(self, conn_id: int, client_addr: str | None, broker_id: int, reason: str, rule: str | None,
              entries: list[dict[str, Any]]) -> list[Any]:
        return close_row(conn_id, client_addr, broker_id, reason, rule, entries, time.time(), time.monotonic_ns(),
                         self.proxy_id)

    def fast_request(self, conn: Any, ex: Exchange, size: int, frame: bytes | None = None, header: Any = None) -> PendingRow:
        """A request the fast path forwards untouched; those of `framed_requests` come with their frame and header."""
        raw = ex.request_partitions
        if frame is not None:
            if ex.api_key == apis.PRODUCE:
                if self.records:
                    self.produce_records(ex, frame, header)
                    raw = ex.request_partitions
            elif header.body_offset >= 0:
                # Read by the writer (PendingRow.build): a tuple is all the data path pays for. These
                # frames are small and carry no records: they do not count towards the queue's bytes.
                raw = (frame, 4 + header.body_offset, self.request_views if self.records else None)
        return PendingRow(conn, ex, "request", size, raw, None, 0.0, time.time(), time.monotonic_ns(), self.proxy_id)

    def fast_response(
        self, conn: Any, ex: Exchange, frame: bytes | None, now: float, *,
        size: int | None = None, codes: list[int] | None = None, chunks: list[bytes] | None = None,
    ) -> PendingRow:
        """A response the fast path forwards untouched, with its error codes.

        A cut-through response comes with the codes its scan found on the
        way, or at level `records` with the chunks it forwarded. At level
        `records` a Fetch or Produce frame travels to the writer, which scans it there.
        """
        if size is None:
            size = len(frame) - 4 if frame is not None else 0
        raw: Any = frame
        if self.records:
            if ex.api_key == apis.FETCH and (chunks is not None or frame is not None):
                raw = FetchResponseRecords(
                    ex.api_version, chunks if chunks is not None else frame, self.topic_names, self.ledger
                )
            elif ex.api_key == apis.PRODUCE and frame is not None:
                raw = ProduceResponseRecords(ex.request_partitions, ex.api_version, frame, ledger=self.ledger)
            elif ex.api_key in DECODED_RESPONSE_APIS and frame is not None:
                raw = DecodedResponseRecords(ex.api_key, ex.api_version, frame, self.topic_names, self.ledger)
        if not isinstance(raw, RawPartitions) and codes is None and frame is not None and (
            ex.api_key == apis.FETCH or len(frame) > self.DEFER_FRAME_BYTES
        ):
            codes = response_error_codes(ex.api_key, ex.api_version, frame)
            raw = None
        return PendingRow(conn, ex, "response", size, raw, codes, now, time.time(), time.monotonic_ns(), self.proxy_id)
