"""The embedded broker kinds, the check that their binaries run, and the
scenario runner against each of them. The demo against a broker it did not
start is checked on the scenario suite's runs (tests/test_scenarios_e2e.py),
whose Tansu `kproxy broker` started."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kproxy.brokers import BrokerError, EmbeddedBroker, check_broker, free_port
from kproxy.brokers.identify import identify
from tests.fixtures.timing import timed

SOFTWARE = {"tansu": "tansu", "noida": "noida-db"}
ROOT = Path(__file__).resolve().parent.parent
REPRODUCERS = ROOT / "scripts" / "repro"


def _unrunnable_binary(tmp_path: Path) -> Path:
    """A file with the executable bit that no loader accepts, as a binary built for another system."""
    path = tmp_path / "noida-db"
    path.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(range(256)) * 4)
    path.chmod(0o755)
    return path


@pytest.mark.parametrize("binary", ["unrunnable", "missing"])
def test_a_binary_that_cannot_run_fails_in_under_a_second_naming_the_fix(tmp_path, monkeypatch, binary):
    path = _unrunnable_binary(tmp_path) if binary == "unrunnable" else tmp_path / "absent"
    monkeypatch.setenv("NOIDA_DB_BIN", str(path))
    def check() -> BrokerError:
        with pytest.raises(BrokerError) as failure:
            check_broker("noida")
        return failure

    failure, spent = timed(check)
    assert spent.within_a_second(), spent
    assert str(path) in str(failure.value)
    assert "Fix: pip install 'noida-db==0.2.2'" in str(failure.value)


def test_kproxy_broker_refuses_to_start_an_unrunnable_binary_in_under_a_second(tmp_path):
    env = {**os.environ, "NOIDA_DB_BIN": str(_unrunnable_binary(tmp_path))}
    port = free_port()
    done, spent = timed(lambda: subprocess.run(
        [sys.executable, "-m", "kproxy", "broker", "--kind", "noida", "--port", str(port)],
        env=env, capture_output=True, text=True, timeout=30))
    assert spent.cpu < 1.0 + 1.0 and spent.wall < 10, spent  # the check, plus the interpreter starting
    assert done.returncode == 1
    assert "does not run here" in done.stderr and "pip install 'noida-db==0.2.2'" in done.stderr


def test_every_kind_names_its_installed_version():
    assert check_broker("tansu") == "0.6.0"
    assert check_broker("noida") == "0.2.2"
    with pytest.raises(BrokerError, match="unknown broker kind"):
        check_broker("nope")


def test_the_wire_tells_each_embedded_broker_apart(any_broker: EmbeddedBroker):
    who = identify(any_broker.bootstrap)
    assert who.software == SOFTWARE[any_broker.kind]
    assert who.version == any_broker.version
    assert who.nodes == 1 and who.node_addresses == (any_broker.bootstrap,)
    assert who.controller_id is not None and who.cluster_id


def test_identify_names_an_address_where_nothing_listens():
    port = free_port()
    with pytest.raises(BrokerError, match=f"cannot connect to the broker at 127.0.0.1:{port}"):
        identify(f"127.0.0.1:{port}", timeout=2)


@pytest.mark.parametrize("script, shows_on", [("aborted_read", "tansu"), ("stale_aborted_entry", "noida")])
def test_each_direct_reproducer_shows_its_bug_on_its_broker_only(any_broker: EmbeddedBroker, script, shows_on):
    done = subprocess.run([sys.executable, str(REPRODUCERS / f"{script}.py"), any_broker.bootstrap],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == (1 if any_broker.kind == shows_on else 0), done.stdout + done.stderr


def test_kproxy_demo_refuses_a_bad_rule_file_with_its_line_before_starting_anything(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules:\n  - id: x\n    action: delay\n    bogus: 1\n")
    done = subprocess.run([sys.executable, "-m", "kproxy", "demo", "--rules", str(bad), "--out", str(tmp_path / "o")],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert f"{bad}:5: rules[0].bogus" in done.stderr
    assert not (tmp_path / "o").exists()


def test_kproxy_bench_runs_its_plain_paths_on_noida(tmp_path):
    out = tmp_path / "bench.json"
    run = subprocess.run(
        [sys.executable, "-m", "kproxy", "bench", "--broker", "noida", "--rounds", "1", "--batched-records", "2000",
         "--small-records", "500", "--latency-seconds", "0.3", "--consume-passes", "1", "--no-memory",
         "--out", str(out), "--work-dir", str(tmp_path / "work")],
        capture_output=True, text=True, timeout=180,
    )
    assert run.returncode == 0, run.stderr[-2000:]
    result = json.loads(out.read_text())
    assert set(result["paths"]) == {"direct", "proxy"}
    assert all(path["batched_produce"]["records_per_s"] > 0 for path in result["paths"].values())
    assert "noida-db" in (tmp_path / "work" / "broker.log").read_text()


def test_kproxy_bench_keeps_haproxy_paths_on_tansu():
    run = subprocess.run([sys.executable, "-m", "kproxy", "bench", "--broker", "noida", "--reference"],
                         capture_output=True, text=True, timeout=60)
    assert run.returncode == 2 and "--reference and --tls run on tansu" in run.stderr


@pytest.mark.parametrize("bootstrap", ["127.0.0.1", "a:1,b:2", "host:0"])
def test_kproxy_demo_takes_one_host_port_as_bootstrap(bootstrap):
    done = subprocess.run([sys.executable, "-m", "kproxy", "demo", "--bootstrap", bootstrap],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "is not one HOST:PORT" in done.stderr


def test_kproxy_demo_fails_at_once_where_no_broker_answers(tmp_path):
    port = free_port()
    done = subprocess.run([sys.executable, "-m", "kproxy", "demo", "--bootstrap", f"127.0.0.1:{port}",
                           "--out", str(tmp_path / "o")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 3
    assert f"cannot connect to the broker at 127.0.0.1:{port}" in done.stderr
    assert not (tmp_path / "o").exists()


def _fetches_on_an_empty_partition(bootstrap: str, seconds: float) -> int:
    """Fetch requests one consumer sends in `seconds` to a partition with nothing to read."""
    import uuid

    from confluent_kafka import Consumer, TopicPartition
    from confluent_kafka.admin import AdminClient, NewTopic

    topic = f"t-empty-{uuid.uuid4().hex[:8]}"
    admin = AdminClient({"bootstrap.servers": bootstrap})
    admin.create_topics([NewTopic(topic, 1, 1)])[topic].result(15)
    counted: list[int] = []

    def on_stats(text: str) -> None:
        brokers = json.loads(text)["brokers"].values()
        counted.append(sum(b["req"].get("Fetch", 0) for b in brokers if b["nodeid"] >= 0))

    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": topic, "fetch.wait.max.ms": 500,
                         "statistics.interval.ms": 500, "stats_cb": on_stats})
    consumer.assign([TopicPartition(topic, 0, 0)])
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        consumer.poll(0.1)
    consumer.poll(0.6)  # one more statistics report
    consumer.close()
    return max(counted, default=0)


def test_noida_answers_an_empty_fetch_at_once_and_tansu_waits(any_broker: EmbeddedBroker):
    fetches = _fetches_on_an_empty_partition(any_broker.bootstrap, 2.0)
    # With MaxWaitMs 500 a broker that waits answers about 4 times in 2 s; noida answers thousands.
    if any_broker.kind == "noida":
        assert fetches > 500
    else:
        assert 0 < fetches < 50


def test_cluster_facts_read_from_metadata_match_describe_cluster(any_broker: EmbeddedBroker):
    # A broker without DescribeCluster is read through Metadata instead; both must tell the same cluster.
    from kproxy.brokers.identify import _api_versions, _cluster, _Connection
    from kproxy.protocol import apis

    conn = _Connection(any_broker.host, any_broker.port, 5.0)
    try:
        table = {int(a.api_key): (int(a.min_version), int(a.max_version)) for a in _api_versions(conn).api_keys}
        assert apis.DESCRIBE_CLUSTER in table
        described = _cluster(conn, table)
        without = {key: versions for key, versions in table.items() if key != apis.DESCRIBE_CLUSTER}
        assert _cluster(conn, without) == described
    finally:
        conn.close()


def test_kproxy_broker_refuses_to_advertise_what_noida_cannot():
    done = subprocess.run([sys.executable, "-m", "kproxy", "broker", "--kind", "noida", "--port", "0",
                           "--advertise", "broker.example"], capture_output=True, text=True, timeout=30)
    assert done.returncode == 1 and "noida-db advertises the address it listens on" in done.stderr
