"""SASL through kproxy, and no secret in any output of the run.

noida-db's Kafka listener accepts SASL PLAIN, so the clients authenticate
through kproxy to a real broker; kproxy ends the clients' TLS (SASL_SSL on
the client side) and speaks plaintext to noida-db, which has no TLS and
advertises only the address it binds, so no terminator can stand in front
of it (the TLS broker tests use Tansu behind HAProxy: test_tls.py).
SCRAM needs a broker that supports it: noida-db answers a SCRAM client-first
message with something that is not SCRAM, and Tansu refuses every SASL
mechanism (docs/security.md).
"""

from __future__ import annotations

import base64
import json
import uuid
from pathlib import Path

import httpx
import pytest

from kproxy.bench.tls import Pki, make_pki
from kproxy.brokers import EmbeddedBroker
from tests.scenario_clients import producer, read_partition, send, trace_events

pytestmark = pytest.mark.timeout(120)

USER = "alice"

# A rule without `api` covers every API but authentication (docs/security.md).
CATCH_ALL_RULES = """\
version: 1
rules:
  - id: slow-everything
    match: {direction: request}
    action: {type: delay, ms: 1}
"""


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


def _outputs(directory: Path) -> dict[Path, bytes]:
    return {path: path.read_bytes() for path in sorted(directory.rglob("*")) if path.is_file()}


def _secret_forms(password: str) -> list[bytes]:
    """The password as it could be written: raw, and the PLAIN token in base64 and hex."""
    token = f"\0{USER}\0{password}".encode()
    return [password.encode(), base64.b64encode(token), token.hex().encode(), base64.b64encode(password.encode())]


@pytest.mark.parametrize(("level", "fmt"), [("records", "jsonl"), ("headers", "jsonl"), ("records", "parquet")])
def test_sasl_plain_over_tls_writes_no_secret(
    proxy_factory, noida_broker: EmbeddedBroker, pki: Pki, tmp_path, level: str, fmt: str
) -> None:
    if fmt == "parquet":
        pytest.importorskip("pyarrow")
    password = f"pw-{uuid.uuid4().hex}"
    marker = f"visible-{uuid.uuid4().hex}"  # a record value: written at trace level records
    traces = tmp_path / "traces"
    rules = tmp_path / "rules.yaml"
    rules.write_text(CATCH_ALL_RULES)
    proxy = proxy_factory(
        "--tls-cert", str(pki.proxy.cert), "--tls-key", str(pki.proxy.key),
        "--traces", str(traces), "--trace-level", level, "--trace-format", fmt, "--rules", str(rules),
        "--log-level", "debug",
        upstream=noida_broker.bootstrap,
    )
    sasl = {
        "security.protocol": "SASL_SSL", "ssl.ca.location": str(pki.ca),
        "sasl.mechanism": "PLAIN", "sasl.username": USER, "sasl.password": password,
    }
    topic = f"t-{uuid.uuid4().hex[:10]}"
    p = producer(proxy.bootstrap, **sasl)
    assert all(d.ok for d in send(p, topic, [marker, "second"]))
    consumed = read_partition(proxy.bootstrap, topic, want=2, **sasl)
    assert [c.value for c in consumed] == [marker, "second"]

    # kafka-python authenticates the same way (SASL_SSL, PLAIN).
    from kafka import KafkaProducer

    kp = KafkaProducer(
        bootstrap_servers=proxy.bootstrap, security_protocol="SASL_SSL", ssl_cafile=str(pki.ca),
        sasl_mechanism="PLAIN", sasl_plain_username=USER, sasl_plain_password=password,
        request_timeout_ms=5000, max_block_ms=10000,
    )
    kp.send(topic, key=b"k", value=b"third", partition=0).get(10)
    kp.close(5)

    scrape = httpx.get(f"{proxy.admin_url}/metrics", timeout=5).content
    proxy.stop()  # SIGTERM flushes the trace
    events = trace_events(traces)

    # SASL crossed the proxy, traced at records level, untouched by the catch-all rule ...
    sasl_events = [e for e in events if e["api"] in ("sasl_handshake", "sasl_authenticate")]
    requests = [e for e in sasl_events if e["direction"] == "request" and e["api"] == "sasl_authenticate"]
    assert len(requests) >= 2  # both clients, every connection they opened
    assert all(e["rule"] is None for e in sasl_events)
    assert all(e["error_code"] == 0 for e in sasl_events if e["direction"] == "response")
    assert any(e["rule"] == "slow-everything" for e in events if e["api"] == "produce")

    # ... and the password is in no output of the run, in any form: the files as written
    # (parquet compresses, so its events are searched as read back too), the log, a scrape.
    decoded = "\n".join(json.dumps(e, default=str) for e in events).encode()
    outputs = {**_outputs(traces), tmp_path / "metrics-scrape": scrape, tmp_path / "trace-as-read": decoded}
    log_path = proxy.log_path
    assert log_path is not None
    outputs[log_path] = log_path.read_bytes()
    assert len(outputs) >= 3
    for path, content in outputs.items():
        for secret in _secret_forms(password):
            assert secret not in content, f"{path} holds the password ({secret[:12]!r}...)"
    # The search can find what is written: at level records, the record value is in the trace.
    if level == "records":
        assert marker.encode() in decoded
        if fmt == "jsonl":
            assert any(marker.encode() in content for content in _outputs(traces).values())


CLIENT_SETTINGS = {
    "confluent-kafka": lambda ca, password: [
        "security.protocol=SASL_SSL", f"ssl.ca.location={ca}", "sasl.mechanism=PLAIN",
        f"sasl.username={USER}", f"sasl.password={password}",
    ],
    "kafka-python": lambda ca, password: [
        "security_protocol=SASL_SSL", f"ssl_cafile={ca}", "sasl_mechanism=PLAIN",
        f"sasl_plain_username={USER}", f"sasl_plain_password={password}",
    ],
}


@pytest.mark.parametrize("client", sorted(CLIENT_SETTINGS))
def test_workload_against_a_sasl_ssl_listener(proxy_factory, noida_broker, pki, tmp_path, client) -> None:
    """`kproxy workload --client-config` gives every client, the topic-creating admin too, the SASL_SSL settings."""
    from click.testing import CliRunner

    from kproxy.cli import main
    from kproxy.workload.history import validate_history

    password = f"pw-{uuid.uuid4().hex}"
    proxy = proxy_factory("--tls-cert", str(pki.proxy.cert), "--tls-key", str(pki.proxy.key),
                          upstream=noida_broker.bootstrap)
    history = tmp_path / "history.jsonl"
    settings = [arg for setting in CLIENT_SETTINGS[client](pki.ca, password) for arg in ("--client-config", setting)]
    result = CliRunner().invoke(main, [
        "workload", "--bootstrap", proxy.bootstrap, "--client", client, "--history", str(history), "--ops", "12",
        "--concurrency", "2", "--seed", "3", "--no-progress", "--final-reads-timeout", "8", *settings,
    ])
    assert result.exit_code == 0, result.output
    assert validate_history(history).ops > 20
    assert password.encode() not in history.read_bytes()


# A second whole demo is too dear for the default suite: the demo hands `client_config` to the
# workload as is, and the workload's own SASL test above runs by default.
@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(300)  # a whole demo, its analysis included
def test_kproxy_demo_passes_sasl_settings_to_every_client(spark, noida_broker, tmp_path) -> None:
    """`kproxy demo --bootstrap --client-config`: every client of the workload authenticates through the
    demo's proxy, and the password is in none of the demo's outputs."""
    from kproxy.demo import WorkloadProfile, rules_dir, run_demo

    password = f"pw-{uuid.uuid4().hex}"
    sasl = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": USER, "sasl.password": password}
    out = tmp_path / "demo"
    result = run_demo("healthy", out, bootstrap=noida_broker.bootstrap, rules_file=rules_dir() / "healthy.yaml",
                      spark=spark, say=lambda line: None, progress=False, client_config=sasl,
                      profile=WorkloadProfile(concurrency=2, duration=2))
    assert result.report["stats"]["completed_ops"] > 5
    events = trace_events(out / "traces")
    authenticated = {e["conn_id"] for e in events if e["api"] == "sasl_authenticate" and e["direction"] == "response"
                     and e["error_code"] == 0}
    talked = {e["conn_id"] for e in events if e["api"] in ("produce", "fetch", "metadata", "create_topics")}
    assert talked and talked <= authenticated, "a connection of the workload did not authenticate"
    for path, data in _outputs(out).items():
        assert all(form not in data for form in _secret_forms(password)), path
