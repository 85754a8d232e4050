"""Every dashboard panel returns data from a real Prometheus that scraped kproxy during a faulted workload.

The real parts: the embedded Tansu broker, `kproxy run` as a subprocess with
the compose stack's demo rules (deploy/rules/dashboards-demo.yaml: a Produce
delay, a duplicated commit held into the next transaction, a lost Produce ack,
a schedule), real confluent-kafka clients, and the Debian Prometheus scraping
the proxy's admin port every second. Each PromQL expression of each panel is
then sent to Prometheus the way Grafana sends it (range or instant query, with
Grafana's interval variables and the `instance` variable filled in) and must
parse and return at least one real number.
"""

from __future__ import annotations

import json
import math
import re
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import pytest

from kproxy.brokers import EmbeddedBroker
from kproxy.proxy_process import ProxyProcess, start_proxy
from tests.fixtures.broker import create_topic
from tests.fixtures.prometheus import PrometheusServer
from tests.test_dashboards_lint import DASHBOARD_FILES, content_panels, load

ROOT = Path(__file__).resolve().parent.parent
DEMO_RULES = ROOT / "deploy" / "rules" / "dashboards-demo.yaml"
# Grafana's $__rate_interval is at least four scrape intervals; the tests scrape every second.
RATE_INTERVAL = "15s"
STEP_SECONDS = 1.0

pytestmark = pytest.mark.timeout(180)


def run_workload(bootstrap: str) -> None:
    """Transactions that commit and abort, plain produce, and a read_committed consumer, all through the proxy."""
    from confluent_kafka import Consumer, KafkaException, Producer, TopicPartition

    topic = f"dash-{uuid.uuid4().hex[:8]}"
    create_topic(bootstrap, topic, partitions=2)

    txn_config = {
        "bootstrap.servers": bootstrap,
        "transactional.id": f"dash-txn-{uuid.uuid4().hex[:6]}",
        "linger.ms": 5,
        "transaction.timeout.ms": 20000,
    }
    txn = Producer(txn_config)
    txn.init_transactions(30)
    for n in range(6):
        try:
            txn.begin_transaction()
            for i in range(5):
                txn.produce(topic, key=f"t{n}".encode(), value=f"txn {n} record {i}".encode(), partition=i % 2)
            # Deliver the records first: librdkafka skips EndTxn for an abort with nothing sent.
            txn.flush(30)
            if n % 2 == 0:
                txn.commit_transaction(30)
            else:
                txn.abort_transaction(30)
        except KafkaException as exc:
            # The held duplicate commit lands in the next transaction, so the broker may
            # refuse what this client asks next: that is the fault working, and the
            # dashboards are about what the proxy saw. Recover the way an application would.
            error = exc.args[0]
            if error.txn_requires_abort():
                txn.abort_transaction(30)
            elif error.fatal():
                txn = Producer(txn_config)
                txn.init_transactions(30)
            elif not error.retriable():
                raise
    txn.flush(30)

    plain = Producer({"bootstrap.servers": bootstrap, "linger.ms": 0, "acks": "all"})
    for i in range(30):
        plain.produce(topic, key=b"plain", value=f"plain {i}".encode(), partition=i % 2)
        plain.poll(0)
    assert plain.flush(30) == 0

    consumer = Consumer({
        "bootstrap.servers": bootstrap,
        "group.id": f"dash-{uuid.uuid4().hex[:6]}",
        "isolation.level": "read_committed",
        "enable.auto.commit": False,
        "enable.partition.eof": True,
    })
    consumer.assign([TopicPartition(topic, p, 0) for p in (0, 1)])
    eof: set[int] = set()
    received = 0
    deadline = time.monotonic() + 20
    while len(eof) < 2 and time.monotonic() < deadline:
        msg = consumer.poll(0.5)
        if msg is None:
            continue
        if msg.error():
            if msg.error().code() == -191:  # _PARTITION_EOF
                eof.add(msg.partition())
            continue
        received += 1
    consumer.close()
    assert received >= 30, f"the consumer read {received} records through the proxy"


@dataclass
class ScrapedRun:
    prometheus: PrometheusServer
    proxy: ProxyProcess
    start: float
    end: float
    metrics_text: str


@pytest.fixture(scope="module")
def scraped_run(broker: EmbeddedBroker, tmp_path_factory: pytest.TempPathFactory,
                prometheus_server: Callable[..., PrometheusServer]) -> Iterator[ScrapedRun]:
    workdir = tmp_path_factory.mktemp("dashboards-live")
    proxy = start_proxy(
        broker.bootstrap, "--rules", str(DEMO_RULES), "--seed", "7", "--traces", str(workdir / "traces"), "--stage-latency",
        log_path=workdir / "kproxy.log",
    )
    try:
        prometheus = prometheus_server([f"127.0.0.1:{proxy.admin_port}"])
        # Scraped before the workload starts, so every rate window sees all of it.
        prometheus.wait_for_scrapes(1)
        start = time.time()
        run_workload(proxy.bootstrap)
        prometheus.wait_for_scrapes(5)
        # A few scrapes after the workload, so the last rate windows hold its end.
        time.sleep(4)
        end = time.time()
        metrics_text = httpx.get(f"{proxy.admin_url}/metrics", timeout=5).text
        yield ScrapedRun(prometheus, proxy, start, end, metrics_text)
    finally:
        proxy.stop()


def grafana_substitute(expr: str, variables: dict[str, str]) -> str:
    """Fill in Grafana's variables the way Grafana does before sending a query."""
    for name in sorted(variables, key=len, reverse=True):
        expr = expr.replace(f"${{{name}}}", variables[name]).replace(f"${name}", variables[name])
    assert "$" not in expr, f"unsubstituted variable in {expr}"
    return expr


def panel_queries() -> list[tuple[str, str, dict[str, Any]]]:
    return [
        (path.stem, panel["title"], target)
        for path in DASHBOARD_FILES
        for panel in content_panels(load(path))
        for target in panel["targets"]
    ]


def resolve_instance_variable(run: ScrapedRun) -> str:
    """Run the dashboards' `instance` variable query (label_values) and build Grafana's All regex."""
    queries = {
        var["definition"]
        for path in DASHBOARD_FILES
        for var in load(path)["templating"]["list"]
        if var["name"] == "instance"
    }
    assert len(queries) == 1, f"the dashboards disagree on the instance variable: {queries}"
    (definition,) = queries
    metric, label = re.fullmatch(r"label_values\((\w+),\s*(\w+)\)", definition).groups()
    values = run.prometheus.label_values(label, metric)
    assert f"127.0.0.1:{run.proxy.admin_port}" in values, f"{definition} gave {values}"
    # Grafana escapes regex characters in values, then doubles the backslashes for the PromQL string literal.
    return "(" + "|".join(re.escape(v).replace("\\", "\\\\") for v in values) + ")"


def finite_values(result: list[dict[str, Any]]) -> list[float]:
    samples = [s for series in result for s in series.get("values", [series.get("value")]) if s]
    return [float(v) for _, v in samples if not math.isnan(float(v))]


def test_every_panel_query_returns_data(scraped_run: ScrapedRun) -> None:
    run = scraped_run
    range_seconds = math.ceil(run.end - run.start)
    variables = {
        "__rate_interval": RATE_INTERVAL,
        "__interval": f"{int(STEP_SECONDS)}s",
        "__range": f"{range_seconds}s",
        "instance": resolve_instance_variable(run),
    }
    empty = []
    queries = panel_queries()
    assert len(queries) >= 40
    for dashboard, title, target in queries:
        expr = grafana_substitute(target["expr"], variables)
        if target.get("instant"):
            result = run.prometheus.query(expr, at=run.end)
        else:
            result = run.prometheus.query_range(expr, run.start, run.end, STEP_SECONDS)
        if not finite_values(result):
            empty.append(f"{dashboard} / {title} [{target['refId']}]: {expr} -> {json.dumps(result)[:200]}")
    assert not empty, "panels without data:\n" + "\n".join(empty) + f"\n\nkproxy log:\n{run.proxy.log_text()[-3000:]}"


def sample_sum(metrics_text: str, name: str, **labels: str) -> float:
    """Sum of the samples of `name` whose labels include `labels`, from /metrics text."""
    from prometheus_client.parser import text_string_to_metric_families

    total = 0.0
    for family in text_string_to_metric_families(metrics_text):
        for sample in family.samples:
            if sample.name == name and all(sample.labels.get(k) == v for k, v in labels.items()):
                total += sample.value
    return total


def test_the_faulted_workload_moved_the_fault_transaction_and_ghost_series(scraped_run: ScrapedRun) -> None:
    """The panels show this run, not only series pre-created at zero."""
    text = scraped_run.metrics_text
    assert sample_sum(text, "kproxy_frames_total", api="produce", direction="request") > 0
    assert sample_sum(text, "kproxy_client_request_duration_seconds_count", api="end_txn") > 0
    for rule, action in (("slow-produce", "delay"), ("late-commit", "duplicate"), ("lost-produce-ack", "replace_error")):
        assert sample_sum(text, "kproxy_faults_applied_total", rule=rule, action=action) > 0, (rule, action)
    assert sample_sum(text, "kproxy_response_errors_total", api="produce", error="not_leader_or_follower") > 0
    assert sample_sum(text, "kproxy_txn_transactions_total", side="client") >= 6
    assert sample_sum(text, "kproxy_txn_end_txn_total", result="commit") >= 3
    assert sample_sum(text, "kproxy_txn_end_txn_total", result="abort") >= 3
    assert sample_sum(text, "kproxy_ghost_deliveries_total") >= 1
    assert sample_sum(text, "kproxy_txn_hazards_total", kind="stale_end_txn") >= 1
    assert sample_sum(text, "kproxy_schedule_phase_active", phase="chaos") == 1
    assert sample_sum(text, "kproxy_rules_loaded", state="enabled") == 3
    assert sample_sum(text, "kproxy_trace_events_total", outcome="written") > 0
    # And Prometheus holds the same story.
    prom = scraped_run.prometheus
    assert prom.query('sum(kproxy_faults_applied_total{rule="late-commit"})', at=scraped_run.end)
