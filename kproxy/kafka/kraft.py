"""A local Apache Kafka cluster in KRaft mode: one combined node, or N nodes on loopback.

Every node is a combined broker and controller (`process.roles=broker,controller`)
with a static voter set, so the same properties work from Kafka 3.6 to 4.x.
Storage is formatted under the run's directory (a temporary one by default,
removed at stop); each node's log is `node-I/kafka.log` there.

One-machine settings: internal topics replicated to every node up to 3, with
a minimum ISR one less than that (so one node may stop while transactions go
on), few internal-topic partitions (fast start), no initial rebalance delay.
On 4.x the storage is formatted with `transaction.version=2` (KIP-890 part 2)
unless another version is asked for.
"""

from __future__ import annotations

import base64
import logging
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from kproxy.brokers.process import free_port, spawn, wait_or_kill
from kproxy.jvm_options import QUICK_JIT
from kproxy.kafka.jars import (
    KafkaJars,
    KafkaSetupError,
    Say,
    broker_jars,
    major_minor,
    preflight,
)

log = logging.getLogger(__name__)

INTERNAL_PARTITIONS = 5
STARTUP_TIMEOUT = 120.0
STOP_TIMEOUT = 20.0


class KafkaStartError(KafkaSetupError):
    """A node did not come up; the message quotes its log."""


def new_cluster_id() -> str:
    """Kafka's cluster ids are 16 random bytes in URL-safe base64 without padding.

    Never one that starts with "-": the storage tool's argument parser takes
    it for an option and refuses the format (one id in 64; Kafka's own
    Uuid.randomUuid() draws again for the same reason).
    """
    while True:
        cluster_id = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not cluster_id.startswith("-"):
            return cluster_id


def default_transaction_version(version: str) -> int | None:
    """2 on 4.x (KIP-890 part 2); None before 4.0, whose storage tool has no feature flags to set."""
    return 2 if major_minor(version) >= (4, 0) else None


def server_properties(node_id: int, host: str, port: int, controller_port: int, advertise: str,
                      advertise_port: int, voters: str, nodes: int, data_dir: Path) -> dict[str, str]:
    replicas = min(nodes, 3)
    min_isr = max(1, replicas - 1)
    return {
        "node.id": str(node_id),
        "process.roles": "broker,controller",
        "controller.quorum.voters": voters,
        "listeners": f"PLAINTEXT://{host}:{port},CONTROLLER://{host}:{controller_port}",
        "advertised.listeners": f"PLAINTEXT://{advertise}:{advertise_port}",
        "controller.listener.names": "CONTROLLER",
        "inter.broker.listener.name": "PLAINTEXT",
        "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
        "log.dirs": str(data_dir),
        "num.partitions": "1",
        "default.replication.factor": str(replicas),
        "min.insync.replicas": str(min_isr),
        "offsets.topic.replication.factor": str(replicas),
        "offsets.topic.num.partitions": str(INTERNAL_PARTITIONS),
        "transaction.state.log.replication.factor": str(replicas),
        "transaction.state.log.min.isr": str(min_isr),
        "transaction.state.log.num.partitions": str(INTERNAL_PARTITIONS),
        "share.coordinator.state.topic.replication.factor": str(replicas),
        "share.coordinator.state.topic.min.isr": str(min_isr),
        "group.initial.rebalance.delay.ms": "0",
        # A stopped node's partitions move within seconds, not the default 18 s.
        "broker.session.timeout.ms": "6000",
        "broker.heartbeat.interval.ms": "1000",
        "auto.create.topics.enable": "true",
    }


def _write_properties(path: Path, props: dict[str, str]) -> None:
    path.write_text("".join(f"{k}={v}\n" for k, v in props.items()))


def _tail(path: Path, lines: int = 15) -> str:
    try:
        text = path.read_text(errors="replace").splitlines()
    except OSError:
        return "(no log)"
    interesting = [line for line in text if " ERROR " in line or "Exception" in line or "Error:" in line]
    return "\n".join((interesting or text)[-lines:])


@dataclass
class KafkaNode:
    node_id: int
    host: str
    port: int
    controller_port: int
    directory: Path
    command: list[str]
    env: dict[str, str]
    process: subprocess.Popen[bytes] | None = None

    @property
    def log_path(self) -> Path:
        return self.directory / "kafka.log"

    @property
    def bootstrap(self) -> str:
        return f"{self.host}:{self.port}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self) -> None:
        """Start (or restart) this node's JVM; its log is appended to."""
        if self.alive():
            return
        self.process = spawn(self.command, self.log_path, env=self.env, new_session=True, stdin=subprocess.DEVNULL)

    def signal_stop(self) -> None:
        if self.alive():
            assert self.process is not None
            self.process.send_signal(signal.SIGTERM)

    def wait_stopped(self, timeout: float) -> None:
        if self.process is None:
            return
        if wait_or_kill(self.process, max(0.0, timeout), kill_wait=10):
            log.warning("kafka node %d did not stop within %.0f s of SIGTERM; killed it", self.node_id, timeout)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        self.signal_stop()
        self.wait_stopped(timeout)


@dataclass
class KafkaCluster:
    version: str
    cluster_id: str
    nodes: list[KafkaNode]
    directory: Path
    jars: KafkaJars
    transaction_version: int | None
    remove_directory: bool = False
    stopped: bool = field(default=False, init=False)

    @property
    def bootstrap(self) -> str:
        return ",".join(n.bootstrap for n in self.nodes)

    @property
    def host(self) -> str:
        return self.nodes[0].host

    @property
    def port(self) -> int:
        return self.nodes[0].port

    def alive(self) -> bool:
        return any(n.alive() for n in self.nodes)

    def stop(self, timeout: float = STOP_TIMEOUT) -> None:
        """SIGTERM every node at once (a lone survivor would wait for a quorum), then wait for each."""
        if self.stopped:
            return
        self.stopped = True
        for node in self.nodes:
            node.signal_stop()
        deadline = time.monotonic() + timeout
        for node in self.nodes:
            node.wait_stopped(deadline - time.monotonic())
        if self.remove_directory:
            shutil.rmtree(self.directory, ignore_errors=True)

    def __enter__(self) -> KafkaCluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()


def _java_command(java: str, jars: KafkaJars, main: str, args: list[str], log_dir: Path) -> list[str]:
    heap = os.environ.get("KAFKA_HEAP_OPTS", "-Xms128m -Xmx512m").split()
    # The quick JIT tier: a broker for a run or a test session serves little, and the optimising compiler
    # cost it 1.5 s more CPU to start (3.2-3.5 s against 2.0 s, ready in 4.3-7.9 s against 2.7-3.9 s).
    cmd = [java, *heap, "-XX:+UseSerialGC", *QUICK_JIT, "-Djava.awt.headless=true",
           "-Dkafka.logs.dir=" + str(log_dir)]
    if jars.home is not None:  # a download's own logging setup (log4j 1 before 4.0, log4j2 since)
        for prop, name in (("log4j.configuration", "log4j.properties"), ("log4j2.configurationFile", "log4j2.yaml")):
            config = jars.home / "config" / name
            if config.is_file():
                cmd.append(f"-D{prop}={'file:' if prop == 'log4j.configuration' else ''}{config}")
    else:
        cmd += ["-Dorg.slf4j.simpleLogger.showDateTime=true",
                "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
                "-Dorg.slf4j.simpleLogger.defaultLogLevel=info"]
    return [*cmd, "-cp", jars.classpath_arg, main, *args]


def _format(java: str, jars: KafkaJars, nodes: list[KafkaNode], cluster_id: str,
            transaction_version: int | None, env: dict[str, str], extra_args: Sequence[str] = ()) -> None:
    """Format every node's storage, in parallel (a JVM each)."""
    running = []
    for node in nodes:
        args = ["format", "-t", cluster_id, "-c", str(node.directory / "server.properties"), *extra_args]
        if transaction_version is not None:
            args += ["--feature", f"transaction.version={transaction_version}"]
        cmd = _java_command(java, jars, "kafka.tools.StorageTool", args, node.directory)
        out = open(node.directory / "format.log", "wb")
        running.append((node, subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env,
                                               stdin=subprocess.DEVNULL), out))
    failures = []
    for node, proc, out in running:
        try:
            rc = proc.wait(STARTUP_TIMEOUT)
        except subprocess.TimeoutExpired:
            proc.kill()
            rc = proc.wait()
        out.close()
        if rc != 0:
            failures.append(f"node {node.node_id} (exit {rc}): {_tail(node.directory / 'format.log', 5)}")
    if failures:
        raise KafkaStartError("formatting Kafka's storage failed: " + "; ".join(failures))


def _ready_brokers(bootstrap: str, timeout: float) -> int:
    """How many brokers the cluster's metadata lists (unfenced ones only, in KRaft)."""
    from confluent_kafka.admin import AdminClient

    from kproxy.protocol.endpoints import parse_endpoint

    address = parse_endpoint(bootstrap, default_host=None)
    try:
        with socket.create_connection((address.host, address.port), timeout=timeout):
            pass
    except OSError:
        return 0
    admin = AdminClient({"bootstrap.servers": bootstrap, "socket.timeout.ms": max(1000, int(timeout * 1000)),
                         "log_level": 0})
    try:
        return len(admin.list_topics(timeout=timeout).brokers)
    except Exception:  # not answering yet
        return 0


def wait_ready(cluster: KafkaCluster, timeout: float, nodes: list[KafkaNode] | None = None) -> None:
    """Until the metadata of every node in `nodes` (default all) lists all of the cluster's live brokers."""
    nodes = nodes or cluster.nodes
    expected = sum(1 for n in cluster.nodes if n.alive())
    deadline = time.monotonic() + timeout
    while True:
        for node in nodes:
            if not node.alive():
                raise KafkaStartError(f"kafka node {node.node_id} exited with status "
                                      f"{node.process.returncode if node.process else '?'}; "
                                      f"its log {node.log_path} ends:\n{_tail(node.log_path)}")
        if all(_ready_brokers(n.bootstrap, 1.0) >= expected for n in nodes):
            return
        if time.monotonic() > deadline:
            raise KafkaStartError(f"kafka did not list {expected} brokers within {timeout:.0f} s "
                                  f"(logs under {cluster.directory})")
        time.sleep(0.3)


def start_cluster(
    version: str | None = None,
    *,
    nodes: int = 1,
    kafka_home: Path | None = None,
    host: str = "127.0.0.1",
    port: int = 0,
    advertise: str | None = None,
    advertise_port: int | None = None,
    work_dir: Path | None = None,
    transaction_version: int | None | str = "default",
    say: Say = lambda _: None,
    startup_timeout: float = STARTUP_TIMEOUT,
    properties: Mapping[str, str] | None = None,
    format_args: Sequence[str] = (),
) -> KafkaCluster:
    """Format and start an Apache Kafka KRaft cluster; return once every node serves metadata.

    port: the first node's client port (0: a free one); the others take free
    ports. advertise / advertise_port: the address the nodes (the port: the
    first node) tell clients, when something else stands in front of them.
    work_dir: where storage and logs go (default: a temporary directory
    removed at stop; a given one is kept, its old storage replaced). transaction_version: "default" is 2 on 4.x
    and nothing before; an int sets the `transaction.version` feature (4.x).
    properties: added to (or replacing) each node's server.properties, with {host}, {port} and
    {controller_port} filled in per node (a SASL listener, docs/security.md); format_args: more
    arguments to the storage tool's format (`--add-scram ...`).
    """
    if nodes < 1:
        raise KafkaSetupError(f"a cluster needs at least one node, not {nodes}")
    java = preflight(kafka_home=kafka_home, version=version)
    jars = broker_jars(version, kafka_home, say)
    version = jars.version
    if transaction_version == "default":
        transaction_version = default_transaction_version(version)
    elif transaction_version is not None and major_minor(version) < (4, 0):
        raise KafkaSetupError(f"transaction.version is a Kafka 4.x feature; {version} cannot set it")
    remove = work_dir is None
    directory = Path(tempfile.mkdtemp(prefix="kproxy-kafka-")) if work_dir is None else work_dir
    directory.mkdir(parents=True, exist_ok=True)
    ports = [port or free_port(host)] + [free_port(host) for _ in range(nodes - 1)]
    controller_ports = [free_port(host) for _ in range(nodes)]
    voters = ",".join(f"{i + 1}@{host}:{controller_ports[i]}" for i in range(nodes))
    env = {k: v for k, v in os.environ.items() if not k.startswith("KAFKA_")}
    cluster_id = new_cluster_id()
    members = []
    for i in range(nodes):
        node_dir = directory / f"node-{i + 1}"
        node_dir.mkdir(exist_ok=True)
        shutil.rmtree(node_dir / "data", ignore_errors=True)  # a fresh cluster, even in a reused directory
        props = server_properties(i + 1, host, ports[i], controller_ports[i], advertise or host,
                                  (advertise_port or ports[i]) if i == 0 else ports[i], voters,
                                  nodes, node_dir / "data")
        for key, value in (properties or {}).items():
            props[key] = value.format(host=host, port=ports[i], controller_port=controller_ports[i])
        _write_properties(node_dir / "server.properties", props)
        command = _java_command(java.path, jars, "kafka.Kafka", [str(node_dir / "server.properties")], node_dir)
        members.append(KafkaNode(i + 1, host, ports[i], controller_ports[i], node_dir, command, env))
    cluster = KafkaCluster(version, cluster_id, members, directory, jars, transaction_version, remove)
    try:
        say(f"formatting {nodes} KRaft node(s) of Kafka {version} under {directory}"
            + (f" (transaction.version={transaction_version})" if transaction_version is not None else ""))
        _format(java.path, jars, members, cluster_id, transaction_version, env, format_args)
        for node in members:
            node.start()
        wait_ready(cluster, startup_timeout)
    except BaseException:
        cluster.remove_directory = False  # the logs explain the failure
        cluster.stop(timeout=5)
        raise
    say(f"Kafka {version} ready on {cluster.bootstrap} ({jars.source})")
    return cluster
