"""The queue workload against the real Tansu broker, with real clients."""

from __future__ import annotations

import random
from collections import defaultdict
from pathlib import Path

import pytest
from click.testing import CliRunner

from kproxy.cli import main
from kproxy.workload.config import WorkloadConfig
from kproxy.workload.errors import (
    ClientFailure,
    classify_commit,
    classify_in_txn,
    classify_produce,
    classify_read,
)
from kproxy.workload.history import Op, read_history, validate_history
from kproxy.workload.plan import OpBudget, plan_op
from kproxy.workload.runner import run_workload

pytestmark = pytest.mark.timeout(120)


def quick_config(bootstrap: str, **overrides) -> WorkloadConfig:
    settings = dict(bootstrap=bootstrap, concurrency=3, duration=None, ops=45, seed=7, key_count=3,
                    max_writes_per_key=12, crash_probability=0.05, final_reads_timeout=8.0)
    settings.update(overrides)
    return WorkloadConfig(**settings)


def check_history(ops: list[Op], concurrency: int) -> None:
    """Invariants every workload history keeps, beyond the per-line format."""
    created = {op.value[0]: (op.value[1], op.value[2]) for op in ops if op.f == "create"}
    retired: set[int] = set()
    for op in ops:
        assert op.process not in retired, f"retired process {op.process} ran op {op.index}"
        if op.type == "info":
            retired.add(op.process)
            assert op.process + concurrency not in retired
        if op.f in ("send", "txn") and op.type == "invoke":
            for mop in op.value:
                if mop[0] == "send":
                    assert mop[1] in created, f"op {op.index} sends to key {mop[1]} before its create"
        if op.type == "ok" and op.f in ("send", "txn"):
            for mop in op.value:
                if mop[0] == "send":
                    assert isinstance(mop[2], list), f"ok op {op.index} has a send without an offset"


def final_reads_cover_every_acknowledged_send(ops: list[Op]) -> None:
    final_process = max(op.process for op in ops)
    read: dict[int, set[tuple[int, int]]] = defaultdict(set)
    for op in ops:
        if op.process == final_process and op.f == "poll" and op.type == "ok":
            for k, pairs in op.value[0][1].items():
                read[int(k)].update(map(tuple, pairs))
    final_assign = next(op for op in ops if op.process == final_process and op.f == "assign" and op.type == "ok")
    assert set(final_assign.value) == {op.value[0] for op in ops if op.f == "create"}
    acknowledged = [(mop[1], tuple(mop[2])) for op in ops if op.type == "ok" and op.f in ("send", "txn")
                    for mop in op.value if mop[0] == "send"]
    assert acknowledged, "the run acknowledged no send"
    missing = [(k, pair) for k, pair in acknowledged if pair not in read[k]]
    assert not missing, f"final reads missed acknowledged sends {missing[:5]}"


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_non_transactional_run(broker, tmp_path: Path, client: str) -> None:
    path = tmp_path / "history.jsonl"
    summary = run_workload(quick_config(broker.bootstrap, client=client), path, progress=False)
    assert summary.final_reads_caught_up and summary.lagging_keys == ()
    stats = validate_history(path)
    ops = list(read_history(path))
    assert summary.invocations == 45
    assert {op.f for op in ops} >= {"create", "assign", "send", "poll"}
    assert "txn" not in {op.f for op in ops}
    check_history(ops, concurrency=3)
    final_reads_cover_every_acknowledged_send(ops)
    assert summary.processes == stats.processes


@pytest.mark.parametrize("client", ["confluent-kafka", "kafka-python"])
def test_transactional_run_with_aborts(broker, tmp_path: Path, client: str) -> None:
    path = tmp_path / "history.jsonl"
    config = quick_config(broker.bootstrap, client=client, txn=True, abort_probability=0.3, ops=30)
    summary = run_workload(config, path, progress=False)
    assert summary.final_reads_caught_up
    validate_history(path)
    ops = list(read_history(path))
    txns = [op for op in ops if op.f == "txn" and op.type != "invoke"]
    aborted = [op for op in txns if op.type == "fail" and op.error == "aborted"]
    assert aborted and any(op.type == "ok" for op in txns)
    assert {op.f for op in ops if op.type == "invoke"} <= {"txn", "assign", "crash", "poll"}
    check_history(ops, concurrency=3)
    final_reads_cover_every_acknowledged_send(ops)


def _next_positions_after_aborts(ops: list[Op]) -> list[tuple[int, int]]:
    """(last offset an aborted txn polled, first offset the same process polled next) per key."""
    pairs = []
    pending: dict[tuple[int, str], int] = {}  # (process, key) -> last offset polled in an aborted txn
    for op in ops:
        if op.f != "txn" or op.type == "invoke":
            continue
        polls = [mop[1] for mop in op.value if mop[0] == "poll" and len(mop) == 2]
        for polled in polls:
            for key, records in polled.items():
                if records and (op.process, key) in pending:
                    pairs.append((pending.pop((op.process, key)), records[0][0]))
        if op.type == "fail" and op.error == "aborted":
            for polled in polls:
                for key, records in polled.items():
                    if records:
                        pending[(op.process, key)] = records[-1][0]
    return pairs


@pytest.mark.parametrize("rewind", [False, True])
def test_rewind_on_abort_moves_the_consumer_back(broker, tmp_path: Path, rewind: bool) -> None:
    path = tmp_path / "history.jsonl"
    config = quick_config(broker.bootstrap, txn=True, abort_probability=0.5, rewind_on_abort=rewind,
                          concurrency=1, key_count=1, max_writes_per_key=1000, crash_probability=0.0,
                          reassign_probability=0.0, ops=20, max_txn_length=3, poll_timeout=0.2, seed=3)
    run_workload(config, path, progress=False)
    pairs = _next_positions_after_aborts(list(read_history(path)))
    assert pairs, "no poll followed an aborted txn that had read records"
    if rewind:
        assert all(nxt <= last for last, nxt in pairs), pairs
    else:
        assert all(nxt > last for last, nxt in pairs), pairs


def test_plans_are_fixed_by_the_seed() -> None:
    config = WorkloadConfig(bootstrap="unused:9092", txn=True, abort_probability=0.3, crash_probability=0.1)
    plans = lambda seed: [plan_op(random.Random(seed), config) for _ in range(50)]  # noqa: E731
    assert plans("1:0") == plans("1:0")
    assert plans("1:0") != plans("2:0")
    kinds = {p.kind for p in plans("1:0")}
    assert kinds <= {"txn", "assign", "crash"} and "txn" in kinds


def test_the_duration_counts_from_the_first_open_clients() -> None:
    now = [0.0]
    budget = OpBudget(None, 4.0, lambda: now[0], open_grace=10.0)
    now[0] = 9.0  # opening took longer than the whole duration
    assert budget.take()
    budget.opened()
    now[0] = 12.9
    assert budget.take()
    budget.opened()  # a later worker's open does not move the deadline
    now[0] = 13.0
    assert not budget.take() and budget.stopped


def test_opening_that_never_succeeds_ends_the_run() -> None:
    now = [0.0]
    budget = OpBudget(3, 4.0, lambda: now[0], open_grace=10.0)
    now[0] = 13.9
    assert budget.take()
    now[0] = 14.0
    assert not budget.take()


def test_config_refuses_contradictions() -> None:
    with pytest.raises(ValueError, match="transactional"):
        WorkloadConfig(bootstrap="b:1", abort_probability=0.5)
    with pytest.raises(ValueError, match="bound"):
        WorkloadConfig(bootstrap="b:1", duration=None, ops=None)
    with pytest.raises(ValueError, match="client"):
        WorkloadConfig(bootstrap="b:1", client="no-such-client")


@pytest.mark.parametrize(
    ("classify", "failure", "expected"),
    [
        (classify_produce, ClientFailure("_MSG_TIMED_OUT", retriable=True), "info"),
        (classify_produce, ClientFailure("REQUEST_TIMED_OUT", retriable=True), "info"),
        (classify_produce, ClientFailure("NOT_ENOUGH_REPLICAS_AFTER_APPEND", retriable=True), "info"),
        (classify_produce, ClientFailure("OUT_OF_ORDER_SEQUENCE_NUMBER", fatal=True), "info"),
        (classify_produce, ClientFailure("_QUEUE_FULL", retriable=True, enqueued=False), "fail"),
        (classify_produce, ClientFailure("TOPIC_AUTHORIZATION_FAILED"), "fail"),
        (classify_produce, ClientFailure("MSG_SIZE_TOO_LARGE"), "fail"),
        (lambda f: classify_in_txn(f, aborted=True), ClientFailure("_MSG_TIMED_OUT", retriable=True), "fail"),
        (lambda f: classify_in_txn(f, aborted=False), ClientFailure("INVALID_TXN_STATE"), "fail"),
        (lambda f: classify_in_txn(f, aborted=False), ClientFailure("PRODUCER_FENCED", fatal=True), "info"),
        (lambda f: classify_commit(f, aborted_after=True),
         ClientFailure("_MSG_TIMED_OUT", txn_requires_abort=True), "fail"),
        (lambda f: classify_commit(f, aborted_after=False),
         ClientFailure("_MSG_TIMED_OUT", txn_requires_abort=True), "info"),
        (lambda f: classify_commit(f, aborted_after=False), ClientFailure("_TIMED_OUT", retriable=True), "info"),
        (lambda f: classify_commit(f, aborted_after=False), ClientFailure("PRODUCER_FENCED", fatal=True), "info"),
        (classify_read, ClientFailure("UNKNOWN_TOPIC_OR_PART", retriable=True), "fail"),
    ],
)
def test_error_classification(classify, failure: ClientFailure, expected: str) -> None:
    outcome = classify(failure)
    assert outcome.type == expected
    assert outcome.error == failure.name


def test_workload_command(broker, tmp_path: Path) -> None:
    path = tmp_path / "cli.jsonl"
    result = CliRunner().invoke(main, [
        "workload", "--bootstrap", broker.bootstrap, "--history", str(path), "--ops", "15", "--concurrency", "2",
        "--seed", "5", "--no-progress", "--producer-config", "linger.ms=1", "--consumer-config",
        "fetch.wait.max.ms=50", "--final-reads-timeout", "5",
    ])
    assert result.exit_code == 0, result.output
    assert "15 operations" in result.output
    assert validate_history(path).ops > 30


def test_workload_command_rejects_bad_settings(broker, tmp_path: Path) -> None:
    args = ["workload", "--bootstrap", broker.bootstrap, "--history", str(tmp_path / "h.jsonl"), "--ops", "5"]
    result = CliRunner().invoke(main, [*args, "--producer-config", "linger.ms"])
    assert result.exit_code == 2 and "KEY=VALUE" in result.output
    result = CliRunner().invoke(main, [*args, "--abort-probability", "0.5"])
    assert result.exit_code == 2 and "transactional" in result.output
    result = CliRunner().invoke(main, [*args, "--no-progress", "--producer-config", "no.such.setting=1"])
    assert result.exit_code == 2 and "the workload stopped" in result.output
    # aiokafka's adapter checks every setting before a client exists.
    result = CliRunner().invoke(main, [*args, "--client", "aiokafka", "--producer-config", "delivery.timeout.ms=1"])
    assert result.exit_code == 2 and "aiokafka's producer has no setting 'delivery.timeout.ms'" in result.output


def test_a_dead_broker_is_refused_before_any_client_starts(tmp_path: Path) -> None:
    from kproxy.brokers import free_port
    from kproxy.workload.runner import WorkloadError

    dead = f"127.0.0.1:{free_port()}"
    with pytest.raises(WorkloadError, match=rf"cannot reach the broker at {dead} \({dead}: Connection refused\)"):
        run_workload(WorkloadConfig(bootstrap=dead, ops=5), tmp_path / "h.jsonl", progress=False)
    assert not (tmp_path / "h.jsonl").exists()
    result = CliRunner().invoke(main, ["workload", "--bootstrap", dead, "--duration", "1",
                                       "--history", str(tmp_path / "h.jsonl")])
    assert result.exit_code != 0 and f"cannot reach the broker at {dead}" in result.output
    assert "Traceback" not in result.output
