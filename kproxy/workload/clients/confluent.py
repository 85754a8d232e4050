"""The confluent-kafka (librdkafka) adapter; the workload's default client."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import confluent_kafka
from confluent_kafka import KafkaError, KafkaException
from confluent_kafka import TopicPartition as CkTopicPartition
from confluent_kafka.admin import AdminClient, NewTopic

from kproxy.workload.clients.base import Delivery, Record, TopicPartition
from kproxy.workload.errors import ClientFailure

# The safe settings (docs/workload.md); anything here can be overridden.
PRODUCER_DEFAULTS: dict[str, object] = {
    "acks": "all",
    "enable.idempotence": True,
    # Short enough that a stuck send becomes an `info` op within a test run.
    "message.timeout.ms": 10000,
    "transaction.timeout.ms": 15000,
}
CONSUMER_DEFAULTS: dict[str, object] = {
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
    "enable.auto.offset.store": False,
}


def failure_from_error(err: KafkaError, enqueued: bool = True) -> ClientFailure:
    return ClientFailure(
        name=err.name(),
        retriable=bool(err.retriable()),
        fatal=bool(err.fatal()),
        txn_requires_abort=bool(err.txn_requires_abort()),
        enqueued=enqueued,
    )


def failure_from_exception(exc: BaseException) -> ClientFailure:
    if isinstance(exc, KafkaException) and exc.args and isinstance(exc.args[0], KafkaError):
        return failure_from_error(exc.args[0])
    if isinstance(exc, BufferError):
        return ClientFailure("_QUEUE_FULL", retriable=True, enqueued=False)
    return ClientFailure(type(exc).__name__, library_error=True)


def delivery_reporter(delivery: Delivery):  # noqa: ANN201 - librdkafka's on_delivery callback
    """The callback that records a send's outcome in ``delivery``.

    It runs inside librdkafka: an exception in it would surface from
    flush() as a SystemError, so nothing in it may raise.
    """

    def on_delivery(err: KafkaError | None, msg: confluent_kafka.Message) -> None:
        if err is not None:
            delivery.fail(failure_from_error(err))
            return
        # An acknowledged send whose offset the broker did not give
        # (librdkafka reports None, or a negative sentinel) has no known offset.
        offset = msg.offset()
        delivery.succeed(offset if offset is not None and offset >= 0 else None)

    return on_delivery


def _tps(partitions: Sequence[TopicPartition]) -> list[CkTopicPartition]:
    return [CkTopicPartition(t, p) for t, p in partitions]


class ConfluentProducer:
    def __init__(self, config: dict[str, object]) -> None:
        self._p: confluent_kafka.Producer | None = confluent_kafka.Producer(config)

    @property
    def _producer(self) -> confluent_kafka.Producer:
        if self._p is None:
            raise ClientFailure("_DESTROY")
        return self._p

    def send(self, topic: str, partition: int, key: bytes, value: bytes) -> Delivery:
        delivery = Delivery()
        on_delivery = delivery_reporter(delivery)
        try:
            self._producer.produce(topic, value=value, key=key, partition=partition, on_delivery=on_delivery)
        except (KafkaException, BufferError) as exc:
            failure = failure_from_exception(exc)
            raise ClientFailure(failure.name, failure.retriable, failure.fatal, failure.txn_requires_abort,
                                enqueued=False) from exc
        self._producer.poll(0)
        return delivery

    def flush(self, timeout: float) -> None:
        self._producer.flush(timeout)

    def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        try:
            return fn(*args)
        except KafkaException as exc:
            # Drop the bound method before raising: a failure kept in the history
            # holds this frame through its traceback, and the method would keep
            # the librdkafka handle, reconnecting, alive after close().
            fn = None
            raise failure_from_exception(exc) from exc

    def init_transactions(self, timeout: float) -> None:
        self._call(self._producer.init_transactions, timeout)

    def begin_transaction(self) -> None:
        self._call(self._producer.begin_transaction)

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], consumer: object,
                                    timeout: float) -> None:
        assert isinstance(consumer, ConfluentConsumer)
        tps = [CkTopicPartition(t, p, o) for (t, p), o in offsets.items()]
        self._call(self._producer.send_offsets_to_transaction, tps, consumer.group_metadata(), timeout)

    def commit_transaction(self, timeout: float) -> None:
        self._call(self._producer.commit_transaction, timeout)

    def abort_transaction(self, timeout: float) -> None:
        self._call(self._producer.abort_transaction, timeout)

    def close(self, clean: bool, timeout: float) -> None:
        if self._p is not None and clean:
            self._p.flush(timeout)
        # Dropping the last reference destroys the handle without finishing
        # outstanding transactions: for clean=False that is the crash.
        self._p = None


class ConfluentConsumer:
    def __init__(self, config: dict[str, object]) -> None:
        self._c: confluent_kafka.Consumer | None = confluent_kafka.Consumer(config)

    @property
    def _consumer(self) -> confluent_kafka.Consumer:
        if self._c is None:
            raise ClientFailure("_DESTROY")
        return self._c

    def _call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except KafkaException as exc:
            # Drop the bound method before raising: a failure kept in the history
            # holds this frame through its traceback, and the method would keep
            # the librdkafka handle, reconnecting, alive after close().
            fn = None
            raise failure_from_exception(exc) from exc

    def group_metadata(self) -> object:
        return self._call(self._consumer.consumer_group_metadata)

    def assign(self, partitions: Sequence[TopicPartition], offsets: Mapping[TopicPartition, int] | None = None) -> None:
        offsets = offsets or {}
        tps = [CkTopicPartition(t, p, offsets[(t, p)]) if (t, p) in offsets else CkTopicPartition(t, p)
               for t, p in partitions]
        self._call(self._consumer.assign, tps)

    def subscribe(self, topics: Sequence[str]) -> None:
        self._call(self._consumer.subscribe, list(topics))

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        msgs = self._call(self._consumer.consume, max_records, timeout)
        records = []
        for m in msgs:
            err = m.error()
            if err is not None:
                if err.fatal():
                    raise failure_from_error(err)
                continue  # informational (partition EOF, transient fetch errors)
            records.append(Record(m.topic(), m.partition(), m.offset(), m.key(), m.value()))
        return records

    def assignment(self) -> list[TopicPartition]:
        return [(tp.topic, tp.partition) for tp in self._call(self._consumer.assignment)]

    def positions(self) -> dict[TopicPartition, int]:
        assigned = self._call(self._consumer.assignment)
        if not assigned:
            return {}
        return {(tp.topic, tp.partition): tp.offset for tp in self._call(self._consumer.position, assigned)
                if tp.offset >= 0}

    def commit(self, offsets: Mapping[TopicPartition, int], timeout: float) -> None:
        if offsets:
            tps = [CkTopicPartition(t, p, o) for (t, p), o in offsets.items()]
            self._call(self._consumer.commit, offsets=tps, asynchronous=False)

    def committed(self, partitions: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int | None]:
        result = self._call(self._consumer.committed, _tps(partitions), timeout=timeout)
        return {(tp.topic, tp.partition): (tp.offset if tp.offset >= 0 else None) for tp in result}

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._call(self._consumer.seek, CkTopicPartition(partition[0], partition[1], offset))

    def close(self, clean: bool, timeout: float) -> None:
        if self._c is not None and clean:
            try:
                self._c.close()
            except (KafkaException, RuntimeError):
                pass
        self._c = None


class ConfluentFactory:
    name = "confluent-kafka"

    def __init__(self, bootstrap: str, producer_overrides: Mapping[str, str],
                 consumer_overrides: Mapping[str, str], admin_overrides: Mapping[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.admin_overrides = dict(admin_overrides or {})
        self.producer_overrides = dict(producer_overrides)
        self.consumer_overrides = dict(consumer_overrides)
        self._admin: AdminClient | None = None

    def producer(self, client_id: str, transactional_id: str | None) -> ConfluentProducer:
        config: dict[str, object] = {"bootstrap.servers": self.bootstrap, "client.id": client_id, **PRODUCER_DEFAULTS}
        if transactional_id:
            config["transactional.id"] = transactional_id
        config.update(self.producer_overrides)
        return ConfluentProducer(config)

    def consumer(self, client_id: str, group_id: str) -> ConfluentConsumer:
        config: dict[str, object] = {"bootstrap.servers": self.bootstrap, "client.id": client_id,
                                     "group.id": group_id, **CONSUMER_DEFAULTS}
        config.update(self.consumer_overrides)
        return ConfluentConsumer(config)

    def create_topics(self, topics: Sequence[tuple[str, int]], timeout: float) -> None:
        if self._admin is None:
            self._admin = AdminClient({"bootstrap.servers": self.bootstrap, **self.admin_overrides})
        futures = self._admin.create_topics([NewTopic(t, n, 1) for t, n in topics], operation_timeout=timeout,
                                            request_timeout=timeout)
        for future in futures.values():
            try:
                future.result(timeout)
            except KafkaException as exc:
                err = exc.args[0] if exc.args else None
                if isinstance(err, KafkaError) and err.code() == KafkaError.TOPIC_ALREADY_EXISTS:
                    continue
                raise failure_from_exception(exc) from exc
