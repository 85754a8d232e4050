"""Three Apache Kafka nodes on loopback behind the proxy (slow: a 3-node start costs 15-30 s here).

The proxy opens one listener per real broker and every address a client
learns points at it; a node stopped mid-run moves its partitions' leadership
and the transactional workload goes on and reads everything back.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from kproxy.kafka.jars import DEFAULT_VERSION
from kproxy.kafka.kraft import start_cluster, wait_ready
from kproxy.proxy_process import running_proxy
from kproxy.workload.config import WorkloadConfig
from kproxy.workload.runner import run_workload

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def _brokers(bootstrap: str) -> list[tuple[int, str, int]]:
    metadata = AdminClient({"bootstrap.servers": bootstrap}).list_topics(timeout=10)
    return sorted((b.id, b.host, b.port) for b in metadata.brokers.values())


def test_three_nodes_behind_the_proxy_survive_a_stopped_node(tmp_path: Path) -> None:
    with start_cluster(nodes=3, version=DEFAULT_VERSION, work_dir=tmp_path / "kafka") as cluster:
        with running_proxy(cluster.nodes[0].bootstrap, log_path=tmp_path / "kproxy.log") as proxy:
            seen = _brokers(proxy.bootstrap)
            assert [b[0] for b in seen] == [1, 2, 3]
            node_ports = {n.port for n in cluster.nodes}
            assert all(host == proxy.host and port not in node_ports for _, host, port in seen)
            assert len({port for _, _, port in seen}) == 3  # one listener per broker

            moved: dict[str, object] = {}

            def stop_and_restart_a_node() -> None:
                time.sleep(4)
                cluster.nodes[1].stop()
                moved["brokers_while_down"] = [b[0] for b in _brokers(proxy.bootstrap)]
                time.sleep(4)
                cluster.nodes[1].start()
                wait_ready(cluster, 90)
                moved["back"] = True

            mover = threading.Thread(target=stop_and_restart_a_node)
            mover.start()
            summary = run_workload(WorkloadConfig(bootstrap=proxy.bootstrap, client="java", txn=True,
                                                  abort_probability=0.2, duration=14, seed=5,
                                                  final_reads_timeout=30), tmp_path / "history.jsonl",
                                   progress=False)
            mover.join(120)
    assert moved.get("brokers_while_down") == [1, 3] and moved.get("back")
    assert summary.final_reads_caught_up
    assert summary.completions.get("ok", 0) > 20
