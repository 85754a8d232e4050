"""The torn transaction (KAFKA-17754), reproduced with real clients through the proxy.

A transactional producer commits transaction 1, then writes one record of
transaction 2, waits, writes another and aborts. `rules/torn-transaction.yaml`
holds a copy of transaction 1's commit until transaction 2 has sent its first
records; the copy then commits transaction 2 halfway. The fate of each record
is read from the transaction markers the broker wrote, as the Fetch responses
carried them (a records-level trace): Tansu hands aborted records to
read_committed consumers, so what a consumer returns cannot tell the fates apart.

With `--guard` the stale copy is refused and transaction 2 stays whole.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest

from kproxy.brokers import EmbeddedBroker
from tests.fixtures.broker import create_topic
from tests.fixtures.proxy import metric_value
from tests.scenario_clients import (
    fates,
    hazards,
    read_partition,
    rule_counters,
    send,
    trace_events,
    transactional_producer,
    wire_log,
)

RULES = str(Path(__file__).parent.parent / "rules" / "torn-transaction.yaml")
RULE_ID = "stale-commit-into-next-txn"
# Long enough for the held commit copy to reach the broker between the two records of transaction 2.
GAP_S = 0.5

pytestmark = pytest.mark.timeout(60)


def _run_two_transactions_confluent(bootstrap: str, topic: str) -> None:
    producer = transactional_producer(bootstrap)
    producer.begin_transaction()
    assert all(d.ok for d in send(producer, topic, ["t1-a", "t1-b"]))
    producer.commit_transaction(10)
    producer.begin_transaction()
    assert all(d.ok for d in send(producer, topic, ["t2-early"]))
    time.sleep(GAP_S)
    assert all(d.ok for d in send(producer, topic, ["t2-late"]))
    producer.abort_transaction(10)


def _run_two_transactions_kafka_python(bootstrap: str, topic: str) -> None:
    from kafka import KafkaProducer

    producer = KafkaProducer(
        bootstrap_servers=bootstrap,
        transactional_id=f"kp-{topic}",
        request_timeout_ms=3000,
        retry_backoff_ms=100,
        max_block_ms=10000,
        transaction_timeout_ms=10000,
    )
    try:
        producer.init_transactions()
        producer.begin_transaction()
        for value in ("t1-a", "t1-b"):
            producer.send(topic, key=b"k", value=value.encode(), partition=0).get(10)
        producer.commit_transaction()
        producer.begin_transaction()
        producer.send(topic, key=b"k", value=b"t2-early", partition=0).get(10)
        time.sleep(GAP_S)
        producer.send(topic, key=b"k", value=b"t2-late", partition=0).get(10)
        producer.abort_transaction()
    finally:
        producer.close(5)


CLIENTS = {
    "confluent-kafka": _run_two_transactions_confluent,
    "kafka-python": _run_two_transactions_kafka_python,
}


def _run(proxy_factory, broker: EmbeddedBroker, topic: str, tmp_path: Path, client: str, *extra: str):
    traces = tmp_path / "traces"
    tmp_path.mkdir(parents=True, exist_ok=True)
    proxy = proxy_factory("--rules", RULES, "--traces", str(traces), "--trace-level", "records", *extra)
    create_topic(broker.bootstrap, topic)
    CLIENTS[client](proxy.bootstrap, topic)
    # Read the partition through the proxy so the Fetch responses (with the markers) are traced.
    consumed = read_partition(proxy.bootstrap, topic, want=4)
    assert {c.value for c in consumed} >= {"t1-a", "t1-b", "t2-early", "t2-late"}
    seen = {
        "hazards": hazards(proxy),
        "refusals": metric_value(proxy, "kproxy_guard_refusals_total", kind="stale_end_txn"),
        "stale_hazard_metric": metric_value(proxy, "kproxy_txn_hazards_total", kind="stale_end_txn"),
        "applied": metric_value(proxy, "kproxy_faults_applied_total", rule=RULE_ID, action="duplicate"),
        "counters": rule_counters(proxy)[RULE_ID],
    }
    proxy.stop()  # SIGTERM flushes the trace
    events = trace_events(traces)
    return proxy, seen, events


# The held copy is released when transaction 2's first Produce is sent to the broker,
# and goes over the proxy's own connection: now and then the broker handles the copy
# before it has appended that Produce. The copy then commits an empty transaction 2
# and the records that follow belong to no transaction (no marker at all). Such a run
# is recognised on the wire and repeated with a fresh topic and producer; any other
# outcome fails at once.
ATTEMPTS = 3


def _race_lost(fate: dict[str, str | None]) -> bool:
    return fate.get("t2-early") is None and fate.get("t2-late") is None


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_stale_commit_tears_the_next_transaction(proxy_factory, broker, topic_name, tmp_path, client) -> None:
    for attempt in range(ATTEMPTS):
        topic = f"{topic_name}-{attempt}"
        proxy, seen, events = _run(proxy_factory, broker, topic, tmp_path / str(attempt), client)
        fate = fates(wire_log(events, topic))
        if not _race_lost(fate):
            break
    else:
        pytest.fail(f"the stale commit reached the broker before transaction 2's records in all {ATTEMPTS} runs")

    # The fault reached the wire once: the commit of transaction 1 was duplicated and held.
    assert seen["applied"] == 1
    assert seen["counters"]["applied"] == 1
    # The tracker attributes it: client transaction 1's commit delivered into broker transaction 2.
    assert seen["hazards"]["stale_end_txn"] == 1
    assert seen["stale_hazard_metric"] == 1
    assert "hazard stale_end_txn" in proxy.log_text()
    assert "(client txn 1 delivered into broker txn 2)" in proxy.log_text()
    (stale,) = [e for e in events if e["api"] == "end_txn" and e["direction"] == "request" and e["copy"] == 1]
    assert (stale["txn_client"], stale["txn_broker"], stale["hazard"]) == (1, 2, "stale_end_txn")
    assert stale["end_txn_commit"] is True and stale["outcome"] == "ghost" and stale["rule"] == RULE_ID

    # The torn transaction on the wire: transaction 1 committed (rightly), transaction 2's
    # first record committed by the stale copy, its later record not committed although
    # the client aborted the whole transaction.
    assert fate["t1-a"] == fate["t1-b"] == "commit"
    assert fate["t2-early"] == "commit"
    assert fate["t2-late"] != "commit"


@pytest.mark.parametrize("client", sorted(CLIENTS))
def test_guard_refuses_the_stale_commit(proxy_factory, broker, topic_name, tmp_path, client) -> None:
    proxy, seen, events = _run(proxy_factory, broker, topic_name, tmp_path, client, "--guard")

    assert seen["applied"] == 1  # the fault was still injected ...
    assert seen["refusals"] == 1  # ... and the guard refused to deliver it
    assert seen["hazards"]["stale_end_txn"] == 0
    assert seen["stale_hazard_metric"] == 0
    assert "guard refused end_txn" in proxy.log_text()
    (refused,) = [e for e in events if e["api"] == "end_txn" and e["direction"] == "request" and e["copy"] == 1]
    assert refused["outcome"] == "refused" and refused["hazard"] == "stale_end_txn"
    # No ghost response: the copy never reached the broker.
    assert not [e for e in events if e["api"] == "end_txn" and e["direction"] == "response" and e["copy"] == 1]

    # Transaction 2 stays whole: every record of it is followed by an ABORT marker only.
    log = wire_log(events, topic_name)
    fate = fates(log)
    assert fate["t1-a"] == fate["t1-b"] == "commit"
    assert fate["t2-early"] == fate["t2-late"] == "abort"
    assert [r.control for r in log if r.control] == ["commit", "abort"]
