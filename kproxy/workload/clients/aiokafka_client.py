"""The aiokafka adapter (`--client aiokafka`).

aiokafka is asyncio; the workload's workers are threads. Each aiokafka
client (a producer, a consumer, the admin client) gets an event loop on a
thread of its own, and the adapter submits coroutines to it with
`asyncio.run_coroutine_threadsafe`, each bounded inside the loop. One loop
per client, not one per run: a crash (`close(clean=False)`) then stops
everything that client runs at once (its sender task, its fetcher, its
coordinator and heartbeat tasks, its sockets), as a crashed process would,
without reaching into tasks other clients share a loop with.

Settings take librdkafka's dotted names where aiokafka has the setting
(`enable.idempotence` -> `enable_idempotence`, `batch.size` ->
`max_batch_size`, `sasl.username` -> `sasl_plain_username`,
`ssl.ca.location` -> an SSL context, ...), or aiokafka's own names; a setting
aiokafka does not have is refused before the run starts (docs/workload.md).

aiokafka speaks the transaction protocol's first versions only (EndTxn,
AddPartitionsToTxn, AddOffsetsToTxn and TxnOffsetCommit v0): no
transaction version 2, so a stale EndTxn lands in the next transaction.
"""

from __future__ import annotations

import asyncio
import inspect
import logging
import threading
from collections.abc import Awaitable, Coroutine, Mapping, Sequence
from typing import Any, TypeVar

import aiokafka
import aiokafka.errors as aerr
from aiokafka.admin import AIOKafkaAdminClient, NewTopic
from aiokafka.helpers import create_ssl_context
from aiokafka.producer.transaction_manager import TransactionState
from aiokafka.structs import TopicPartition as AkTopicPartition

from kproxy.workload.clients.base import Delivery, Record, TopicPartition
from kproxy.workload.errors import ClientFailure

log = logging.getLogger(__name__)

T = TypeVar("T")

PRODUCER_DEFAULTS: dict[str, object] = {
    "acks": "all",
    "enable_idempotence": True,
    # Bounds a Produce round trip and how long send() may wait for buffer space.
    "request_timeout_ms": 5000,
    "transaction_timeout_ms": 15000,
}
CONSUMER_DEFAULTS: dict[str, object] = {
    "isolation_level": "read_committed",
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
}

#: The name a call gets when it outlives its bound: aiokafka's own name for a local timeout.
TIMED_OUT = "KafkaTimeoutError"
#: Seconds the caller waits beyond a call's own bound before it counts the loop as stuck.
LOOP_GRACE = 5.0
#: Seconds a crash may take to cancel a client's tasks and close its sockets.
CRASH_GRACE = 2.0
#: Bound of the calls that only touch the client's own state (assign, seek, assignment).
LOCAL_CALL_BOUND = 5.0
#: Bound of asking one partition's position (kafka-python's adapter waits as long).
POSITION_BOUND = 1.0
#: Seconds a poll may run beyond its own timeout before it counts as having read nothing.
POLL_GRACE = 1.0

# --------------------------------------------------------------------------- settings

#: librdkafka's (and the Java client's) names for settings aiokafka calls differently.
ALIASES: dict[str, str] = {
    "batch.size": "max_batch_size",
    "message.max.bytes": "max_request_size",
    "max.request.size": "max_request_size",
    "compression.codec": "compression_type",
    "queue.buffering.max.ms": "linger_ms",
    "fetch.wait.max.ms": "fetch_max_wait_ms",
    "sasl.mechanisms": "sasl_mechanism",
    "sasl.username": "sasl_plain_username",
    "sasl.password": "sasl_plain_password",
}
#: Settings that build the SSL context aiokafka takes instead of file names: name -> create_ssl_context argument.
SSL_FILES: dict[str, str] = {
    "ssl.ca.location": "cafile", "ssl_cafile": "cafile",
    "ssl.certificate.location": "certfile", "ssl_certfile": "certfile",
    "ssl.key.location": "keyfile", "ssl_keyfile": "keyfile",
    "ssl.key.password": "password", "ssl_password": "password",
}
HOSTNAME_CHECK = ("ssl.endpoint.identification.algorithm", "ssl_check_hostname")
#: Constructor arguments no command-line string can give (callables, objects) or that aiokafka ignores.
NOT_SETTINGS = frozenset({
    "self", "loop", "api_version", "key_serializer", "value_serializer", "key_deserializer", "value_deserializer",
    "partitioner", "partition_assignment_strategy", "ssl_context", "sasl_oauth_token_provider", "topics",
})


def _accepted(cls: type) -> frozenset[str]:
    params = inspect.signature(cls.__init__).parameters.values()
    return frozenset(p.name for p in params if p.kind is p.KEYWORD_ONLY or p.kind is p.POSITIONAL_OR_KEYWORD) - NOT_SETTINGS


ACCEPTED = {
    "producer": _accepted(aiokafka.AIOKafkaProducer),
    "consumer": _accepted(aiokafka.AIOKafkaConsumer),
    "admin": _accepted(AIOKafkaAdminClient),
}


def _value(name: str, text: object) -> object:
    if not isinstance(text, str):
        return text
    lowered = text.strip().lower()
    if lowered in ("true", "false"):
        return lowered == "true"
    if name == "compression_type" and lowered == "none":
        return None
    try:
        return int(text)
    except ValueError:
        return text


def aiokafka_settings(settings: Mapping[str, object], role: str) -> dict[str, object]:
    """Command-line settings (librdkafka's dotted names or aiokafka's own) as aiokafka keyword arguments.

    role: "producer", "consumer" or "admin". A setting aiokafka's client of
    that role does not take is a ValueError naming it.
    """
    accepted = ACCEPTED[role]
    out: dict[str, object] = {}
    ssl_files: dict[str, object] = {}
    check_hostname: bool | None = None
    for key, text in settings.items():
        if key in SSL_FILES:
            ssl_files[SSL_FILES[key]] = text
            continue
        if key in HOSTNAME_CHECK:
            check_hostname = str(text).strip().lower() not in ("", "none", "false")
            continue
        name = ALIASES.get(key, key.replace(".", "_"))
        if name not in accepted:
            raise ValueError(f"aiokafka's {role} has no setting {key!r} (as {name!r}); it takes "
                             f"{', '.join(sorted(accepted))}, librdkafka's names of these, and "
                             f"{', '.join(sorted(SSL_FILES))}")
        out[name] = _value(name, text)
    if ssl_files or check_hostname is not None:
        context = create_ssl_context(**ssl_files)  # type: ignore[arg-type]
        if check_hostname is False:
            context.check_hostname = False
        out["ssl_context"] = context
    return out


# --------------------------------------------------------------------------- errors

#: Errors after which the producer cannot be used again (aiokafka stops its sender on them).
_FATAL = (aerr.ProducerFenced, aerr.OutOfOrderSequenceNumber, aerr.TransactionalIdAuthorizationFailed,
          aerr.InvalidProducerEpoch, aerr.UnsupportedVersionError, aerr.InvalidTxnState,
          aerr.InvalidProducerIdMapping)
#: aiokafka's errors that are not KafkaError subclasses but still the library's own verdicts.
_LIBRARY_VERDICTS = (aerr.KafkaError, aerr.IllegalOperation, aerr.ConsumerStoppedError)


def _root(exc: BaseException) -> BaseException:
    """The error behind aiokafka's "Unexpected error during batch delivery", which wraps it when its sender dies."""
    while type(exc) is aerr.KafkaError and isinstance(exc.__cause__, aerr.KafkaError):
        exc = exc.__cause__
    return exc


def _task_died(exc: BaseException) -> bool:
    """aiokafka's wrapper for an internal error that ended one of its background tasks (an AssertionError, say)."""
    return type(exc) is aerr.KafkaError and exc.__cause__ is not None and not isinstance(exc.__cause__, aerr.KafkaError)


def _name(exc: BaseException) -> str:
    if _task_died(exc):
        # A consumer's coordinator routine that died (aiokafka asserts when an assign() lands while it looks
        # for the coordinator) leaves every later poll failing with this wrapper: named by what killed it.
        return type(exc.__cause__).__name__
    if isinstance(exc, aerr.ProducerFenced):
        return "PRODUCER_FENCED"  # also what aiokafka raises for INVALID_PRODUCER_EPOCH
    message = getattr(type(exc), "message", None)  # a broker's error code: Kafka's name for it
    return message if isinstance(message, str) else type(exc).__name__


def _producer_state(producer: aiokafka.AIOKafkaProducer | None) -> tuple[bool, bool]:
    """(the transaction must be aborted, the producer is done for), as aiokafka's own state says."""
    if producer is None:
        return False, False
    manager = producer._txn_manager
    task = producer._sender.sender_task
    dead = task is not None and task.done()
    if manager is None:
        return False, dead
    return manager.state is TransactionState.ABORTABLE_ERROR, dead or manager.is_fatal_error()


def _coordination_died(consumer: aiokafka.AIOKafkaConsumer | None) -> BaseException | None:
    """What ended the consumer's coordinator routine, if it ended: the consumer cannot poll again."""
    task = getattr(getattr(consumer, "_coordinator", None), "_coordination_task", None)
    if task is None or not task.done() or task.cancelled():
        return None
    return task.exception()


def failure_from_exception(exc: BaseException, producer: aiokafka.AIOKafkaProducer | None = None,
                           enqueued: bool = True, consumer: aiokafka.AIOKafkaConsumer | None = None) -> ClientFailure:
    """An aiokafka error as the workload's ClientFailure; anything else is the library breaking."""
    if not isinstance(exc, _LIBRARY_VERDICTS):
        return ClientFailure(type(exc).__name__, enqueued=enqueued, library_error=True)
    # The first poll after the coordinator routine died gets its wrapper before the cause is attached.
    root = _root(_coordination_died(consumer) or exc)
    requires_abort, dead = _producer_state(producer)
    fatal = dead or _task_died(root) or isinstance(root, (*_FATAL, aerr.ConsumerStoppedError, aerr.ProducerClosed))
    return ClientFailure(_name(root), retriable=bool(getattr(root, "retriable", False)) and not fatal, fatal=fatal,
                         txn_requires_abort=requires_abort and not fatal, enqueued=enqueued)


async def translated(coro: Awaitable[T], producer: aiokafka.AIOKafkaProducer | None = None,
                     consumer: aiokafka.AIOKafkaConsumer | None = None, enqueued: bool = True) -> T:
    """`coro`, with aiokafka's errors raised as ClientFailure (on the loop, where the client's state is)."""
    try:
        return await coro
    except _LIBRARY_VERDICTS as exc:
        raise failure_from_exception(exc, producer, enqueued, consumer) from exc


def timed_out() -> ClientFailure:
    # Retriable: a commit that outlived its bound goes on in aiokafka and is waited for again.
    return ClientFailure(TIMED_OUT, retriable=True)


# --------------------------------------------------------------------------- the loop


class ClientLoop:
    """An asyncio event loop on a thread of its own, serving one aiokafka client."""

    def __init__(self, name: str) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._serve, name=name, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        asyncio.set_event_loop(self.loop)
        try:
            self.loop.run_forever()
        finally:
            self.loop.close()

    def run(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        """Run `coro` on the loop and wait for it; it is cancelled there after `timeout` seconds (KafkaTimeoutError)."""

        async def bounded() -> T:
            try:
                return await asyncio.wait_for(coro, timeout)
            except TimeoutError:
                raise timed_out() from None

        future = asyncio.run_coroutine_threadsafe(bounded(), self.loop)
        # Every TimeoutError of the call itself became a ClientFailure in the loop: this one means the
        # loop did not answer at all, which the guard reports as the library breaking.
        return future.result(timeout + LOOP_GRACE)

    def stop(self, *clients: Any) -> None:
        """End everything on the loop: cancel its tasks, close the clients' sockets, stop the thread.

        For a client already stopped cleanly this only ends the thread; for
        any other it is the crash: nothing is flushed, committed or left.
        """
        if not self._thread.is_alive():
            return

        async def crash() -> None:
            tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
            for task in tasks:
                task.cancel()
            # Sockets close as a dead process's would; requests in flight fail without an answer.
            closing = [asyncio.ensure_future(c.close()) for c in clients]
            if tasks:
                await asyncio.wait(tasks, timeout=CRASH_GRACE)
            if closing:
                await asyncio.wait(closing, timeout=CRASH_GRACE)

        try:
            asyncio.run_coroutine_threadsafe(crash(), self.loop).result(3 * CRASH_GRACE)
        except Exception as exc:  # a teardown that failed still stops the thread below
            log.debug("aiokafka teardown: %r", exc)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(CRASH_GRACE)


def _tp(tp: TopicPartition) -> AkTopicPartition:
    return AkTopicPartition(tp[0], tp[1])


# --------------------------------------------------------------------------- producer


class AiokafkaProducer:
    def __init__(self, config: dict[str, object], name: str) -> None:
        self._transactional = config.get("transactional_id") is not None
        self._send_bound = float(config.get("request_timeout_ms", 40000)) / 1000  # type: ignore[arg-type]
        self._loop = ClientLoop(f"aiokafka-{name}")
        self._pending: list[tuple[asyncio.Future[Any], Delivery]] = []  # touched on the loop only
        self._started = False
        self._p: aiokafka.AIOKafkaProducer | None = None

        async def make() -> aiokafka.AIOKafkaProducer:
            return aiokafka.AIOKafkaProducer(**config)  # type: ignore[arg-type]

        try:
            # A setting aiokafka refuses (ValueError, TypeError) stops the run: it is not guarded.
            self._p = self._loop.run(make(), LOCAL_CALL_BOUND)
            if not self._transactional:
                self._start(self._send_bound)
        except BaseException:
            self.close(False, 0.0)
            raise

    @property
    def _producer(self) -> aiokafka.AIOKafkaProducer:
        if self._p is None:
            raise ClientFailure("ProducerClosed", fatal=True)
        return self._p

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float, enqueued: bool = True) -> T:
        return self._loop.run(translated(coro, self._producer, enqueued=enqueued), timeout)

    def _refuse_if_dead(self, enqueued: bool = True) -> None:
        """After a fatal error aiokafka's state machine asserts, and a record sent would wait forever: answer
        with the error that killed the sender instead."""
        producer = self._producer
        task = producer._sender.sender_task
        if task is not None and task.done() and not task.cancelled() and task.exception() is not None:
            raise failure_from_exception(task.exception(), producer, enqueued)  # type: ignore[arg-type]

    def _start(self, timeout: float) -> None:
        # start() bootstraps and, for an idempotent or transactional producer, gets its producer id
        # (InitProducerId: the transactional one fences its predecessor); it retries until it has one.
        self._call(self._producer.start(), timeout)
        self._started = True

    def _settle(self) -> None:
        """Record the outcome of every send whose future is done (on the loop, where the futures live)."""
        still = []
        for future, delivery in self._pending:
            if not future.done():
                still.append((future, delivery))
            elif not future.cancelled():
                exc = future.exception()
                if exc is None:
                    offset = future.result().offset
                    delivery.succeed(offset if offset is not None and offset >= 0 else None)
                else:
                    delivery.fail(failure_from_exception(exc, self._p))
        self._pending = still

    def _forget(self) -> None:
        """Let go of the sends whose outcome nobody will read, marking their errors as seen: asyncio logs
        "Future exception was never retrieved" for each otherwise."""
        for future, _ in self._pending:
            future.add_done_callback(lambda f: f.cancelled() or f.exception())
        self._pending = []

    def send(self, topic: str, partition: int, key: bytes, value: bytes) -> Delivery:
        self._refuse_if_dead(enqueued=False)
        delivery = Delivery()
        producer = self._producer

        async def enqueue() -> None:
            future = await producer.send(topic, value=value, key=key, partition=partition)
            self._pending.append((future, delivery))

        # send() waits for metadata and buffer space; cancelled by its bound, the record is not sent.
        self._call(enqueue(), self._send_bound, enqueued=False)
        return delivery

    def flush(self, timeout: float) -> None:
        producer = self._producer

        async def flushed() -> None:
            try:
                await asyncio.wait_for(producer.flush(), timeout)
            except TimeoutError:
                pass  # deliveries still pending stay unknown
            self._settle()

        self._call(flushed(), timeout + 1.0)

    def init_transactions(self, timeout: float) -> None:
        if not self._started:
            self._start(timeout)

    def begin_transaction(self) -> None:
        self._refuse_if_dead()
        self._call(self._producer.begin_transaction(), self._send_bound)

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], consumer: object,
                                    timeout: float) -> None:
        assert isinstance(consumer, AiokafkaConsumer)
        self._refuse_if_dead()
        self._call(self._producer.send_offsets_to_transaction({_tp(tp): o for tp, o in offsets.items()},
                                                              consumer.group_id), timeout)

    def _end(self, commit: bool, timeout: float) -> None:
        self._refuse_if_dead()
        producer = self._producer
        manager = producer._txn_manager
        under_way = TransactionState.COMMITTING_TRANSACTION if commit else TransactionState.ABORTING_TRANSACTION

        async def ended() -> None:
            try:
                if manager is not None and manager.state is under_way:
                    # A retry after a timeout: the EndTxn asked for before is still going on; wait for it.
                    await asyncio.shield(manager.wait_for_transaction_end())
                elif commit:
                    await producer.commit_transaction()
                else:
                    await producer.abort_transaction()
            finally:
                self._settle()  # the commit flushed every send first

        self._call(ended(), timeout)

    def commit_transaction(self, timeout: float) -> None:
        self._end(True, timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._end(False, timeout)

    def close(self, clean: bool, timeout: float) -> None:
        producer, self._p = self._p, None
        if producer is not None and clean:
            try:
                # stop() sends what is buffered and waits for it, then closes the connections.
                self._loop.run(producer.stop(), timeout)
            except Exception as exc:
                log.debug("aiokafka producer stop: %r", exc)
        elif producer is not None:
            producer._closed = True  # its stop() would flush: a crash never calls it
        if not self._loop.loop.is_closed():
            self._loop.loop.call_soon_threadsafe(self._forget)
        self._loop.stop(*([producer.client] if producer is not None else []))


# --------------------------------------------------------------------------- consumer


class AiokafkaConsumer:
    def __init__(self, config: dict[str, object], name: str) -> None:
        self.group_id = str(config["group_id"])
        self._loop = ClientLoop(f"aiokafka-{name}")
        bound = float(config.get("request_timeout_ms", 40000)) / 1000  # type: ignore[arg-type]

        async def started() -> aiokafka.AIOKafkaConsumer:
            consumer = aiokafka.AIOKafkaConsumer(**config)  # type: ignore[arg-type]
            self._c = consumer
            await consumer.start()
            return consumer

        self._c: aiokafka.AIOKafkaConsumer | None = None
        try:
            self._loop.run(translated(started()), bound)
        except BaseException:
            self.close(False, 0.0)
            raise

    @property
    def _consumer(self) -> aiokafka.AIOKafkaConsumer:
        if self._c is None:
            raise ClientFailure("ConsumerStoppedError", fatal=True)
        return self._c

    def _call(self, coro: Coroutine[Any, Any, T], timeout: float) -> T:
        return self._loop.run(translated(coro, consumer=self._c), timeout)

    def _local(self, fn: Any, *args: Any) -> Any:
        """A call that only changes the consumer's own state, made on its loop (aiokafka is not thread-safe)."""

        async def call() -> Any:
            return fn(*args)

        return self._call(call(), LOCAL_CALL_BOUND)

    def assign(self, partitions: Sequence[TopicPartition], offsets: Mapping[TopicPartition, int] | None = None) -> None:
        consumer = self._consumer

        async def assigned() -> None:
            consumer.assign([_tp(tp) for tp in partitions])
            for tp, offset in (offsets or {}).items():
                consumer.seek(_tp(tp), offset)

        self._call(assigned(), LOCAL_CALL_BOUND)

    def subscribe(self, topics: Sequence[str]) -> None:
        self._local(self._consumer.subscribe, list(topics))

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        consumer = self._consumer

        async def polled() -> dict[AkTopicPartition, list[Any]]:
            try:
                # getmany() waits out a rebalance whatever its timeout (a member that crashed holds the group
                # for its session timeout). Stopped there it has handed out nothing, so the poll read nothing,
                # as another client's poll(timeout) returns empty.
                return await asyncio.wait_for(consumer.getmany(timeout_ms=int(timeout * 1000),
                                                               max_records=max_records), timeout + POLL_GRACE)
            except TimeoutError:
                return {}

        batches = self._call(polled(), timeout + POLL_GRACE + 1.0)
        return [Record(tp.topic, tp.partition, m.offset, m.key, m.value) for tp, msgs in batches.items() for m in msgs]

    def assignment(self) -> list[TopicPartition]:
        return [(tp.topic, tp.partition) for tp in self._local(self._consumer.assignment)]

    def positions(self) -> dict[TopicPartition, int]:
        consumer = self._consumer

        async def known() -> dict[TopicPartition, int]:
            out = {}
            for tp in consumer.assignment():
                try:
                    position = await asyncio.wait_for(consumer.position(tp), POSITION_BOUND)
                except TimeoutError:
                    continue  # not known yet (a committed offset or a reset still on its way)
                if position is not None and position >= 0:
                    out[(tp.topic, tp.partition)] = position
            return out

        return self._call(known(), LOCAL_CALL_BOUND + POSITION_BOUND * len(consumer.assignment()))

    def commit(self, offsets: Mapping[TopicPartition, int], timeout: float) -> None:
        if offsets:
            self._call(self._consumer.commit({_tp(tp): o for tp, o in offsets.items()}), timeout)

    def committed(self, partitions: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int | None]:
        consumer = self._consumer

        async def read() -> dict[TopicPartition, int | None]:
            return {tp: await consumer.committed(_tp(tp)) for tp in partitions}

        return self._call(read(), timeout)

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._local(self._consumer.seek, _tp(partition), offset)

    def close(self, clean: bool, timeout: float) -> None:
        consumer, self._c = self._c, None
        if consumer is not None and clean:
            try:
                # stop() leaves the group (a subscribed consumer) and closes the connections; no commit,
                # auto-commit being off.
                self._loop.run(consumer.stop(), timeout)
            except Exception as exc:
                log.debug("aiokafka consumer stop: %r", exc)
        elif consumer is not None:
            consumer._closed = True  # its stop() would leave the group: a crash never calls it
        # The consumer's connections belong to its AIOKafkaClient, which it does not expose.
        self._loop.stop(*([consumer._client] if consumer is not None else []))


# --------------------------------------------------------------------------- factory


class AiokafkaFactory:
    name = "aiokafka"

    def __init__(self, bootstrap: str, producer_overrides: Mapping[str, str],
                 consumer_overrides: Mapping[str, str], admin_overrides: Mapping[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        # Every setting is checked here, before any worker starts.
        self.producer_overrides = aiokafka_settings(producer_overrides, "producer")
        self.consumer_overrides = aiokafka_settings(consumer_overrides, "consumer")
        self.admin_overrides = aiokafka_settings(admin_overrides or {}, "admin")
        self._admin: AIOKafkaAdminClient | None = None
        self._admin_loop: ClientLoop | None = None
        self._admin_lock = threading.Lock()

    def producer(self, client_id: str, transactional_id: str | None) -> AiokafkaProducer:
        config: dict[str, object] = {"bootstrap_servers": self.bootstrap, "client_id": client_id, **PRODUCER_DEFAULTS}
        if transactional_id:
            config["transactional_id"] = transactional_id
        config.update(self.producer_overrides)
        return AiokafkaProducer(config, client_id)

    def consumer(self, client_id: str, group_id: str) -> AiokafkaConsumer:
        config: dict[str, object] = {"bootstrap_servers": self.bootstrap, "client_id": client_id,
                                     "group_id": group_id, **CONSUMER_DEFAULTS}
        config.update(self.consumer_overrides)
        return AiokafkaConsumer(config, client_id)

    def _admin_client(self, timeout: float) -> tuple[ClientLoop, AIOKafkaAdminClient]:
        if self._admin is None or self._admin_loop is None:
            loop = ClientLoop("aiokafka-admin")
            config = {"bootstrap_servers": self.bootstrap, **self.admin_overrides}

            async def started() -> AIOKafkaAdminClient:
                admin = AIOKafkaAdminClient(**config)  # type: ignore[arg-type]
                await admin.start()
                return admin

            try:
                self._admin = loop.run(translated(started()), timeout)
            except BaseException:
                loop.stop()
                raise
            self._admin_loop = loop
        return self._admin_loop, self._admin

    def create_topics(self, topics: Sequence[tuple[str, int]], timeout: float) -> None:
        with self._admin_lock:  # workers create topics concurrently; one admin client serves them
            loop, admin = self._admin_client(timeout)
            response = loop.run(translated(
                admin.create_topics([NewTopic(t, n, 1) for t, n in topics], timeout_ms=int(timeout * 1000))), timeout)
        for topic_error in response.topic_errors:
            error = aerr.for_code(topic_error[1])
            if error is not aerr.NoError and error is not aerr.TopicAlreadyExistsError:
                raise failure_from_exception(error())

    def close(self) -> None:
        """End the admin client's loop (producers and consumers end theirs when closed)."""
        with self._admin_lock:
            admin, loop = self._admin, self._admin_loop
            self._admin = self._admin_loop = None
        if admin is not None and loop is not None:
            try:
                loop.run(admin.close(), CRASH_GRACE)
            except Exception as exc:
                log.debug("aiokafka admin close: %r", exc)
            loop.stop(admin._client)  # its connections, should close() not have finished
