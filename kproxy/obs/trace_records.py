"""Level `records` without decoding records: partitions resolved later, by the trace writer.

The data path hands the trace writer the frame (or, for a Fetch response
forwarded cut-through, the chunks it forwarded) wrapped in one of the classes
below, and goes on. The writer's `resolve(store)` walks the frame
in place (kproxy.protocol.batch_scan): per partition the offsets, error codes
and aborted-transactions list, the header of every record batch, and the raw
batches, which `store.store_raw(bytes) -> (file name, offset)` appends to the trace's
side file. The event's `records` stay null; readers decode them from the side
file (kproxy.obs.trace_files, spark/kproxy_spark/traces.py). Nothing here decompresses.

A consumer's requests (Fetch positions, OffsetCommit and TxnOffsetCommit
offsets) and the commits' answers are small and carry no records: those
frames are decoded with kio, by the writer, not on the data path.
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Mapping
from typing import Any, Protocol

from kproxy.obs.trace_frame_pool import PooledBuffer
from kproxy.obs.trace_schema import PARTITION
from kproxy.protocol import apis, batch_scan, codec, record_views, request_peek

log = logging.getLogger(__name__)

PARTITION_KEYS = tuple(f.name for f in PARTITION)


class Store(Protocol):
    """Where a frame's raw batches go: the trace's side file (kproxy.obs.trace_sinks.Sink)."""

    def store_raw(self, data: memoryview, key: tuple | None = None) -> tuple[str, int]:
        """Queue `data`; (side file name, offset) it will have. With a key, bytes already stored under
        it in the open side file are not stored again."""

    def side_file_now(self) -> str:
        """The name of the side file bytes stored now go to."""


# Fetch regions at least this large are stored once per side file: a consumer
# that reads a partition again (another group, a rewind, a retried fetch) is
# served the same batches at the same offsets. Smaller ones are not worth the hash.
DEDUPE_MIN_BYTES = 64 * 1024
SIDE_FIELDS = ("compression", "batches", "records", "records_file", "records_offset", "records_length")
DELETE_TOPICS = apis.API_KEYS["delete_topics"]
# Requests whose partitions level `records` traces without records, decoded by
# the writer: where a Fetch asked to read from, the offsets a commit commits,
# the topics a DeleteTopics deletes (whose records no later read can find).
REQUEST_VIEWS = {
    apis.FETCH: record_views.fetch_request_partitions,
    request_peek.OFFSET_COMMIT: record_views.offset_commit_partitions,
    apis.TXN_OFFSET_COMMIT: record_views.offset_commit_partitions,
    DELETE_TOPICS: record_views.delete_topics_partitions,
}
DECODED_REQUEST_APIS = frozenset(REQUEST_VIEWS)
# Small responses without records whose entries the writer decodes with kio: a commit's error per
# partition, a DeleteTopics' error per topic.
RESPONSE_VIEWS = {
    request_peek.OFFSET_COMMIT: record_views.offset_commit_response_partitions,
    apis.TXN_OFFSET_COMMIT: record_views.offset_commit_response_partitions,
    DELETE_TOPICS: record_views.delete_topics_response_partitions,
}
DECODED_RESPONSE_APIS = frozenset(RESPONSE_VIEWS)


def _partition(**values: Any) -> dict[str, Any]:
    view = dict.fromkeys(PARTITION_KEYS)
    view.update(values)
    return view


def _with_batches(
    view: dict[str, Any], frame: bytes | memoryview, span: tuple[int, int] | None, store: Store, dedupe: bool = False
) -> None:
    if span is None or span[0] == span[1]:
        view["batches"] = []
        view["records"] = []
        return
    start, end = span
    crcs: list[int | None] | None = [] if dedupe and end - start >= DEDUPE_MIN_BYTES else None
    try:
        batches = batch_scan.scan_batches(frame, start, end, crcs)
    except batch_scan.ScanError as exc:
        log.debug("records of %s-%s not traced: %s", view["topic"], view["partition"], exc)
        return  # records stay null: not readable, as a v2 trace said
    view["batches"] = batches
    view["compression"] = batches[0]["compression"] if batches else None
    if not batches:
        view["records"] = []  # only a truncated tail: nothing a client reads
        return
    raw = memoryview(frame)[start:end]
    key = None
    if crcs is not None:
        # The same bytes, not merely the same offsets: a log truncated and rewritten
        # (unclean leader election) serves other batches at the same offsets.
        # Each batch header carries the CRC-32C of the rest of its batch: the
        # scan reads it anyway, so only what no header covers is hashed (a
        # batch cut at the fetch size, an old message set). Hashing every
        # fetched byte took 40 % of a consuming proxy's CPU.
        complete = crcs.pop()
        if None in crcs:
            fingerprint = hashlib.blake2b(raw, digest_size=16).digest()
        else:
            tail = raw[complete:]
            fingerprint = (tuple(crcs), hashlib.blake2b(tail, digest_size=16).digest() if len(tail) else b"")
        key = (view["topic"], view["partition"], batches[0]["base_offset"], end - start, fingerprint)
    name, offset = store.store_raw(raw, key)
    view.update(records_file=name, records_offset=offset, records_length=end - start)


class RawLedger:
    """Bytes of frames handed to the trace writer and not yet scanned: the writer's queue bound in bytes.

    Each counter has one place that moves it: `taken` and `dropped` the data
    path (events it dropped never reach the writer), `scanned` the writer.
    """

    __slots__ = ("taken", "scanned", "dropped")

    def __init__(self) -> None:
        self.taken = 0
        self.scanned = 0
        self.dropped = 0

    @property
    def held(self) -> int:
        return self.taken - self.scanned - self.dropped


class RawPartitions:
    """Partitions of one event, resolved by the writer; holds its frame's bytes until then."""

    __slots__ = ("ledger", "nbytes", "_released")

    def __init__(self, ledger: RawLedger | None, nbytes: int) -> None:
        self.ledger = ledger
        self.nbytes = nbytes
        self._released = False
        if ledger is not None:
            ledger.taken += nbytes

    def resolve(self, store: Store) -> list[dict[str, Any]] | None:
        raise NotImplementedError

    def error_codes(self) -> list[int] | None:
        """The frame's error codes when its walk finds them; None: the caller finds them another way."""
        return None

    def _scanned(self) -> None:
        """The writer: the frame is in the side file (or not traceable); its bytes no longer count."""
        if not self._released:
            self._released = True
            if self.ledger is not None:
                self.ledger.scanned += self.nbytes

    def drop(self) -> None:
        """Proxy thread: the event was dropped before the writer saw it."""
        if not self._released:
            self._released = True
            if self.ledger is not None:
                self.ledger.dropped += self.nbytes
            self._forget()

    def _forget(self) -> None:
        raise NotImplementedError


class ProduceRequestRecords(RawPartitions):
    """A Produce request's partitions. Resolved once: a duplicate copy points at the same side bytes."""

    __slots__ = ("version", "frame", "body", "topic_names", "partitions", "_done", "pooled")

    def __init__(
        self, version: int, frame: bytes | memoryview, body: int, topic_names: Mapping[Any, str] | None = None,
        ledger: RawLedger | None = None,
    ) -> None:
        super().__init__(ledger, len(frame))
        self.version = version
        self.topic_names = topic_names
        self.frame = frame
        # A streamed frame's buffer, which the writer gives back once the side file holds its batches.
        self.pooled = frame.obj if type(frame) is memoryview and type(frame.obj) is PooledBuffer else None
        self.body = body  # where the request body starts in frame
        self.partitions: list[dict[str, Any]] | None = None
        self._done = False

    def resolve(self, store: Store) -> list[dict[str, Any]] | None:
        parts = self.resolved(store)
        return None if parts is None else [dict(p) for p in parts]

    def resolved(self, store: Store) -> list[dict[str, Any]] | None:
        """The partitions, walked and stored on the first call; the writer's own, not to be changed."""
        if not self._done:
            self._done = True
            try:
                spans = batch_scan.produce_request_partitions(self.version, self.frame, self.body, self.topic_names)
            except batch_scan.ScanError as exc:
                log.debug("Produce request v%d not traced: %s", self.version, exc)
            else:
                parts = []
                for topic, index, span in spans:
                    view = _partition(topic=topic, partition=index)
                    _with_batches(view, self.frame, span, store)
                    parts.append(view)
                self.partitions = parts
            self.frame = b""  # the bytes are in the side file now
            self._scanned()
        return self.partitions

    def _forget(self) -> None:
        self._done = True
        self.frame = b""


class ProduceResponseRecords(RawPartitions):
    """A Produce response's partitions, pointing at its request's batches (the records the offsets were assigned to)."""

    __slots__ = ("request", "version", "frame", "parts", "_tried")

    def __init__(
        self, request: ProduceRequestRecords | None, version: int, frame: bytes | None = None,
        parts: list[dict[str, Any]] | None = None, ledger: RawLedger | None = None,
    ) -> None:
        super().__init__(ledger, len(frame) if frame is not None else 0)
        self.request = request
        self.version = version
        self.frame = frame
        self.parts = parts  # from a decoded response (slow path), records null; else from the walk
        self._tried = False

    def _forget(self) -> None:
        self.frame = None
        self.request = None

    def _walked(self) -> list[dict[str, Any]] | None:
        # One walk serves both the event's error codes and its partitions.
        if self.parts is None and self.frame is not None and not self._tried:
            self._tried = True
            try:
                names = self.request.topic_names if self.request is not None else None
                self.parts = [_partition(**p) for p in batch_scan.produce_response_partitions(self.version, self.frame, names)]
            except batch_scan.ScanError as exc:
                log.debug("Produce response v%d not traced: %s", self.version, exc)
            else:
                self.frame = None  # kept only for a decode of a frame the walk could not follow
        return self.parts

    def error_codes(self) -> list[int] | None:
        """Distinct non-zero partition error codes, in order; None if the frame could not be walked."""
        parts = self._walked()
        if parts is None:
            return None
        codes: list[int] = []
        for view in parts:
            code = view["error_code"]
            if code and code not in codes:
                codes.append(code)
        return codes

    def resolve(self, store: Store) -> list[dict[str, Any]] | None:
        self._scanned()
        parts = self._walked()
        self.frame = None
        if parts is None:
            return None
        sent = {}
        if self.request is not None:
            sent = {(p["topic"], p["partition"]): p for p in self.request.resolved(store) or ()}
        side_now = store.side_file_now()
        for view in parts:
            request = sent.get((view["topic"], view["partition"]))
            # A request whose file rotated before its answer came keeps its records; the answer
            # does not point into another file's side file (docs/traces.md), so its records stay null.
            if request is not None and request["records_file"] in (None, side_now):
                for key in SIDE_FIELDS:
                    view[key] = request[key]
        return parts


class FetchResponseRecords(RawPartitions):
    """A Fetch response's partitions from the whole frame, or from the chunks a cut-through forwarded."""

    __slots__ = ("version", "frame", "topic_names", "_walk")

    def __init__(
        self, version: int, frame: bytes | list[bytes], topic_names: Mapping[Any, str] | None,
        ledger: RawLedger | None = None,
    ) -> None:
        super().__init__(ledger, len(frame) if isinstance(frame, bytes) else sum(map(len, frame)))
        self.version = version
        self.frame = frame
        self.topic_names = topic_names
        self._walk: tuple[list[int], list[tuple[dict[str, Any], tuple[int, int] | None]]] | None = None

    def _walked(self) -> tuple[list[int], list[tuple[dict[str, Any], tuple[int, int] | None]]] | None:
        if self._walk is None:
            if isinstance(self.frame, list):
                self.frame = b"".join(self.frame)
            try:
                self._walk = batch_scan.fetch_response_partitions(self.version, self.frame, self.topic_names)
            except batch_scan.ScanError as exc:
                log.debug("Fetch response v%d not traced: %s", self.version, exc)
                self._walk = None
                return None
        return self._walk

    def error_codes(self) -> list[int] | None:
        walk = self._walked()
        return None if walk is None else walk[0]

    def resolve(self, store: Store) -> list[dict[str, Any]] | None:
        walk = self._walked()
        if walk is None:
            self.frame = b""
            self._scanned()
            return None
        parts = []
        for fields, span in walk[1]:
            view = _partition(**fields)
            _with_batches(view, self.frame, span, store, dedupe=True)
            parts.append(view)
        self.frame = b""
        self._scanned()
        return parts

    def _forget(self) -> None:
        self.frame = b""
        self._walk = None


class RequestViews:
    """The entries of a proxy's DECODED_REQUEST_APIS requests (Fetch positions, committed offsets, deleted
    topics), decoded with kio by the writer.

    A consumer with nothing to read sends the same Fetch request again and
    again (thousands a second to a broker that answers an empty Fetch at
    once, docs/brokers.md): a body decoded lately is looked up instead of
    decoded again. Used by the trace writer alone.
    """

    __slots__ = ("topic_names", "_recent")
    RECENT_BODIES = 1024

    def __init__(self, topic_names: Mapping[Any, str] | None = None) -> None:
        self.topic_names = topic_names  # topic id -> name, learnt from Metadata (it only grows)
        self._recent: dict[tuple, list[dict[str, Any]] | None] = {}

    def of_frame(self, api_key: int, version: int, frame: bytes, body: int) -> list[dict[str, Any]] | None:
        """The partitions of a request whose body starts at `body` in `frame`; None if it cannot be decoded."""
        # A topic id the map names since it was last seen makes another key.
        key = (api_key, version, frame[body:], len(self.topic_names or ()))
        recent = self._recent
        if key in recent:
            return recent[key]
        try:
            parts = self.of_body(api_key, version, codec.decode_request_body(api_key, version, frame, body))
        except codec.DecodeError as exc:
            log.debug("%s request v%d not traced: %s", apis.api_name(api_key), version, exc)
            parts = None
        if len(recent) >= self.RECENT_BODIES:
            recent.clear()
        recent[key] = parts
        return parts

    def of_body(self, api_key: int, version: int, body: Any) -> list[dict[str, Any]] | None:
        """The partitions of a decoded request."""
        try:
            return REQUEST_VIEWS[api_key](body, self.topic_names)
        except AttributeError as exc:
            log.debug("%s request v%d not traced: %s", apis.api_name(api_key), version, exc)
            return None


class RequestRecords(RawPartitions):
    """A consumer's request: a Fetch's positions, an OffsetCommit's or TxnOffsetCommit's offsets, read by the writer.

    Fetch requests and OffsetCommit ride the fast path and are never decoded
    there: the data path hands over the frame (PendingRow), and the writer
    decodes it (RequestViews) when it composes the event. A request the
    stages decoded anyway (TxnOffsetCommit, for the tracker) comes with its
    body. Resolved once: a duplicate copy gets the same partitions.
    """

    __slots__ = ("api_key", "version", "frame", "body", "views", "decoded", "partitions", "_done")

    def __init__(
        self, api_key: int, version: int, frame: bytes, body: int, views: RequestViews,
        ledger: RawLedger | None = None, decoded: Any = None,
    ) -> None:
        super().__init__(ledger, len(frame))
        self.api_key = api_key
        self.version = version
        self.frame = frame
        self.body = body  # where the request body starts in frame
        self.views = views
        self.decoded = decoded
        self.partitions: list[dict[str, Any]] | None = None
        self._done = False

    def resolve(self, store: Store) -> list[dict[str, Any]] | None:
        if not self._done:
            self._done = True
            if self.decoded is not None:
                self.partitions = self.views.of_body(self.api_key, self.version, self.decoded)
            else:
                self.partitions = self.views.of_frame(self.api_key, self.version, self.frame, self.body)
            self.frame = b""
            self.decoded = None
            self._scanned()
        return self.partitions  # shared with a duplicate copy's event, and with repeats: nothing writes to it

    def _forget(self) -> None:
        self._done = True
        self.frame = b""
        self.decoded = None


class DecodedResponseRecords(RawPartitions):
    """A response of DECODED_RESPONSE_APIS forwarded untouched: one kio decode gives the event's
    error codes and each entry's (RESPONSE_VIEWS)."""

    __slots__ = ("api_key", "version", "frame", "topic_names", "_decoded")

    def __init__(
        self, api_key: int, version: int, frame: bytes, topic_names: Mapping[Any, str] | None = None,
        ledger: RawLedger | None = None,
    ) -> None:
        super().__init__(ledger, len(frame))
        self.api_key = api_key
        self.version = version
        self.frame = frame
        self.topic_names = topic_names
        self._decoded: Any = None

    def _body(self) -> Any:
        if self._decoded is None and self.frame:
            try:
                self._decoded = codec.decode_response(self.api_key, self.version, self.frame[4:])
            except codec.DecodeError as exc:
                log.debug("%s response v%d not traced: %s", apis.api_name(self.api_key), self.version, exc)
            self.frame = b""
        return self._decoded

    def error_codes(self) -> list[int] | None:
        body = self._body()
        return None if body is None else codec.error_codes(body)

    def resolve(self, store: Store) -> list[dict[str, Any]] | None:
        body = self._body()
        self._scanned()
        self._decoded = None
        if body is None:
            return None
        return RESPONSE_VIEWS[self.api_key](body, self.topic_names)

    def _forget(self) -> None:
        self.frame = b""
        self._decoded = None
