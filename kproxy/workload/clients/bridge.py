"""Clients in another process: the JSON-lines bridge protocol, and the adapters that speak it.

A bridge is a small program around one client library (java_bridge/ for
Apache Kafka's Java client, go_bridge/ for franz-go and Sarama). One bridge
process serves every producer, consumer and admin client of a run, answering
requests on its stdin/stdout, one JSON object a line (docs/workload.md,
"Client bridges"):

    request:  {"id": N, "op": OP, "h": HANDLE, ...}
    reply:    {"id": N, "ok": RESULT} | {"id": N, "error": FAILURE} | {"id": N, "bad": TEXT}
    event:    {"event": "delivery", "d": D, "offset": O} | {..., "error": FAILURE}

Each client (handle) has a thread or goroutine of its own in the bridge, so a
blocking call of one worker never holds up another. The adapters here
implement the workload's ProducerClient, ConsumerClient and ClientFactory on
top of it; a bridge only differs in how it is started and what its settings
are called.
"""

from __future__ import annotations

import base64
import collections
import itertools
import logging
import subprocess
import threading
from collections.abc import Mapping, Sequence
from typing import Any

import orjson

from kproxy.workload.clients.base import Delivery, Record, TopicPartition
from kproxy.workload.errors import ClientFailure

log = logging.getLogger(__name__)

# Extra seconds a reply may take beyond the call's own bound before the bridge counts as stuck.
REPLY_GRACE = 60.0


class BridgeError(RuntimeError):
    """The bridge process died or answered nonsense: a bug or a broken setup, not a Kafka error."""


def _b64(data: bytes | None) -> str | None:
    return None if data is None else base64.b64encode(data).decode()


def _unb64(text: str | None) -> bytes | None:
    return None if text is None else base64.b64decode(text)


def _failure(error: Mapping[str, Any]) -> ClientFailure:
    # The library's own words, for whoever reads the log: the history keeps the name only.
    log.info("%s: %s", error["name"], error.get("message", ""))
    return ClientFailure(str(error["name"]), retriable=bool(error["retriable"]), fatal=bool(error["fatal"]),
                         txn_requires_abort=bool(error["abort"]), enqueued=bool(error["enqueued"]))


class _Waiter:
    __slots__ = ("event", "message")

    def __init__(self) -> None:
        self.event = threading.Event()
        self.message: dict[str, Any] | None = None


class Bridge:
    """One bridge process; thread-safe calls with replies matched by id.

    `what` names the bridge in errors and logs ("the java client bridge").
    """

    def __init__(self, cmd: Sequence[str], what: str) -> None:
        self.what = what
        self._proc = subprocess.Popen(list(cmd), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE)
        self._ids = itertools.count(1)
        self._deliveries_ids = itertools.count(1)
        self._write_lock = threading.Lock()
        self._lock = threading.Lock()
        self._waiting: dict[int, _Waiter] = {}
        self._deliveries: dict[int, Delivery] = {}
        self._stderr: collections.deque[str] = collections.deque(maxlen=40)
        self._dead: str | None = None
        threading.Thread(target=self._read_replies, name=f"{what}-out", daemon=True).start()
        threading.Thread(target=self._read_log, name=f"{what}-err", daemon=True).start()

    # --- the reader threads -----------------------------------------------------

    def _read_replies(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                message = orjson.loads(line)
            except orjson.JSONDecodeError:
                log.warning("%s wrote a line that is not JSON: %r", self.what, line[:200])
                continue
            if message.get("event") == "delivery":
                with self._lock:
                    delivery = self._deliveries.pop(message["d"], None)
                if delivery is not None:
                    if "error" in message:
                        delivery.fail(_failure(message["error"]))
                    else:
                        delivery.succeed(message.get("offset"))
                continue
            with self._lock:
                waiter = self._waiting.pop(message.get("id"), None)
            if waiter is not None:
                waiter.message = message
                waiter.event.set()
        self._proc.wait()
        self._dead = f"{self.what} exited with status {self._proc.returncode}"
        with self._lock:
            waiters, self._waiting = list(self._waiting.values()), {}
        for waiter in waiters:
            waiter.event.set()

    def _read_log(self) -> None:
        assert self._proc.stderr is not None
        for raw in self._proc.stderr:
            line = raw.decode(errors="replace").rstrip()
            self._stderr.append(line)
            log.debug("%s: %s", self.what, line)

    # --- calls ------------------------------------------------------------------

    def call(self, op: str, handle: int | None = None, *, bound: float = 0.0, **args: Any) -> Any:
        """Send one request and wait for its reply; ClientFailure for a Kafka error."""
        request_id = next(self._ids)
        waiter = _Waiter()
        request: dict[str, Any] = {"id": request_id, "op": op, **args}
        if handle is not None:
            request["h"] = handle
        with self._lock:
            if self._dead:
                raise BridgeError(self._describe_death())
            self._waiting[request_id] = waiter
        self._write(request)
        if not waiter.event.wait(bound + REPLY_GRACE):
            raise BridgeError(f"{self.what} did not answer {op!r} within {bound + REPLY_GRACE:.0f} s")
        message = waiter.message
        if message is None:
            raise BridgeError(self._describe_death())
        if "error" in message:
            raise _failure(message["error"])
        if "bad" in message:
            raise BridgeError(f"{self.what} refused {op!r}: {message['bad']}")
        return message.get("ok")

    def _write(self, request: dict[str, Any]) -> None:
        assert self._proc.stdin is not None
        data = orjson.dumps(request) + b"\n"
        try:
            with self._write_lock:
                self._proc.stdin.write(data)
                self._proc.stdin.flush()
        except (BrokenPipeError, ValueError):
            raise BridgeError(self._describe_death()) from None

    def _describe_death(self) -> str:
        tail = "\n".join(self._stderr) or "(nothing on stderr)"
        return f"{self._dead or self.what + ' is gone'}; its last output:\n{tail}"

    def new_delivery(self) -> tuple[int, Delivery]:
        delivery = Delivery()
        with self._lock:
            delivery_id = next(self._deliveries_ids)
            self._deliveries[delivery_id] = delivery
        return delivery_id, delivery

    def forget_delivery(self, delivery_id: int) -> None:
        with self._lock:
            self._deliveries.pop(delivery_id, None)

    def close(self) -> None:
        """Close stdin: the bridge closes what is still open and exits."""
        if self._proc.poll() is None:
            try:
                assert self._proc.stdin is not None
                with self._write_lock:
                    self._proc.stdin.close()
                self._proc.wait(15)
            except (OSError, subprocess.TimeoutExpired):
                self._proc.kill()
                self._proc.wait()


# The safe defaults of the bridged clients, in the Java client's names, which every bridge takes.
PRODUCER_DEFAULTS: dict[str, object] = {
    "acks": "all",
    "enable.idempotence": True,
    # delivery.timeout.ms must be at least linger.ms + request.timeout.ms.
    "request.timeout.ms": 5000,
    "delivery.timeout.ms": 10000,
    "transaction.timeout.ms": 15000,
    # Bounds initTransactions, commitTransaction and abortTransaction, which take no timeout.
    "max.block.ms": 5000,
}
CONSUMER_DEFAULTS: dict[str, object] = {
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
}


def settings_text(settings: Mapping[str, object]) -> dict[str, str]:
    """Settings as the bridges take them: text, booleans in lower case."""
    return {k: (str(v).lower() if isinstance(v, bool) else str(v)) for k, v in settings.items()}


class _BridgeClient:
    """A client (handle) in the bridge: built by the op named `kind`, closed with `close`."""

    kind = ""

    def __init__(self, bridge: Bridge, config: dict[str, object]) -> None:
        self._bridge = bridge
        self._handle: int | None = bridge.call(self.kind, config=settings_text(config), bound=10.0)

    @property
    def handle(self) -> int:
        if self._handle is None:
            raise ClientFailure(f"{self.kind.capitalize()}Closed")
        return self._handle

    def close(self, clean: bool, timeout: float) -> None:
        if self._handle is not None:
            handle, self._handle = self._handle, None
            try:
                self._bridge.call("close", handle, bound=timeout, clean=clean, timeout=timeout)
            except ClientFailure:
                pass


class BridgeProducer(_BridgeClient):
    kind = "producer"

    def send(self, topic: str, partition: int, key: bytes, value: bytes) -> Delivery:
        delivery_id, delivery = self._bridge.new_delivery()
        try:
            self._bridge.call("send", self.handle, bound=10.0, d=delivery_id, topic=topic, partition=partition,
                              key=_b64(key), value=_b64(value))
        except ClientFailure:
            self._bridge.forget_delivery(delivery_id)
            raise
        return delivery

    def flush(self, timeout: float) -> None:
        self._bridge.call("flush", self.handle, bound=timeout, timeout=timeout)

    # The Java client's transactional calls take no timeout (max.block.ms bounds them); the Go ones use it.
    def init_transactions(self, timeout: float) -> None:
        self._bridge.call("init_transactions", self.handle, bound=timeout, timeout=timeout)

    def begin_transaction(self) -> None:
        self._bridge.call("begin", self.handle)

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], consumer: object,
                                    timeout: float) -> None:
        assert isinstance(consumer, BridgeConsumer)
        self._bridge.call("send_offsets", self.handle, bound=timeout, timeout=timeout, consumer=consumer.handle,
                          offsets=[[t, p, o] for (t, p), o in offsets.items()])

    def commit_transaction(self, timeout: float) -> None:
        self._bridge.call("commit", self.handle, bound=timeout, timeout=timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._bridge.call("abort", self.handle, bound=timeout, timeout=timeout)


class BridgeConsumer(_BridgeClient):
    kind = "consumer"

    def assign(self, partitions: Sequence[TopicPartition], offsets: Mapping[TopicPartition, int] | None = None) -> None:
        self._bridge.call("assign", self.handle, bound=10.0, timeout=5.0, partitions=[list(tp) for tp in partitions],
                          offsets=[[t, p, o] for (t, p), o in (offsets or {}).items()])

    def subscribe(self, topics: Sequence[str]) -> None:
        self._bridge.call("subscribe", self.handle, topics=list(topics))

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        rows = self._bridge.call("poll", self.handle, bound=timeout, max=max_records, timeout=timeout)
        return [Record(t, p, o, _unb64(k), _unb64(v)) for t, p, o, k, v in rows]

    def positions(self) -> dict[TopicPartition, int]:
        rows = self._bridge.call("positions", self.handle, bound=5.0)
        return {(t, p): o for t, p, o in rows if o is not None and o >= 0}

    def commit(self, offsets: Mapping[TopicPartition, int], timeout: float) -> None:
        if offsets:
            self._bridge.call("commit_offsets", self.handle, bound=timeout, timeout=timeout,
                              offsets=[[t, p, o] for (t, p), o in offsets.items()])

    def committed(self, partitions: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int | None]:
        rows = self._bridge.call("committed", self.handle, bound=timeout, timeout=timeout,
                                 partitions=[list(tp) for tp in partitions])
        return {(t, p): o for t, p, o in rows}

    def assignment(self) -> list[TopicPartition]:
        return [(t, p) for t, p in self._bridge.call("assignment", self.handle)]

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._bridge.call("seek", self.handle, topic=partition[0], partition=partition[1], offset=offset)


class BridgeFactory:
    """A ClientFactory whose clients live in one bridge process; subclasses start the bridge and name the defaults."""

    name = ""
    producer_defaults: Mapping[str, object] = PRODUCER_DEFAULTS
    consumer_defaults: Mapping[str, object] = CONSUMER_DEFAULTS

    def __init__(self, bridge: Bridge, bootstrap: str, producer_overrides: Mapping[str, str],
                 consumer_overrides: Mapping[str, str], admin_overrides: Mapping[str, str] | None = None) -> None:
        self.bridge = bridge
        self.bootstrap = bootstrap
        self.admin_overrides = dict(admin_overrides or {})
        self.producer_overrides = dict(producer_overrides)
        self.consumer_overrides = dict(consumer_overrides)
        self._admin: int | None = None

    def producer(self, client_id: str, transactional_id: str | None) -> BridgeProducer:
        config: dict[str, object] = {"bootstrap.servers": self.bootstrap, "client.id": client_id,
                                     **self.producer_defaults}
        if transactional_id:
            config["transactional.id"] = transactional_id
        config.update(self.producer_overrides)
        return BridgeProducer(self.bridge, config)

    def consumer(self, client_id: str, group_id: str) -> BridgeConsumer:
        config: dict[str, object] = {"bootstrap.servers": self.bootstrap, "client.id": client_id,
                                     "group.id": group_id, **self.consumer_defaults}
        config.update(self.consumer_overrides)
        return BridgeConsumer(self.bridge, config)

    def create_topics(self, topics: Sequence[tuple[str, int]], timeout: float) -> None:
        if self._admin is None:
            self._admin = self.bridge.call("admin", config={"bootstrap.servers": self.bootstrap, **self.admin_overrides},
                                           bound=10.0)
        self.bridge.call("create_topics", self._admin, bound=timeout, timeout=timeout,
                         topics=[[t, n] for t, n in topics])

    def close(self) -> None:
        self.bridge.close()
