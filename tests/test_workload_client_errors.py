"""The workload survives its client library: an error the adapter does not know ends one operation `info`.

confluent-kafka's flush() turns an exception inside a delivery callback into
`SystemError: _PyErr_SetObject: exception ... is not a BaseException
subclass` (the ambiguous-not-leader and spurious-zero-offset demos stopped on
it). Here the real client produces that SystemError: the delivery callback is
replaced by one that compares an offset of None, as the adapter once did.
"""

from __future__ import annotations

from pathlib import Path

import aiokafka.errors as aerr
import pytest

from kproxy.workload.clients import aiokafka_client, confluent
from kproxy.workload.clients.guard import guarded
from kproxy.workload.errors import (
    ClientFailure,
    classify_commit,
    classify_in_txn,
    classify_produce,
    classify_read,
)
from kproxy.workload.history import read_history, validate_history
from kproxy.workload.runner import WorkloadError, run_workload
from tests.test_workload import check_history, quick_config

pytestmark = pytest.mark.timeout(120)


def _library_errors(ops, f: str) -> list:
    return [op for op in ops if op.f == f and op.type == "info" and op.error in ("SystemError", "TypeError",
                                                                                  "AssertionError")]


def test_a_systemerror_from_flush_ends_the_send_info_and_the_worker_carries_on(broker, tmp_path: Path,
                                                                               monkeypatch) -> None:
    sends = {"n": 0}
    real_reporter = confluent.delivery_reporter

    def reporter_that_breaks_once(delivery):
        sends["n"] += 1
        if sends["n"] != 4:
            return real_reporter(delivery)

        def on_delivery(err, msg):
            offset = None
            delivery.succeed(offset if offset >= 0 else None)  # TypeError inside librdkafka's callback

        return on_delivery

    monkeypatch.setattr(confluent, "delivery_reporter", reporter_that_breaks_once)
    path = tmp_path / "history.jsonl"
    summary = run_workload(quick_config(broker.bootstrap, ops=30, crash_probability=0.0), path, progress=False)
    validate_history(path)
    ops = list(read_history(path))
    broken = _library_errors(ops, "send")
    assert [op.error for op in broken] == ["SystemError"], [op.to_dict() for op in ops if op.type == "info"]
    # The process that met it is retired; its successor (p + concurrency) ran operations after it.
    after = [op for op in ops if op.index > broken[0].index and op.process == broken[0].process + 3]
    assert after, "the worker did not carry on with a new process"
    check_history(ops, concurrency=3)
    assert summary.invocations == 30


def test_an_unknown_error_from_a_kafka_python_poll_ends_the_poll_info(broker, tmp_path: Path, monkeypatch) -> None:
    import kafka

    polls = {"n": 0}
    real_poll = kafka.KafkaConsumer.poll

    def poll_that_breaks_once(self, *args, **kwargs):
        polls["n"] += 1
        if polls["n"] == 3:
            raise AssertionError("internal state")
        return real_poll(self, *args, **kwargs)

    monkeypatch.setattr(kafka.KafkaConsumer, "poll", poll_that_breaks_once)
    path = tmp_path / "history.jsonl"
    config = quick_config(broker.bootstrap, client="kafka-python", ops=20, crash_probability=0.0)
    run_workload(config, path, progress=False)
    ops = list(read_history(path))
    broken = _library_errors(ops, "poll")
    assert [op.error for op in broken] == ["AssertionError"]
    check_history(ops, concurrency=3)


class _FencedProducer:
    """An adapter whose library has declared it unusable (what librdkafka does after INVALID_TXN_STATE)."""

    def commit_transaction(self, timeout: float) -> None:
        raise ClientFailure("INVALID_TXN_STATE", fatal=True)

    def abort_transaction(self, timeout: float) -> None:
        raise ClientFailure("TRANSACTION_ABORTABLE", txn_requires_abort=True)


def test_a_fatal_client_error_marks_the_client_for_retirement() -> None:
    broke: list[bool] = []
    producer = guarded(_FencedProducer(), lambda: broke.append(True))
    with pytest.raises(ClientFailure, match="TRANSACTION_ABORTABLE"):
        producer.abort_transaction(1.0)
    assert broke == []  # an abortable error leaves the client usable
    with pytest.raises(ClientFailure, match="INVALID_TXN_STATE"):
        producer.commit_transaction(1.0)
    assert broke == [True]  # the worker replaces this process's clients after the operation



def test_a_client_failure_passes_through_a_context_manager_as_itself() -> None:
    """contextlib sets a propagating exception's __traceback__ by assignment: a frozen ClientFailure
    came out of a test's `with` block as FrozenInstanceError instead of the client's DeadlineExceeded."""
    from contextlib import contextmanager

    @contextmanager
    def cleaning_up():
        yield

    failure = ClientFailure("DeadlineExceeded", retriable=True)
    with pytest.raises(ClientFailure, match="DeadlineExceeded") as raised, cleaning_up():
        raise failure
    assert raised.value is failure and raised.value.__traceback__ is not None
    assert failure == ClientFailure("DeadlineExceeded", retriable=True)
    assert len({failure, ClientFailure("DeadlineExceeded", retriable=True)}) == 1  # hashed by its fields


def test_a_kept_failure_does_not_keep_a_closed_producer_alive():
    # A retired process's failure stays in the history; its traceback must not
    # hold the librdkafka handle, which would go on reconnecting for the rest
    # of the run (and of the test session) to a proxy that is gone.
    import gc

    import confluent_kafka

    unreachable = {"bootstrap.servers": "127.0.0.1:9", "transactional.id": "kept-failure",
                   "socket.connection.setup.timeout.ms": 1000, "log_level": 0}
    producer = guarded(confluent.ConfluentProducer(unreachable))
    handle_id = id(producer.unwrapped._p)
    with pytest.raises(ClientFailure) as kept:
        producer.init_transactions(0.5)
    producer.close(False, 0)
    del producer
    gc.collect()
    assert kept.value.name == "_TIMED_OUT"
    assert not [o for o in gc.get_objects() if isinstance(o, confluent_kafka.Producer) and id(o) == handle_id]


# --------------------------------------------------------------------------- aiokafka
# aiokafka's own exception classes, raised as aiokafka raises them, through the adapter's mapping
# and the workload's rules.


def _aiokafka_task_death(cause: BaseException, wrapper: str = "Unexpected error during batch delivery") -> BaseException:
    """What aiokafka raises once a background task died of `cause`: its producer's sender routine
    (sender.py) by default."""
    try:
        try:
            raise cause
        except Exception as exc:
            raise aerr.KafkaError(wrapper) from exc
    except aerr.KafkaError as wrapped:
        return wrapped


def _in_txn(failure: ClientFailure):
    return classify_in_txn(failure, aborted=False)


def _commit(failure: ClientFailure):
    return classify_commit(failure, aborted_after=False)


@pytest.mark.parametrize(
    ("raised", "enqueued", "classify", "name", "retriable", "fatal", "outcome"),
    [
        (aerr.RequestTimedOutError(), True, classify_produce, "REQUEST_TIMED_OUT", True, False, "info"),
        (aerr.NotEnoughReplicasAfterAppendError(), True, classify_produce, "NOT_ENOUGH_REPLICAS_AFTER_APPEND", True,
         False, "info"),
        (aerr.OutOfOrderSequenceNumber(), True, classify_produce, "OUT_OF_ORDER_SEQUENCE_NUMBER", False, True, "info"),
        (aerr.MessageSizeTooLargeError(), True, classify_produce, "MESSAGE_SIZE_TOO_LARGE", False, False, "fail"),
        (aerr.TopicAuthorizationFailedError(), True, classify_produce, "TOPIC_AUTHORIZATION_FAILED", False, False,
         "fail"),
        # send() could not get buffer space in time: the record was never queued.
        (aerr.KafkaTimeoutError(), False, classify_produce, "KafkaTimeoutError", False, False, "fail"),
        (aerr.IllegalOperation("Can't send messages while not in transaction"), False, classify_produce,
         "IllegalOperation", False, False, "fail"),
        # aiokafka raises ProducerFenced for INVALID_PRODUCER_EPOCH too; Kafka's name is PRODUCER_FENCED.
        (aerr.ProducerFenced(), True, _commit, "PRODUCER_FENCED", False, True, "info"),
        (_aiokafka_task_death(aerr.InvalidTxnState()), True, _in_txn, "INVALID_TXN_STATE", False, True, "fail"),
        (_aiokafka_task_death(aerr.InvalidTxnState()), True, _commit, "INVALID_TXN_STATE", False, True, "info"),
        (aerr.ConcurrentTransactions(), True, _commit, "CONCURRENT_TRANSACTIONS", False, False, "info"),
        (aerr.GroupCoordinatorNotAvailableError(), True, classify_read, "COORDINATOR_NOT_AVAILABLE", True, False,
         "fail"),
        (aerr.ConsumerStoppedError(), True, classify_read, "ConsumerStoppedError", False, True, "fail"),
    ],
)
def test_aiokafka_errors_map_as_the_other_clients_do(raised, enqueued, classify, name, retriable, fatal,
                                                     outcome) -> None:
    failure = aiokafka_client.failure_from_exception(raised, enqueued=enqueued)
    assert (failure.name, failure.retriable, failure.fatal, failure.library_error) == (name, retriable, fatal, False)
    assert classify(failure).type == outcome


def test_aiokafka_errors_the_library_does_not_define_are_the_library_breaking() -> None:
    failure = aiokafka_client.failure_from_exception(AssertionError("Invalid state transition"))
    assert failure.library_error and classify_produce(failure).type == "info"
    # A consumer whose coordinator routine died of an internal assertion fails every poll from then on:
    # a definite failure of that poll, and a client to replace.
    died = _aiokafka_task_death(AssertionError(), "Unexpected error during coordination AssertionError()")
    failure = aiokafka_client.failure_from_exception(died)
    assert (failure.name, failure.fatal, failure.library_error) == ("AssertionError", True, False)
    assert classify_read(failure).type == "fail"


def test_aiokafka_takes_librdkafka_names_and_refuses_what_it_does_not_have() -> None:
    import ssl

    import certifi

    settings = aiokafka_client.aiokafka_settings
    assert settings({"enable.idempotence": "false", "linger.ms": "5", "batch.size": "1000",
                     "compression.codec": "none", "acks": "all", "sasl.username": "u"}, "producer") == {
        "enable_idempotence": False, "linger_ms": 5, "max_batch_size": 1000, "compression_type": None,
        "acks": "all", "sasl_plain_username": "u"}
    assert settings({"fetch.wait.max.ms": "50", "max_poll_records": "7", "isolation.level": "read_uncommitted"},
                    "consumer") == {"fetch_max_wait_ms": 50, "max_poll_records": 7,
                                    "isolation_level": "read_uncommitted"}
    secured = settings({"security.protocol": "SSL", "ssl.ca.location": certifi.where()}, "admin")
    assert secured["security_protocol"] == "SSL" and isinstance(secured["ssl_context"], ssl.SSLContext)
    with pytest.raises(ValueError, match="aiokafka's producer has no setting 'delivery.timeout.ms'"):
        settings({"delivery.timeout.ms": "1000"}, "producer")
    # Refused before any client exists: the admin client takes every --client-config setting too.
    with pytest.raises(ValueError, match="aiokafka's admin has no setting 'isolation.level'"):
        aiokafka_client.AiokafkaFactory("127.0.0.1:9", {}, {}, {"isolation.level": "read_committed"})


def test_tansu_refuses_aiokafkas_producer_id_and_the_refused_clients_leave_nothing_running(broker, tmp_path) -> None:
    # Tansu 0.6 answers InitProducerId v0, the only version aiokafka sends, with UNKNOWN_SERVER_ERROR
    # (its log: producer=None epoch=None): no idempotent aiokafka producer starts there (docs/brokers.md).
    import threading

    factory = aiokafka_client.AiokafkaFactory(broker.bootstrap, {}, {})
    with pytest.raises(ClientFailure) as refused:
        factory.producer("aiokafka-tansu-idempotent", None)  # starts at once: a client that cannot, is not made
    assert (refused.value.name, refused.value.retriable, refused.value.library_error) == ("UNKNOWN", False, False)
    producer = factory.producer("aiokafka-tansu-txn", "tx-aiokafka-tansu")
    with pytest.raises(ClientFailure, match="UNKNOWN"):
        producer.init_transactions(5)
    producer.close(False, 0)  # what the worker does with a process that could not open its clients
    assert not [t.name for t in threading.enumerate() if t.name.startswith("aiokafka-aiokafka-tansu")]
    # A run whose processes never open their clients says so, instead of leaving an empty history behind.
    with pytest.raises(WorkloadError, match="no usable history"):
        run_workload(quick_config(broker.bootstrap, client="aiokafka", txn=True, ops=3), tmp_path / "h.jsonl",
                     progress=False)
