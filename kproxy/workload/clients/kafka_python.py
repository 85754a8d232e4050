"""The kafka-python adapter (`--client kafka-python`).

Settings use kafka-python's names; librdkafka-style dotted names are accepted
too (`enable.idempotence` -> `enable_idempotence`) so one override works for
both clients where the setting exists in both.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import kafka
import kafka.errors as kerr
from kafka.admin import KafkaAdminClient, NewTopic
from kafka.structs import OffsetAndMetadata
from kafka.structs import TopicPartition as KpTopicPartition

from kproxy.workload.clients.base import Delivery, Record, TopicPartition
from kproxy.workload.errors import ClientFailure

PRODUCER_DEFAULTS: dict[str, object] = {
    "acks": "all",
    "enable_idempotence": True,
    # kafka-python wants delivery_timeout_ms > linger_ms + request_timeout_ms.
    "request_timeout_ms": 5000,
    "delivery_timeout_ms": 10000,
    "transaction_timeout_ms": 15000,
    # Bounds init/commit/abort_transaction, which take no timeout argument.
    "max_block_ms": 5000,
}
CONSUMER_DEFAULTS: dict[str, object] = {
    "isolation_level": "read_committed",
    "auto_offset_reset": "earliest",
    "enable_auto_commit": False,
}
_FATAL = (kerr.ProducerFencedError, kerr.TransactionalIdAuthorizationFailedError, kerr.UnsupportedVersionError,
          kerr.InvalidProducerEpochError)


def normalize_settings(settings: Mapping[str, str]) -> dict[str, object]:
    """Command-line strings to the types kafka-python wants."""
    out: dict[str, object] = {}
    for key, text in settings.items():
        value: object = text
        if isinstance(text, str):
            lowered = text.lower()
            if lowered in ("true", "false"):
                value = lowered == "true"
            else:
                try:
                    value = int(text)
                except ValueError:
                    try:
                        value = float(text)
                    except ValueError:
                        value = text
        out[key.replace(".", "_")] = value
    return out


def failure_from_exception(exc: BaseException, producer: kafka.KafkaProducer | None = None,
                           enqueued: bool = True) -> ClientFailure:
    if isinstance(exc, kerr.KafkaError):
        # Broker errors carry Kafka's own name; local ones only their class name.
        name = getattr(exc, "message", None) or type(exc).__name__
        manager = getattr(producer, "_transaction_manager", None) if producer is not None else None
        requires_abort = bool(manager is not None and manager.has_abortable_error())
        return ClientFailure(name, retriable=bool(exc.retriable), fatal=isinstance(exc, _FATAL),
                             txn_requires_abort=requires_abort, enqueued=enqueued)
    # Not one of the library's Kafka errors: the library itself broke.
    return ClientFailure(type(exc).__name__, enqueued=enqueued, library_error=True)


class KafkaPythonProducer:
    def __init__(self, config: dict[str, object]) -> None:
        self._p: kafka.KafkaProducer | None = kafka.KafkaProducer(**config)
        self._pending: list[tuple[object, Delivery]] = []

    @property
    def _producer(self) -> kafka.KafkaProducer:
        if self._p is None:
            raise ClientFailure("ProducerClosed")
        return self._p

    def _call(self, fn, *args):  # type: ignore[no-untyped-def]
        try:
            return fn(*args)
        except Exception as exc:  # kafka-python raises plain KafkaError subclasses and IllegalStateError
            raise failure_from_exception(exc, self._p) from exc

    def send(self, topic: str, partition: int, key: bytes, value: bytes) -> Delivery:
        delivery = Delivery()
        try:
            future = self._producer.send(topic, key=key, value=value, partition=partition)
        except Exception as exc:
            raise failure_from_exception(exc, self._p, enqueued=False) from exc
        future.add_callback(lambda md: delivery.succeed(md.offset if md.offset >= 0 else None))
        future.add_errback(lambda exc: delivery.fail(failure_from_exception(exc, self._p)))
        return delivery

    def flush(self, timeout: float) -> None:
        try:
            self._producer.flush(timeout)
        except kerr.KafkaTimeoutError:
            pass  # deliveries still pending stay unknown

    def init_transactions(self, timeout: float) -> None:
        self._call(self._producer.init_transactions)

    def begin_transaction(self) -> None:
        self._call(self._producer.begin_transaction)

    def send_offsets_to_transaction(self, offsets: Mapping[TopicPartition, int], consumer: object,
                                    timeout: float) -> None:
        assert isinstance(consumer, KafkaPythonConsumer)
        kp_offsets = {KpTopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()}
        self._call(self._producer.send_offsets_to_transaction, kp_offsets, consumer.group_metadata())

    def commit_transaction(self, timeout: float) -> None:
        self._call(self._producer.commit_transaction)  # bounded by max_block_ms

    def abort_transaction(self, timeout: float) -> None:
        self._call(self._producer.abort_transaction)  # bounded by max_block_ms

    def close(self, clean: bool, timeout: float) -> None:
        if self._p is not None:
            try:
                # timeout 0 is kafka-python's "stop now, drop what is pending": the crash.
                self._p.close(timeout=timeout if clean else 0)
            except Exception:
                pass
        self._p = None


class KafkaPythonConsumer:
    def __init__(self, config: dict[str, object]) -> None:
        self._c: kafka.KafkaConsumer | None = kafka.KafkaConsumer(**config)

    @property
    def _consumer(self) -> kafka.KafkaConsumer:
        if self._c is None:
            raise ClientFailure("ConsumerClosed")
        return self._c

    def _call(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            raise failure_from_exception(exc) from exc

    def group_metadata(self) -> object:
        return self._call(self._consumer.group_metadata)

    def assign(self, partitions: Sequence[TopicPartition], offsets: Mapping[TopicPartition, int] | None = None) -> None:
        self._call(self._consumer.assign, [KpTopicPartition(t, p) for t, p in partitions])
        for tp, offset in (offsets or {}).items():
            self._call(self._consumer.seek, KpTopicPartition(*tp), offset)

    def subscribe(self, topics: Sequence[str]) -> None:
        self._call(self._consumer.subscribe, list(topics))

    def poll(self, max_records: int, timeout: float) -> list[Record]:
        batches = self._call(self._consumer.poll, timeout_ms=int(timeout * 1000), max_records=max_records)
        return [Record(tp.topic, tp.partition, m.offset, m.key, m.value)
                for tp, msgs in batches.items() for m in msgs]

    def assignment(self) -> list[TopicPartition]:
        return [(tp.topic, tp.partition) for tp in self._call(self._consumer.assignment)]

    def positions(self) -> dict[TopicPartition, int]:
        out = {}
        for tp in self._call(self._consumer.assignment):
            position = self._call(self._consumer.position, tp, timeout_ms=1000)
            if position is not None and position >= 0:
                out[(tp.topic, tp.partition)] = position
        return out

    def commit(self, offsets: Mapping[TopicPartition, int], timeout: float) -> None:
        if offsets:
            self._call(self._consumer.commit,
                       {KpTopicPartition(t, p): OffsetAndMetadata(o, "", -1) for (t, p), o in offsets.items()})

    def committed(self, partitions: Sequence[TopicPartition], timeout: float) -> dict[TopicPartition, int | None]:
        return {(t, p): self._call(self._consumer.committed, KpTopicPartition(t, p), timeout_ms=int(timeout * 1000)) for t, p in partitions}

    def seek(self, partition: TopicPartition, offset: int) -> None:
        self._call(self._consumer.seek, KpTopicPartition(*partition), offset)

    def close(self, clean: bool, timeout: float) -> None:
        if self._c is not None:
            try:
                self._c.close(autocommit=False)
            except Exception:
                pass
        self._c = None


class KafkaPythonFactory:
    name = "kafka-python"

    def __init__(self, bootstrap: str, producer_overrides: Mapping[str, str],
                 consumer_overrides: Mapping[str, str], admin_overrides: Mapping[str, str] | None = None) -> None:
        self.bootstrap = bootstrap
        self.admin_overrides = normalize_settings(admin_overrides or {})
        self.producer_overrides = normalize_settings(producer_overrides)
        self.consumer_overrides = normalize_settings(consumer_overrides)
        self._admin: KafkaAdminClient | None = None

    def producer(self, client_id: str, transactional_id: str | None) -> KafkaPythonProducer:
        config: dict[str, object] = {"bootstrap_servers": self.bootstrap, "client_id": client_id, **PRODUCER_DEFAULTS}
        if transactional_id:
            config["transactional_id"] = transactional_id
        config.update(self.producer_overrides)
        return KafkaPythonProducer(config)

    def consumer(self, client_id: str, group_id: str) -> KafkaPythonConsumer:
        config: dict[str, object] = {"bootstrap_servers": self.bootstrap, "client_id": client_id,
                                     "group_id": group_id, **CONSUMER_DEFAULTS}
        config.update(self.consumer_overrides)
        return KafkaPythonConsumer(config)

    def create_topics(self, topics: Sequence[tuple[str, int]], timeout: float) -> None:
        if self._admin is None:
            self._admin = KafkaAdminClient(bootstrap_servers=self.bootstrap, **self.admin_overrides)
        try:
            self._admin.create_topics([NewTopic(t, n, 1) for t, n in topics], timeout_ms=int(timeout * 1000))
        except kerr.TopicAlreadyExistsError:
            pass
        except Exception as exc:
            raise failure_from_exception(exc) from exc
