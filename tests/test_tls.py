"""kproxy with TLS on both sides, with real parts only.

The TLS broker is the embedded broker behind HAProxy terminating TLS
(kproxy/bench/tls.py: neither embedded broker serves TLS itself), with
certificates made by `openssl` for this module. The clients are
confluent-kafka (librdkafka, security.protocol SSL) and kafka-python.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from confluent_kafka import KafkaException
from confluent_kafka.admin import AdminClient, NewTopic

from kproxy.bench.tls import Pki, TlsBroker, make_pki, tls_broker
from kproxy.obs.metrics import TLS_HANDSHAKE_REASONS
from kproxy.proxy_process import ProxyProcess
from tests.fixtures.proxy import metric_value
from tests.scenario_clients import (
    fates,
    hazards,
    producer,
    read_partition,
    rule_counters,
    send,
    trace_events,
    transactional_producer,
    wait_until,
    wire_log,
)

RULES = str(Path(__file__).parent.parent / "rules" / "torn-transaction.yaml")
RULE_ID = "stale-commit-into-next-txn"
GAP_S = 0.5
ATTEMPTS = 3

pytestmark = pytest.mark.timeout(120)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return make_pki(tmp_path_factory.mktemp("pki"))


@pytest.fixture(scope="module")
def secure_broker(pki: Pki, tmp_path_factory: pytest.TempPathFactory) -> Iterator[TlsBroker]:
    with tls_broker(tmp_path_factory.mktemp("tls-broker"), pki) as broker:
        yield broker


def ssl_client(pki: Pki, **extra: str) -> dict[str, str]:
    """librdkafka settings of a client that trusts the test CA (and verifies the proxy's name)."""
    return {"security.protocol": "SSL", "ssl.ca.location": str(pki.ca), **extra}


def tls_args(pki: Pki, *extra: str) -> tuple[str, ...]:
    return (
        "--tls-cert", str(pki.proxy.cert), "--tls-key", str(pki.proxy.key),
        "--upstream-tls", "--upstream-ca", str(pki.ca), *extra,
    )


def handshake_failures(proxy: ProxyProcess, side: str) -> float:
    return sum(
        metric_value(proxy, "kproxy_tls_handshake_failures_total", side=side, reason=reason)
        for reason in TLS_HANDSHAKE_REASONS
    )


def create_topic_tls(bootstrap: str, name: str, settings: dict[str, str]) -> None:
    admin = AdminClient({"bootstrap.servers": bootstrap, **settings})
    for future in admin.create_topics([NewTopic(name, 1, 1)], operation_timeout=15).values():
        future.result(15)


def list_topics(bootstrap: str, settings: dict[str, str], timeout: float = 4.0) -> object:
    return AdminClient({"bootstrap.servers": bootstrap, **settings}).list_topics(timeout=timeout)


def _two_transactions(bootstrap: str, topic: str, settings: dict[str, str]) -> None:
    producer = transactional_producer(bootstrap, **settings)
    producer.begin_transaction()
    assert all(d.ok for d in send(producer, topic, ["t1-a", "t1-b"]))
    producer.commit_transaction(10)
    producer.begin_transaction()
    assert all(d.ok for d in send(producer, topic, ["t2-early"]))
    time.sleep(GAP_S)
    assert all(d.ok for d in send(producer, topic, ["t2-late"]))
    producer.abort_transaction(10)


def test_torn_transaction_over_tls_on_both_sides(proxy_factory, secure_broker, pki, topic_name, tmp_path) -> None:
    """A transactional produce and consume through kproxy, TLS on both sides, with the torn-transaction rule firing."""
    settings = ssl_client(pki)
    for attempt in range(ATTEMPTS):
        topic = f"{topic_name}-{attempt}"
        traces = tmp_path / str(attempt) / "traces"
        proxy = proxy_factory(
            *tls_args(pki), "--rules", RULES, "--traces", str(traces), "--trace-level", "records",
            upstream=secure_broker.bootstrap,
        )
        create_topic_tls(proxy.bootstrap, topic, settings)
        _two_transactions(proxy.bootstrap, topic, settings)
        consumed = read_partition(proxy.bootstrap, topic, want=4, **settings)
        committed = read_partition(proxy.bootstrap, topic, isolation="read_committed", **settings)
        applied = metric_value(proxy, "kproxy_faults_applied_total", rule=RULE_ID, action="duplicate")
        seen_hazards = hazards(proxy)
        counters = rule_counters(proxy)[RULE_ID]
        upstream_failures = handshake_failures(proxy, "upstream")
        proxy.stop()  # SIGTERM flushes the trace
        events = trace_events(traces)
        fate = fates(wire_log(events, topic))
        if not (fate.get("t2-early") is None and fate.get("t2-late") is None):
            break  # the race of the held copy against transaction 2's records (see test_torn_transaction)
    else:
        pytest.fail(f"the stale commit reached the broker before transaction 2's records in all {ATTEMPTS} runs")

    assert {c.value for c in consumed} >= {"t1-a", "t1-b", "t2-early", "t2-late"}
    assert {"t1-a", "t1-b"} <= {c.value for c in committed}
    assert applied == 1 and counters["applied"] == 1
    assert seen_hazards["stale_end_txn"] == 1
    (stale,) = [e for e in events if e["api"] == "end_txn" and e["direction"] == "request" and e["copy"] == 1]
    # The copy went to the broker over the proxy's own TLS connection, and tore transaction 2.
    assert (stale["txn_client"], stale["txn_broker"], stale["hazard"]) == (1, 2, "stale_end_txn")
    assert stale["outcome"] == "ghost" and stale["rule"] == RULE_ID
    assert fate["t1-a"] == fate["t1-b"] == fate["t2-early"] == "commit"
    assert fate["t2-late"] != "commit"
    assert upstream_failures == 0
    log = proxy.log_text()
    assert "(bootstrap, TLS)" in log and "over TLS" in log


def test_mutual_tls_with_kafka_python(proxy_factory, secure_broker, pki, topic_name) -> None:
    """--tls-client-ca: a client with a certificate from the CA gets through, one without is refused."""
    from kafka import KafkaConsumer, KafkaProducer, TopicPartition

    proxy = proxy_factory(*tls_args(pki, "--tls-client-ca", str(pki.ca)), upstream=secure_broker.bootstrap)
    with_cert = ssl_client(pki, **{"ssl.certificate.location": str(pki.client.cert),
                                   "ssl.key.location": str(pki.client.key)})
    create_topic_tls(proxy.bootstrap, topic_name, with_cert)
    tls = {
        "bootstrap_servers": proxy.bootstrap, "security_protocol": "SSL", "ssl_cafile": str(pki.ca),
        "ssl_certfile": str(pki.client.cert), "ssl_keyfile": str(pki.client.key),
    }
    producer = KafkaProducer(**tls, request_timeout_ms=5000, max_block_ms=10000)
    for value in (b"one", b"two"):
        producer.send(topic_name, key=b"k", value=value, partition=0).get(10)
    producer.close(5)
    consumer = KafkaConsumer(**tls, enable_auto_commit=False, consumer_timeout_ms=8000)
    consumer.assign([TopicPartition(topic_name, 0)])
    consumer.seek_to_beginning()
    values = []
    for record in consumer:
        values.append(record.value)
        if len(values) == 2:
            break
    consumer.close()
    assert values == [b"one", b"two"]

    # No client certificate: refused in the handshake, counted, and the proxy carries on.
    with pytest.raises(KafkaException):
        list_topics(proxy.bootstrap, ssl_client(pki), timeout=3)
    wait_until(
        lambda: metric_value(proxy, "kproxy_tls_handshake_failures_total", side="client", reason="certificate") >= 1,
        what="a counted client handshake failure",
    )
    assert "TLS handshake with the client failed: the peer's certificate is missing or not trusted" in proxy.log_text()
    assert list_topics(proxy.bootstrap, with_cert).topics
    assert proxy.alive()


@pytest.mark.parametrize(
    ("case", "reason", "words"),
    [
        ("wrong_ca", "certificate", "certificate verification failed"),
        ("wrong_hostname", "hostname", "mismatch, certificate is not valid for '127.0.0.1'"),
    ],
)
def test_bad_broker_certificate_costs_only_that_client(
    proxy_factory, secure_broker, pki, case, reason, words
) -> None:
    """A broker that fails verification closes the clients bound for it, with the broker and the reason
    in the log and a metric; the same proxy goes on serving clients of the broker that verifies.

    The first --upstream is the bad one (every bootstrap connection goes there); discovery falls back
    to the second, which verifies, so the broker's own listener serves clients as usual.
    """
    port = secure_broker.port
    bad = secure_broker.impostor_bootstrap if case == "wrong_ca" else f"127.0.0.1:{port}"  # its certificate names localhost only
    proxy = proxy_factory(*tls_args(pki), "--upstream", secure_broker.bootstrap, upstream=bad)
    settings = ssl_client(pki)
    with pytest.raises(KafkaException):
        list_topics(proxy.bootstrap, settings, timeout=2)
    wait_until(
        lambda: metric_value(proxy, "kproxy_tls_handshake_failures_total", side="upstream", reason=reason) >= 1,
        what=f"a counted {reason} failure",
    )
    log = proxy.log_text()
    assert f"TLS handshake with broker {bad} (node -1) failed" in log
    assert words in log
    assert metric_value(proxy, "kproxy_connections_closed_total", side="client", reason="tls_handshake") >= 1
    # Others are served: the broker's own listener reaches the broker that verifies.
    node_bootstrap = re.search(r"broker node \d+: listening on (\S+)", log).group(1)
    metadata = list_topics(node_bootstrap, settings)
    assert metadata.brokers
    assert proxy.alive()


def test_plaintext_and_tls_mixups_are_closed_with_a_clear_line(proxy_factory, broker, secure_broker, pki) -> None:
    """A plaintext client on a TLS listener, and a TLS client on a plaintext one: closed, logged, the proxy lives."""
    tls_proxy = proxy_factory(*tls_args(pki), upstream=secure_broker.bootstrap)
    with pytest.raises(KafkaException):
        list_topics(tls_proxy.bootstrap, {}, timeout=1.5)
    wait_until(
        lambda: metric_value(tls_proxy, "kproxy_tls_handshake_failures_total", side="client", reason="not_tls") >= 1,
        what="a counted plaintext client",
    )
    assert "the peer does not speak TLS" in tls_proxy.log_text()
    assert "(a plaintext client on a TLS listener?)" in tls_proxy.log_text()
    assert list_topics(tls_proxy.bootstrap, ssl_client(pki)).brokers

    plain_proxy = proxy_factory()  # in front of the plaintext broker
    with pytest.raises(KafkaException):
        list_topics(plain_proxy.bootstrap, ssl_client(pki), timeout=1.5)
    wait_until(lambda: "client sent a TLS handshake to a plaintext listener" in plain_proxy.log_text(),
               what="the TLS-on-plaintext log line")
    assert list_topics(plain_proxy.bootstrap, {}).brokers
    assert tls_proxy.alive() and plain_proxy.alive()


ACTIONS_RULES = """\
version: 1
rules:
  - {id: tls-delay, match: {api: produce, client_id: tls-delay}, action: {type: delay, ms: 200}, limits: {once: true}}
  - {id: tls-respond, match: {api: produce, client_id: tls-respond}, action: {type: respond, error: NOT_LEADER_OR_FOLLOWER}, limits: {once: true}}
  - {id: tls-replace-error, match: {api: produce, client_id: tls-replace-error}, action: {type: replace_error, error: REQUEST_TIMED_OUT}, limits: {once: true}}
  - {id: tls-drop, match: {api: produce, client_id: tls-drop}, action: {type: drop}, limits: {once: true}}
  - {id: tls-drop-response, match: {api: produce, client_id: tls-drop-response}, action: {type: drop_response}, limits: {once: true}}
  - {id: tls-disconnect-client, match: {api: produce, client_id: tls-disconnect-client}, action: {type: disconnect}, limits: {once: true}}
  - {id: tls-disconnect-upstream, match: {api: produce, client_id: tls-disconnect-upstream}, action: {type: disconnect, side: upstream, when: after}, limits: {once: true}}
  - {id: tls-hold, match: {api: produce, client_id: tls-hold}, action: {type: hold, until: next_txn_records, timeout_ms: 300}, limits: {once: true}}
  - {id: tls-duplicate, match: {api: produce, client_id: tls-duplicate}, action: {type: duplicate, copies: 1}, limits: {once: true}}
"""


def test_fault_actions_and_guard_over_tls(proxy_factory, secure_broker, pki, topic_name, tmp_path) -> None:
    """Each request action once, over TLS on both sides and with --guard on: the producer gets every record
    through in the end (its retries), each rule fired once, and the proxy serves on."""
    rules = tmp_path / "rules.yaml"
    rules.write_text(ACTIONS_RULES)
    proxy = proxy_factory(*tls_args(pki, "--rules", str(rules), "--guard"), upstream=secure_broker.bootstrap)
    settings = ssl_client(pki)
    create_topic_tls(proxy.bootstrap, topic_name, settings)
    timeouts = {"request.timeout.ms": 1500, "message.timeout.ms": 20000, "enable.idempotence": True}
    rule_ids = [line.split("id: ")[1].split(",")[0] for line in ACTIONS_RULES.splitlines() if "id: " in line]
    for rule_id in rule_ids:
        p = producer(proxy.bootstrap, **settings, **timeouts, **{"client.id": rule_id})
        reports = send(p, topic_name, [f"{rule_id}-a", f"{rule_id}-b"], timeout=25)
        assert all(d.ok for d in reports), (rule_id, [d.error for d in reports])
    applied = rule_counters(proxy)
    assert {rule_id: applied[rule_id]["applied"] for rule_id in rule_ids} == dict.fromkeys(rule_ids, 1)
    consumed = {c.value for c in read_partition(proxy.bootstrap, topic_name, want=2 * len(rule_ids), **settings)}
    assert consumed >= {f"{r}-{s}" for r in rule_ids for s in "ab"}
    assert proxy.alive() and handshake_failures(proxy, "upstream") == 0


def test_unusable_tls_settings_stop_the_proxy_before_it_listens(tmp_path, pki) -> None:
    from click.testing import CliRunner

    from kproxy.cli import main

    garbage = tmp_path / "garbage.pem"
    garbage.write_text("not a certificate\n")
    base = ["run", "--upstream", "127.0.0.1:9", "--listen", "127.0.0.1:0", "--no-admin"]
    cases = [
        (["--tls-cert", str(tmp_path / "missing.pem"), "--tls-key", str(pki.proxy.key)], 1,
         f"{tmp_path / 'missing.pem'}: no such file (--tls-cert/--tls-key)"),
        (["--tls-cert", str(garbage), "--tls-key", str(pki.proxy.key)], 1, "not a PEM certificate chain and its private key"),
        (["--tls-cert", str(pki.proxy.cert), "--tls-key", str(pki.client.key)], 1, "(--tls-cert/--tls-key)"),
        (["--upstream-tls", "--upstream-ca", str(garbage)], 1, f"{garbage}: no PEM certificate in it (--upstream-ca)"),
        (["--tls-cert", str(pki.proxy.cert)], 2, "--tls-cert and --tls-key go together"),
        (["--upstream-ca", str(pki.ca)], 2, "--upstream-ca applies to TLS towards brokers: add --upstream-tls"),
        (["--upstream-tls", "--upstream-cert", str(pki.client.cert)], 1, "--upstream-cert and --upstream-key go together"),
    ]
    for args, code, words in cases:
        result = CliRunner().invoke(main, [*base, *args])
        assert result.exit_code == code, (args, result.output)
        assert words in result.output, (args, result.output)


def test_tls_towards_brokers_only(proxy_factory, secure_broker, pki, topic_name) -> None:
    """Plaintext clients on a loopback listener, TLS to the brokers: each side is chosen on its own."""
    proxy = proxy_factory("--upstream-tls", "--upstream-ca", str(pki.ca), upstream=secure_broker.bootstrap)
    create_topic_tls(proxy.bootstrap, topic_name, {})
    assert all(d.ok for d in send(producer(proxy.bootstrap), topic_name, ["plain-in-tls-out"]))
    assert [c.value for c in read_partition(proxy.bootstrap, topic_name, want=1)] == ["plain-in-tls-out"]
    assert handshake_failures(proxy, "upstream") == 0


def test_mutual_tls_towards_the_broker(proxy_factory, pki, topic_name, tmp_path) -> None:
    """A broker that requires client certificates: kproxy presents --upstream-cert/--upstream-key;
    without them the broker refuses it, and that client's connection closes with the reason logged."""
    with tls_broker(tmp_path, pki, require_client_cert=True) as strict:
        proxy = proxy_factory(
            *tls_args(pki, "--upstream-cert", str(pki.client.cert), "--upstream-key", str(pki.client.key)),
            upstream=strict.bootstrap,
        )
        settings = ssl_client(pki)
        create_topic_tls(proxy.bootstrap, topic_name, settings)
        assert all(d.ok for d in send(producer(proxy.bootstrap, **settings), topic_name, ["with-cert"]))

        anonymous = proxy_factory(*tls_args(pki), upstream=strict.bootstrap)
        with pytest.raises(KafkaException):
            list_topics(anonymous.bootstrap, settings, timeout=2)
        # TLS 1.3: the broker checks the client's certificate after the handshake, so its refusal
        # (an alert) ends the first read or the handshake, whichever sees it.
        wait_until(lambda: f"broker {strict.bootstrap} connection failed: TLS connection failed" in anonymous.log_text()
                   and "CERTIFICATE_REQUIRED" in anonymous.log_text(), what="the broker's refusal in the log")
        assert anonymous.alive() and proxy.alive()


def _topics(bootstrap: str, pki: Pki) -> set[str]:
    return set(AdminClient({"bootstrap.servers": bootstrap, **ssl_client(pki)}).list_topics(timeout=10).topics)


@pytest.mark.spark
@pytest.mark.timeout(300)  # a whole demo, its analysis included
def test_kproxy_demo_against_a_tls_cluster(spark, secure_broker, pki, tmp_path) -> None:
    """`kproxy demo --bootstrap` with the proxy's upstream TLS options: the demo identifies the broker over
    TLS, its proxy opens TLS to every broker, and the run goes through."""
    from kproxy.demo import rules_dir, run_demo
    from kproxy.proxy_process import UpstreamTlsFiles

    said: list[str] = []
    out = tmp_path / "demo"
    before = _topics(secure_broker.bootstrap, pki)
    result = run_demo("healthy", out, bootstrap=secure_broker.bootstrap, rules_file=rules_dir() / "healthy.yaml",
                      duration=3, spark=spark, say=said.append, progress=False, upstream_tls=UpstreamTlsFiles(pki.ca))
    assert result.exit_code in (0, 1), said
    assert f"using the broker at {secure_broker.bootstrap} over TLS: tansu" in "\n".join(said)
    assert "not started by kproxy" in result.summary
    assert result.report["broker"]["software"] == "tansu" and result.report["broker"]["started_by_kproxy"] is False
    assert result.report["stats"]["completed_ops"] > 10 and result.report["stats"]["fault_impact"] == []
    # The run created its own topics only, all under its prefix, and left the user's alone.
    after = _topics(secure_broker.bootstrap, pki)
    created = after - before
    assert created and all(t.startswith(result.topic_prefix + "-") for t in created)
    assert before <= after
    log = (out / "kproxy.log").read_text()
    assert "TLS handshake" not in log, log[-2000:]
    # Every client reached the broker only through the proxy's TLS connections.
    events = trace_events(out / "traces")
    assert {e["api"] for e in events} >= {"produce", "fetch", "end_txn"}
    assert all(e["error_code"] == 0 for e in events if e["api"] == "produce" and e["direction"] == "response")


def test_kproxy_demo_takes_the_proxys_upstream_tls_options(secure_broker, pki, tmp_path) -> None:
    """The demo's TLS options are `kproxy run`'s, refused alike; the CA reaches the demo's own connection."""
    out = tmp_path / "o"
    base = ["demo", "--out", str(out), "--no-progress"]
    cases = [
        (["--bootstrap", secure_broker.bootstrap, "--upstream-ca", str(pki.ca)], 2,
         "--upstream-ca applies to TLS towards brokers: add --upstream-tls"),
        (["--upstream-tls"], 2, "--upstream-tls is for a cluster of your own (--bootstrap HOST:PORT)"),
        (["--bootstrap", secure_broker.bootstrap, "--upstream-tls", "--upstream-ca", str(tmp_path / "none.pem")], 1,
         f"{tmp_path / 'none.pem'}: no such file (--upstream-ca)"),
        (["--bootstrap", secure_broker.bootstrap, "--client-config", "no-equals-sign"], 2, "--client-config"),
        # Reaching the broker: a CA that did not sign its certificate, then no TLS at all.
        (["--bootstrap", secure_broker.bootstrap, "--upstream-tls", "--upstream-ca", str(pki.other_ca)], 3,
         f"TLS handshake with the broker at {secure_broker.bootstrap} failed: certificate verification failed"),
        (["--bootstrap", secure_broker.bootstrap], 3, "does it speak TLS? then add --upstream-tls"),
    ]
    assert_refusals(base, cases, out)


def assert_refusals(base: list[str], cases: list[tuple[list[str], int, str]], out: Path) -> None:
    """Each (arguments, exit code, words) case of `kproxy *base` exits so and says so, writing nothing to `out`."""
    from click.testing import CliRunner

    from kproxy.cli import main

    for args, code, words in cases:
        result = CliRunner().invoke(main, [*base, *args])
        assert result.exit_code == code, (args, result.output)
        assert words in result.output, (args, result.output)
    assert not out.exists()


def test_kproxy_shrink_takes_the_demos_upstream_options(secure_broker, pki, tmp_path) -> None:
    """`kproxy shrink --bootstrap` takes the demo's TLS and client options, refused alike, and hands the
    TLS settings on: the broker is identified over TLS before anything is written."""
    out = tmp_path / "o"
    base = ["shrink", "--rules", RULES, "--anomaly", "torn-transaction", "--out", str(out)]
    cases = [
        (["--bootstrap", secure_broker.bootstrap, "--upstream-key", str(pki.client.key)], 2,
         "--upstream-key applies to TLS towards brokers: add --upstream-tls"),
        (["--upstream-tls"], 2, "--upstream-tls is for a cluster of your own (--bootstrap HOST:PORT)"),
        (["--broker", "tansu", "--upstream-tls"], 2, "the embedded brokers speak plaintext"),
        (["--bootstrap", secure_broker.bootstrap, "--upstream-tls", "--upstream-ca", str(tmp_path / "none.pem")], 1,
         f"{tmp_path / 'none.pem'}: no such file (--upstream-ca)"),
        (["--bootstrap", secure_broker.bootstrap, "--client-config", "no-equals-sign"], 2, "--client-config"),
        (["--bootstrap", secure_broker.bootstrap, "--upstream-tls", "--upstream-ca", str(pki.other_ca)], 3,
         f"shrink failed: TLS handshake with the broker at {secure_broker.bootstrap} failed: "
         "certificate verification failed"),
        (["--bootstrap", secure_broker.bootstrap], 3, "does it speak TLS? then add --upstream-tls"),
    ]
    assert_refusals(base, cases, out)


def test_readyz_means_the_broker_can_be_reached_over_tls(proxy_factory, secure_broker, pki, tmp_path) -> None:
    """With --upstream-tls, /readyz is ready only when the proxy's own TLS settings reach the broker:
    a broker that accepts TCP but whose certificate or demands the proxy cannot meet is unready."""
    import httpx

    def readyz(proxy: ProxyProcess) -> tuple[int, dict]:
        answer = httpx.get(f"{proxy.admin_url}/readyz", timeout=10)
        return answer.status_code, answer.json()

    good = proxy_factory("--upstream-tls", "--upstream-ca", str(pki.ca), upstream=secure_broker.bootstrap)
    code, body = readyz(good)
    assert (code, body["status"], body["upstream_errors"]) == (200, "ready", {}), body
    assert body["upstreams_reachable"][secure_broker.bootstrap] is True

    unsigned = proxy_factory("--upstream-tls", "--upstream-ca", str(pki.other_ca), upstream=secure_broker.bootstrap)
    misnamed_at = secure_broker.bootstrap.replace("localhost", "127.0.0.1")
    misnamed = proxy_factory("--upstream-tls", "--upstream-ca", str(pki.ca), upstream=misnamed_at)
    for proxy, at, words in ((unsigned, secure_broker.bootstrap, "unable to get local issuer certificate"),
                             (misnamed, misnamed_at, "IP address mismatch")):
        code, body = readyz(proxy)
        assert (code, body["status"], body["upstreams_reachable"]) == (503, "unready", {at: False}), body
        assert "TLS handshake failed: certificate verification failed" in body["upstream_errors"][at], body
        assert words in body["upstream_errors"][at], body

    # A broker that requires a client certificate refuses one after the handshake (TLS 1.3).
    with tls_broker(tmp_path, pki, require_client_cert=True) as strict:
        anonymous = proxy_factory("--upstream-tls", "--upstream-ca", str(pki.ca), upstream=strict.bootstrap)
        code, body = readyz(anonymous)
        assert (code, body["status"]) == (503, "unready"), body
        assert "CERTIFICATE_REQUIRED" in body["upstream_errors"][strict.bootstrap], body
        with_cert = proxy_factory("--upstream-tls", "--upstream-ca", str(pki.ca), "--upstream-cert",
                                  str(pki.client.cert), "--upstream-key", str(pki.client.key), upstream=strict.bootstrap)
        assert readyz(with_cert)[0] == 200
