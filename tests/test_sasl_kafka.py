"""SCRAM and re-authentication (KIP-368) through kproxy, against a real Apache Kafka.

The embedded brokers cannot serve these (noida-db speaks only PLAIN and
takes any password; Tansu refuses every mechanism), so this module starts a
single KRaft node of Apache Kafka with a SASL_PLAINTEXT listener: PLAIN with
one user, SCRAM-SHA-256 with the same user added when the storage is
formatted, and `connections.max.reauth.ms` short enough that clients must
authenticate again on their open connections during the test.
"""

from __future__ import annotations

import base64
import time
import uuid
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient

from kproxy.brokers import free_port
from kproxy.brokers.kafka import default_home, default_version
from kproxy.kafka.kraft import KafkaCluster, start_cluster
from kproxy.proxy_process import running_proxy
from tests.fixtures.broker import create_topic
from tests.scenario_clients import producer, read_partition, send, trace_events

# A JVM of its own, about 30-50 s on a 2-core machine: outside the default suite
# (`pytest -m slow tests/test_sasl_kafka.py`); PLAIN and the secret search run by
# default in test_sasl.py.
pytestmark = [pytest.mark.timeout(240), pytest.mark.slow]

USER = "alice"
PASSWORD = f"pw-{uuid.uuid4().hex}"
REAUTH_MS = 3000


@pytest.fixture(scope="module")
def sasl_kafka(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[KafkaCluster, str]]:
    host = "127.0.0.1"
    sasl_port = free_port(host)
    properties = {
        "listeners": f"PLAINTEXT://{{host}}:{{port}},CONTROLLER://{{host}}:{{controller_port}},"
                     f"SASL_PLAINTEXT://{{host}}:{sasl_port}",
        "advertised.listeners": f"PLAINTEXT://{{host}}:{{port}},SASL_PLAINTEXT://{{host}}:{sasl_port}",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT,SASL_PLAINTEXT:SASL_PLAINTEXT",
        "sasl.enabled.mechanisms": "PLAIN,SCRAM-SHA-256",
        "listener.name.sasl_plaintext.plain.sasl.jaas.config":
            f'org.apache.kafka.common.security.plain.PlainLoginModule required user_{USER}="{PASSWORD}";',
        "listener.name.sasl_plaintext.scram-sha-256.sasl.jaas.config":
            "org.apache.kafka.common.security.scram.ScramLoginModule required;",
        "connections.max.reauth.ms": str(REAUTH_MS),
    }
    home = default_home()
    cluster = start_cluster(
        None if home else default_version(), kafka_home=home, host=host,
        work_dir=tmp_path_factory.mktemp("kafka-sasl"), properties=properties,
        format_args=["--add-scram", f"SCRAM-SHA-256=[name={USER},password={PASSWORD}]"], say=print,
    )
    try:
        yield cluster, f"{host}:{sasl_port}"
    finally:
        cluster.stop()


def _sasl(mechanism: str, password: str = PASSWORD) -> dict[str, str]:
    return {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": mechanism,
            "sasl.username": USER, "sasl.password": password}


def test_scram_and_reauthentication_pass_through(sasl_kafka, tmp_path: Path) -> None:
    cluster, sasl_bootstrap = sasl_kafka
    topic = f"t-{uuid.uuid4().hex[:10]}"
    create_topic(cluster.bootstrap, topic)
    traces = tmp_path / "traces"
    log_path = tmp_path / "kproxy.log"
    with running_proxy(sasl_bootstrap, "--traces", str(traces), "--trace-level", "records", "--log-level", "debug",
                       log_path=log_path) as proxy:
        p = producer(proxy.bootstrap, **_sasl("SCRAM-SHA-256"))
        values = [f"v{i}" for i in range(12)]
        # Long enough, on one connection, for the broker's session lifetime to run out twice.
        for value in values:
            assert all(d.ok for d in send(p, topic, [value]))
            time.sleep(REAUTH_MS * 2.5 / 1000 / len(values))
        consumed = read_partition(proxy.bootstrap, topic, want=len(values), **_sasl("SCRAM-SHA-256"))
        assert [c.value for c in consumed] == values

        # PLAIN puts the password itself on the wire (the search below must not find it anywhere) ...
        assert AdminClient({"bootstrap.servers": proxy.bootstrap, **_sasl("PLAIN")}).list_topics(timeout=10).brokers
        # ... and the broker checks it: a wrong one fails, through the proxy, with the broker's own error.
        with pytest.raises(KafkaException):
            AdminClient({"bootstrap.servers": proxy.bootstrap, **_sasl("PLAIN", "wrong")}).list_topics(timeout=4)
        scrape = httpx.get(f"{proxy.admin_url}/metrics", timeout=5).content

    events = trace_events(traces)
    auth_requests = [e for e in events if e["api"] == "sasl_authenticate" and e["direction"] == "request"]
    auth_responses = [e for e in events if e["api"] == "sasl_authenticate" and e["direction"] == "response"]
    # KIP-368: the producer's connection to the broker authenticated again while it stayed open
    # (SCRAM takes two SaslAuthenticate round trips per authentication).
    produce_conns = {e["conn_id"] for e in events if e["api"] == "produce"}
    per_conn = Counter(e["conn_id"] for e in auth_requests)
    assert any(per_conn[conn] >= 4 for conn in produce_conns), per_conn
    assert 58 in {e["error_code"] for e in auth_responses}  # SASL_AUTHENTICATION_FAILED for the wrong password
    assert all(e["rule"] is None for e in auth_requests)

    token = f"\0{USER}\0{PASSWORD}".encode()
    secrets = [PASSWORD.encode(), base64.b64encode(token), token.hex().encode()]
    outputs = {path: path.read_bytes() for path in traces.rglob("*") if path.is_file()}
    outputs[log_path] = log_path.read_bytes()
    outputs[tmp_path / "scrape"] = scrape
    for path, content in outputs.items():
        for secret in secrets:
            assert secret not in content, f"{path} holds the password"


@pytest.mark.spark
def test_kproxy_demo_against_a_listener_that_requires_authentication(sasl_kafka, spark, tmp_path: Path) -> None:
    """A SASL listener answers ApiVersions before authentication and nothing else: the demo still tells
    the software, leaves the nodes unknown, and its clients authenticate through its proxy."""
    from kproxy.brokers.identify import UNAUTHENTICATED, identify
    from kproxy.demo import WorkloadProfile, rules_dir, run_demo

    cluster, sasl_bootstrap = sasl_kafka
    who = identify(sasl_bootstrap)
    assert who.software == "Apache Kafka" and who.nodes is None and UNAUTHENTICATED in who.basis
    assert identify(cluster.bootstrap).nodes == 1  # the same node on its plaintext listener

    out = tmp_path / "demo"
    result = run_demo("healthy", out, bootstrap=sasl_bootstrap, rules_file=rules_dir() / "healthy.yaml",
                      spark=spark, say=lambda line: None, progress=False, client_config=_sasl("SCRAM-SHA-256"),
                      profile=WorkloadProfile(concurrency=2, duration=3))
    assert result.summary.startswith(f"broker: Apache Kafka at {sasl_bootstrap}, nodes unknown, not started by kproxy")
    assert result.report["broker"]["nodes"] is None
    assert result.report["stats"]["completed_ops"] > 5
    events = trace_events(out / "traces")
    assert any(e["api"] == "sasl_authenticate" and e["direction"] == "response" and e["error_code"] == 0
               for e in events)
    assert all(PASSWORD.encode() not in path.read_bytes() for path in out.rglob("*") if path.is_file())
