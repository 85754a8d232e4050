"""The workload survives its client library: an error the adapter does not know ends one operation `info`.

confluent-kafka's flush() turns an exception inside a delivery callback into
`SystemError: _PyErr_SetObject: exception ... is not a BaseException
subclass` (the ambiguous-not-leader and spurious-zero-offset demos stopped on
it). Here the real client produces that SystemError: the delivery callback is
replaced by one that compares an offset of None, as the adapter once did.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kproxy.workload.clients import confluent
from kproxy.workload.clients.guard import guarded
from kproxy.workload.errors import ClientFailure
from kproxy.workload.history import read_history, validate_history
from kproxy.workload.runner import run_workload
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
