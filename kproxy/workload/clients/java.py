"""Apache Kafka's own Java client (`--client java`), through a small JVM bridge.

The bridge (java_bridge/ClientBridge.java) is compiled once with `javac`
against the resolved `org.apache.kafka:kafka-clients` jars and cached beside
them; one bridge process serves every producer, consumer and admin client of
a run, speaking the JSON-lines protocol of kproxy.workload.clients.bridge
(docs/workload.md). Each Java client gets a thread of its own in the bridge,
so a blocking call of one worker never holds up another.

Settings use the Java client's own names (the same dotted names as
librdkafka's where both have them). The client version is
$KPROXY_JAVA_CLIENT_VERSION (default: kproxy.kafka.jars.DEFAULT_VERSION);
$KPROXY_KAFKA_HOME takes the jars from a Kafka download instead.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from kproxy.jvm_options import QUICK_JIT
from kproxy.kafka.jars import (
    DEFAULT_VERSION,
    KafkaJars,
    KafkaSetupError,
    cache_root,
    client_jars,
    locked,
    preflight,
)
from kproxy.workload.clients.bridge import Bridge, BridgeFactory

log = logging.getLogger(__name__)

SOURCE = Path(__file__).with_name("java_bridge") / "ClientBridge.java"

def client_version() -> str:
    return os.environ.get("KPROXY_JAVA_CLIENT_VERSION") or DEFAULT_VERSION


def compiled_bridge(jars: KafkaJars) -> Path:
    """The directory holding ClientBridge.class, compiled against `jars` once per source and version."""
    digest = hashlib.sha256(SOURCE.read_bytes()).hexdigest()[:12]
    target = cache_root() / "client-bridge" / f"{jars.version}-{digest}"
    if (target / "ClientBridge.class").is_file():
        return target
    javac = shutil.which("javac")
    if javac is None:
        raise KafkaSetupError("javac (a JDK 17+, e.g. openjdk-17-jdk-headless) is needed to build the Java client bridge")
    with locked(target.parent / ".lock"):
        if (target / "ClientBridge.class").is_file():
            return target
        with tempfile.TemporaryDirectory(dir=target.parent, prefix=".build-") as tmp:
            done = subprocess.run([javac, "-nowarn", "-d", tmp, "-cp", jars.classpath_arg, str(SOURCE)],
                                  capture_output=True, text=True, timeout=300)
            if done.returncode != 0:
                raise KafkaSetupError(f"javac could not build {SOURCE} against Kafka {jars.version}:\n"
                                      f"{(done.stderr or done.stdout).strip()[-2000:]}")
            Path(tmp).rename(target)
    return target


class JavaFactory(BridgeFactory):
    """The Java client with the bridges' defaults (kproxy.workload.clients.bridge), which are its own names."""

    name = "java"

    def __init__(self, bootstrap: str, producer_overrides: Mapping[str, str],
                 consumer_overrides: Mapping[str, str], version: str | None = None,
                 kafka_home: Path | None = None, admin_overrides: Mapping[str, str] | None = None) -> None:
        home = kafka_home or (Path(os.environ["KPROXY_KAFKA_HOME"]) if os.environ.get("KPROXY_KAFKA_HOME") else None)
        jars = client_jars(version or client_version(), home, say=lambda text: log.info("%s", text))
        super().__init__(java_bridge(jars), bootstrap, producer_overrides, consumer_overrides, admin_overrides)


def java_bridge(jars: KafkaJars) -> Bridge:
    """One JVM running ClientBridge against `jars`."""
    java = preflight(kafka_home=jars.home, version=jars.version, part="client")
    classes = compiled_bridge(jars)
    cmd = [java.path, "-Xmx256m", "-XX:+UseSerialGC", *QUICK_JIT,
           "-Dorg.slf4j.simpleLogger.defaultLogLevel=warn",
           "-cp", os.pathsep.join([str(classes), jars.classpath_arg]), "ClientBridge"]
    return Bridge(cmd, "the java client bridge")
