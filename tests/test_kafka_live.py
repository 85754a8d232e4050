"""Apache Kafka itself behind the proxy: the torn transaction with and without KIP-890 part 2.

One single-node Kafka (the default version, transaction.version=2) serves
every test here. librdkafka has no KIP-890 support: its stale EndTxn commits
the next transaction halfway (KAFKA-17754). Kafka's Java client speaks
transaction version 2, so the broker bumps the epoch at every EndTxn and
fences the stale copy. Both facts are read from the wire (a records-level
trace), not from what the clients believe.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import sys
import time
import uuid
from functools import partial
from pathlib import Path

import pytest

from kproxy.brokers import free_port, wait_for_port
from kproxy.brokers.identify import identify
from kproxy.brokers.kafka import KafkaBroker
from kproxy.demo import run_demo
from kproxy.proxy_process import running_proxy
from kproxy.workload.clients.aiokafka_client import AiokafkaFactory
from kproxy.workload.clients.bridge import BridgeFactory
from kproxy.workload.clients.franz_go import FranzGoFactory
from kproxy.workload.clients.java import JavaFactory
from kproxy.workload.config import WorkloadConfig
from kproxy.workload.errors import ClientFailure
from kproxy.workload.history import read_history, validate_history
from kproxy.workload.runner import run_workload
from tests.fixtures.broker import create_topic
from tests.scenario_clients import fates, hazards, read_partition, send, trace_events, transactional_producer, wire_log
from tests.test_franz_go import RULES as TORN_RULES
from tests.test_franz_go import assert_fenced, assert_valid_with_deleted_output_set_aside, quick_txn_etl
from tests.test_workload import check_history, final_reads_cover_every_acknowledged_send

RULES = str(Path(__file__).parent.parent / "rules" / "torn-transaction.yaml")
RULE_ID = "stale-commit-into-next-txn"
GAP_S = 0.5
PRODUCER_FENCED = 90
CONCURRENT_TRANSACTIONS = 51
ATTEMPTS = 3

pytestmark = pytest.mark.timeout(180)


def _confluent_two_transactions(bootstrap: str, topic: str) -> None:
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    assert all(d.ok for d in send(producer, topic, ["t1-a", "t1-b"]))
    producer.commit_transaction(10)
    producer.begin_transaction()
    send(producer, topic, ["t2-early"])
    time.sleep(GAP_S)
    send(producer, topic, ["t2-late"])  # refused when the stale commit already ended transaction 2
    try:
        producer.abort_transaction(10)
    except Exception:
        pass  # the broker no longer has the transaction the client aborts


def _two_transactions(factory_class: type[BridgeFactory], bootstrap: str, topic: str) -> None:
    """Commit one transaction, abort the next, through a client in a bridge process (java, franz-go, sarama)."""
    factory = factory_class(bootstrap, {}, {})
    try:
        producer = factory.producer(f"{factory.name}-{topic}", f"tx-{topic}")
        producer.init_transactions(10)

        def sent(value: str) -> None:
            delivery = producer.send(topic, 0, b"k", value.encode())
            producer.flush(10)
            assert delivery.done and delivery.failure is None, (value, delivery.failure)

        producer.begin_transaction()
        sent("t1-a")
        sent("t1-b")
        producer.commit_transaction(10)
        producer.begin_transaction()
        sent("t2-early")
        time.sleep(GAP_S)
        sent("t2-late")
        producer.abort_transaction(10)
        producer.close(True, 5)
    finally:
        factory.close()


def _run(kafka: KafkaBroker, tmp_path: Path, client, *extra: str):
    topic = f"t-{uuid.uuid4().hex[:10]}"
    traces = tmp_path / topic
    tmp_path.mkdir(parents=True, exist_ok=True)
    create_topic(kafka.bootstrap, topic)
    with running_proxy(kafka.bootstrap, "--rules", RULES, "--traces", str(traces), "--trace-level", "records",
                       *extra, log_path=tmp_path / f"{topic}.log") as proxy:
        client(proxy.bootstrap, topic)
        read_partition(proxy.bootstrap, topic, want=3)  # the Fetch responses carry the markers into the trace
        seen = hazards(proxy)
    events = trace_events(traces)
    (copy,) = [e for e in events if e["api"] == "end_txn" and e["direction"] == "request" and e["copy"] == 1]
    replies = [e for e in events if e["api"] == "end_txn" and e["direction"] == "response" and e["copy"] == 1]
    return seen, fates(wire_log(events, topic)), copy, replies


# Here rather than in test_brokers.py beside the embedded kinds: the suite
# runs whole files on two workers, and a second file asking for the session's
# Kafka would start a second Kafka (a JVM, 10-20 s) on the other worker.
def test_the_wire_tells_apache_kafka_and_its_transaction_version(kafka_broker: KafkaBroker) -> None:
    who = identify(kafka_broker.bootstrap)
    assert who.software == "Apache Kafka" and who.nodes == 1
    assert who.features["metadata.version"] > 0
    assert "transaction.version=" in who.basis  # 4.x: the feature that decides whether a stale EndTxn is fenced


# aiokafka's two transactions are defined below, with its other tests.
@pytest.mark.parametrize("client", ["librdkafka", "aiokafka"])
def test_clients_without_transaction_version_2_are_torn_on_kafka(kafka_broker: KafkaBroker, tmp_path: Path,
                                                                 client: str) -> None:
    two_transactions = {"librdkafka": _confluent_two_transactions, "aiokafka": _aiokafka_two_transactions}[client]
    for attempt in range(ATTEMPTS):
        seen, fate, copy, replies = _run(kafka_broker, tmp_path / str(attempt), two_transactions)
        if fate.get("t2-early") is not None:
            break  # otherwise the copy reached the broker before transaction 2's first record: run again
    # Below EndTxn v5 Kafka handles the EndTxn with the old protocol, which cannot fence a stale copy.
    assert copy["api_version"] < 5
    assert seen["stale_end_txn"] == 1
    assert (copy["txn_client"], copy["txn_broker"], copy["rule"]) == (1, 2, RULE_ID)
    # Kafka accepted the stale commit: transaction 2's first record is committed though the client aborted.
    assert [r["error_code"] for r in replies] == [0]
    assert fate["t1-a"] == fate["t1-b"] == "commit"
    assert fate["t2-early"] == "commit"
    assert fate.get("t2-late") != "commit"


def test_guard_keeps_librdkafka_transaction_whole_on_kafka(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    seen, fate, copy, replies = _run(kafka_broker, tmp_path, _confluent_two_transactions, "--guard")
    assert copy["outcome"] == "refused" and not replies
    assert fate["t1-a"] == fate["t1-b"] == "commit"
    assert fate["t2-early"] == fate["t2-late"] == "abort"


def test_transaction_version_2_fences_the_stale_commit(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    assert kafka_broker.cluster is not None and kafka_broker.cluster.transaction_version == 2
    seen, fate, copy, replies = _run(kafka_broker, tmp_path, partial(_two_transactions, JavaFactory))
    # The copy still reached the broker, which refused it: the epoch moved on at the first commit.
    assert copy["rule"] == RULE_ID and copy["outcome"] == "ghost"
    assert [r["error_code"] for r in replies] == [PRODUCER_FENCED]
    assert seen["stale_end_txn"] == 0 and seen["fenced"] == 1
    assert fate == {"t1-a": "commit", "t1-b": "commit", "t2-early": "abort", "t2-late": "abort"}


def test_franz_go_speaks_transaction_version_2_and_kafka_fences_its_stale_commit(kafka_broker: KafkaBroker,
                                                                                 tmp_path: Path) -> None:
    seen, fate, copy, replies = _run(kafka_broker, tmp_path, partial(_two_transactions, FranzGoFactory))
    # franz-go chose KIP-890 part 2 by itself: EndTxn v5, and no AddPartitionsToTxn (Produce v12+ adds the partition).
    assert copy["api_version"] >= 5
    assert copy["rule"] == RULE_ID and copy["outcome"] == "ghost"
    # franz-go begins transaction 2 as soon as EndTxn returns, while Kafka may still be writing transaction 1's
    # markers: the first Produce of transaction 2 (which releases the copy) can be answered CONCURRENT_TRANSACTIONS
    # and retried. So Kafka refuses the copy (PRODUCER_FENCED), refuses it while it finishes transaction 1
    # (CONCURRENT_TRANSACTIONS), or takes it as a retry of transaction 1's commit (NONE); it never commits
    # transaction 2 with it, which the fates show.
    assert [r["error_code"] for r in replies] in ([PRODUCER_FENCED], [CONCURRENT_TRANSACTIONS], [0])
    assert seen["stale_end_txn"] == 0 and seen["fenced"] == 1
    assert fate == {"t1-a": "commit", "t1-b": "commit", "t2-early": "abort", "t2-late": "abort"}


def test_franz_go_commits_offsets_in_a_transaction_without_records(kafka_broker: KafkaBroker) -> None:
    """franz-go ends only transactions it produced in; the program ends one that holds offsets alone."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    create_topic(kafka_broker.bootstrap, topic)
    factory = FranzGoFactory(kafka_broker.bootstrap, {}, {})
    # A bound, not a wait: a first commit on a loaded machine once took franz-go past 10 s (DeadlineExceeded).
    bound = 30
    try:
        producer = factory.producer(f"p-{topic}", f"tx-{topic}")
        producer.init_transactions(bound)
        consumer = factory.consumer(f"c-{topic}", f"g-{topic}")
        consumer.assign([(topic, 0)])
        producer.begin_transaction()
        first = producer.send(topic, 0, b"k", b"v1")
        producer.commit_transaction(bound)
        assert first.offset == 0
        deadline = time.monotonic() + 10
        while not consumer.poll(10, 0.5) and time.monotonic() < deadline:
            pass
        producer.begin_transaction()  # offsets only: committed, and the producer goes on (a new epoch under TV2)
        producer.send_offsets_to_transaction(consumer.positions(), consumer, bound)
        producer.commit_transaction(bound)
        assert consumer.committed([(topic, 0)], 10) == {(topic, 0): 1}
        producer.begin_transaction()
        second = producer.send(topic, 0, b"k", b"v2")
        producer.commit_transaction(bound)
        assert second.failure is None and second.offset == 2  # offset 1 is the first commit's marker
        producer.begin_transaction()  # offsets only, aborted: nothing moves
        producer.send_offsets_to_transaction({(topic, 0): 3}, consumer, bound)
        producer.abort_transaction(bound)
        assert consumer.committed([(topic, 0)], 10) == {(topic, 0): 1}
    finally:
        factory.close()


# The clients that run in a bridge process (the Go ones built by `make go-clients`): a short transactional run each.
@pytest.mark.parametrize("client", ["java", "franz-go", "sarama"])
def test_bridge_client_workload_through_the_proxy(kafka_broker: KafkaBroker, tmp_path: Path, client: str) -> None:
    history = tmp_path / "history.jsonl"
    with running_proxy(kafka_broker.bootstrap, log_path=tmp_path / "kproxy.log") as proxy:
        summary = run_workload(WorkloadConfig(bootstrap=proxy.bootstrap, client=client, txn=True,
                                              abort_probability=0.3, ops=60, duration=None, seed=3,
                                              crash_probability=0.05), history, progress=False)
    stats = validate_history(history)
    assert summary.final_reads_caught_up
    assert summary.completions.get("ok", 0) >= 30
    assert stats.by_type["invoke"] >= 60
    text = history.read_text()
    assert '"f":"txn"' in text and '"type":"fail","f":"txn"' in text  # committed and aborted transactions


# aiokafka runs here rather than on the embedded brokers: Tansu 0.6 answers its InitProducerId v0 with
# UNKNOWN_SERVER_ERROR, so no idempotent aiokafka producer starts there, and noida-db answers a Fetch at once
# instead of waiting, so its consumers fetch in a tight loop (docs/workload.md).


def _aiokafka_sent(producer, topic: str, value: str):
    delivery = producer.send(topic, 0, b"k", value.encode())
    producer.flush(10)
    return delivery


def _aiokafka_two_transactions(bootstrap: str, topic: str) -> None:
    factory = AiokafkaFactory(bootstrap, {}, {})
    producer = factory.producer(f"aiokafka-{topic}", f"tx-{topic}")
    try:
        producer.init_transactions(10)
        producer.begin_transaction()
        assert all(_aiokafka_sent(producer, topic, v).offset is not None for v in ("t1-a", "t1-b"))
        producer.commit_transaction(10)
        producer.begin_transaction()
        _aiokafka_sent(producer, topic, "t2-early")
        time.sleep(GAP_S)
        _aiokafka_sent(producer, topic, "t2-late")  # refused when the stale commit already ended transaction 2
        try:
            producer.abort_transaction(10)
        except ClientFailure:
            pass  # INVALID_TXN_STATE: the broker no longer has the transaction the client aborts
    finally:
        producer.close(True, 5)
        factory.close()


def test_aiokafka_transactions_through_the_proxy(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    """Commit, abort, commit with offsets: a read_committed aiokafka consumer reads what was committed, only."""
    topic = f"t-{uuid.uuid4().hex[:10]}"
    traces = tmp_path / "traces"
    with running_proxy(kafka_broker.bootstrap, "--traces", str(traces), "--trace-level", "records",
                       log_path=tmp_path / "kproxy.log") as proxy:
        factory = AiokafkaFactory(proxy.bootstrap, {}, {})
        try:
            factory.create_topics([(topic, 1)], 10)
            producer = factory.producer("aiokafka-p", f"tx-{topic}")
            consumer = factory.consumer("aiokafka-c", f"g-{topic}")
            producer.init_transactions(10)
            for values, commit in ((("a", "b"), True), (("aborted",), False)):
                producer.begin_transaction()
                for value in values:
                    assert _aiokafka_sent(producer, topic, value).offset is not None
                (producer.commit_transaction if commit else producer.abort_transaction)(10)
            consumer.assign([(topic, 0)])
            read: list = []

            def read_until(count: int) -> None:
                deadline = time.monotonic() + 10
                while len(read) < count and time.monotonic() < deadline:
                    read.extend(consumer.poll(100, 0.5))

            read_until(2)
            assert [(r.offset, r.value) for r in read] == [(0, b"a"), (1, b"b")]
            # Consume-transform-produce: the next transaction carries the consumer's offsets.
            producer.begin_transaction()
            _aiokafka_sent(producer, topic, "c")
            producer.send_offsets_to_transaction(consumer.positions(), consumer, 10)
            producer.commit_transaction(10)
            read_until(3)
            assert [r.value for r in read] == [b"a", b"b", b"c"]  # never the aborted record, nor a marker
            producer.close(True, 5)
            consumer.close(True, 5)
        finally:
            factory.close()
    requests = [e for e in trace_events(traces) if e["direction"] == "request" and e["client_id"] == "aiokafka-p"]
    versions = {api: {e["api_version"] for e in requests if e["api"] == api}
                for api in ("init_producer_id", "add_partitions_to_txn", "txn_offset_commit", "end_txn")}
    # The first versions only: no transaction version 2 (EndTxn v5) whatever the broker offers.
    assert versions == {"init_producer_id": {0}, "add_partitions_to_txn": {0}, "txn_offset_commit": {0},
                        "end_txn": {0}}
    end_txns = [e for e in requests if e["api"] == "end_txn"]
    assert [e["end_txn_commit"] for e in end_txns] == [True, False, True]
    assert len({e["producer_epoch"] for e in end_txns}) == 1  # the epoch never moves at a commit or an abort


def test_aiokafka_workload_through_the_proxy(kafka_broker: KafkaBroker, tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    with running_proxy(kafka_broker.bootstrap, log_path=tmp_path / "kproxy.log") as proxy:
        summary = run_workload(WorkloadConfig(bootstrap=proxy.bootstrap, client="aiokafka", txn=True,
                                              abort_probability=0.3, ops=40, duration=None, seed=3,
                                              crash_probability=0.05), history, progress=False)
    validate_history(history)
    assert summary.final_reads_caught_up
    ops = list(read_history(history))
    txns = [op for op in ops if op.f == "txn" and op.type != "invoke"]
    assert any(op.type == "ok" for op in txns) and any(op.error == "aborted" for op in txns)
    check_history(ops, concurrency=3)
    final_reads_cover_every_acknowledged_send(ops)



@pytest.mark.spark
@pytest.mark.timeout(300)  # the session's first analysis also warms Spark up
def test_the_analysis_finds_kafka_fencing_the_stale_commit_for_the_java_client(kafka_broker: KafkaBroker, spark,
                                                                               tmp_path: Path) -> None:
    result = run_demo("torn-transaction", tmp_path, bootstrap=kafka_broker.bootstrap, client="java", duration=6,
                      spark=spark, say=lambda line: None, progress=False)
    report = result.report
    assert report["broker"]["software"] == "Apache Kafka"
    stale = report["anomalies"].get("stale-end-txn", [])
    assert stale, "the rule copied no EndTxn"
    answers = {case["response_error_code"] for case in stale}
    assert 0 not in answers, "Kafka accepted a stale commit"  # every copy was refused
    assert PRODUCER_FENCED in answers
    for name in ("torn-transaction", "client-outcome-mismatch", "G1a"):
        assert report["counts"][name] == 0, name


# Neither librdkafka nor Sarama (EndTxn v3 at most) speaks transaction version 2: Kafka 4.4.0 with
# transaction.version=2 still takes their stale commits.
@pytest.mark.spark
@pytest.mark.timeout(300)
@pytest.mark.parametrize("client", ["confluent-kafka", "sarama"])
def test_the_analysis_blames_the_rule_for_a_torn_transaction_on_kafka(kafka_broker: KafkaBroker, spark,
                                                                     tmp_path: Path, client: str) -> None:
    for seed in (1, 2):  # the stale copy races the next transaction: a run may miss it; another seed does not
        result = run_demo("torn-transaction", tmp_path / str(seed), bootstrap=kafka_broker.bootstrap, duration=6,
                          client=client, seed=seed, spark=spark, say=lambda line: None, progress=False)
        if result.report["counts"]["torn-transaction"]:
            break
    report = result.report
    assert report["counts"]["torn-transaction"] >= 1
    impact = {(i["rule"], i["anomaly"]): i["cases"] for i in report["stats"]["fault_impact"]}
    assert impact.get((RULE_ID, "torn-transaction"), 0) >= 1
    accepted = [c for c in report["anomalies"]["stale-end-txn"] if c["response_error_code"] == 0]
    assert accepted, "Kafka accepted no stale commit"


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_a_passing_txn_etl_is_valid(kgo_test_binary: Path, kafka_broker: KafkaBroker, spark, tmp_path: Path):
    """franz-go's own exactly-once test (tests/test_franz_go.py), short, rule-free: valid, with the output it
    deleted unread set aside."""
    run = quick_txn_etl(kgo_test_binary, kafka_broker.bootstrap, tmp_path / "out")
    assert run.command_returncode == 0, run.output[-3000:]
    assert run.verdict.by_rule == {}
    assert set(run.requests["end_txn"]) == {5} and set(run.requests["txn_offset_commit"]) == {6}
    assert_valid_with_deleted_output_set_aside(run)


@pytest.mark.spark
@pytest.mark.timeout(400)
def test_transaction_version_2_fences_the_stale_commits_of_txn_etl(kgo_test_binary: Path, kafka_broker: KafkaBroker,
                                                                     spark, tmp_path: Path):
    """The same under the torn-transaction rule: Kafka fences every stale copy, nothing is torn."""
    run = quick_txn_etl(kgo_test_binary, kafka_broker.bootstrap, tmp_path / "out", rules=TORN_RULES)
    if not run.second_txns:
        # 500 records are one transaction of the source producer (it commits every 10,000), and an ETL
        # level that reads them in one poll commits them in one: then no producer begins the second
        # transaction that releases the rule's held copy, and there is nothing to fence (seen once in a
        # suite run: eleven producers, one transaction each). The run is tried again, once.
        run = quick_txn_etl(kgo_test_binary, kafka_broker.bootstrap, tmp_path / "again", rules=TORN_RULES)
    assert run.second_txns, "two runs in which no producer began a second transaction"
    assert run.command_returncode == 0, run.output[-3000:]
    assert_fenced(run)
    assert_valid_with_deleted_output_set_aside(run)


def test_sigterm_while_kafka_starts_stops_what_was_started(tmp_path: Path) -> None:
    port = free_port()
    cmd = [sys.executable, "-m", "kproxy", "broker", "--kind", "kafka", "--port", str(port),
           "--log-file", str(tmp_path / "broker.log")]
    process = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        wait_for_port("127.0.0.1", port, 120, process)  # the JVM listens before the cluster is ready
    finally:
        process.send_signal(signal.SIGTERM)
        output, _ = process.communicate(timeout=60)
    assert process.returncode == 0, output
    assert (tmp_path / "kafka" / "node-1" / "kafka.log").stat().st_size > 0  # the node's log, under the run's directory
    with pytest.raises(OSError):  # nothing is left listening: the node was stopped, not orphaned
        socket.create_connection(("127.0.0.1", port), timeout=1).close()
