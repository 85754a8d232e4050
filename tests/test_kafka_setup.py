"""Before Apache Kafka runs: the preflight names what is missing at once, bad versions are refused,
and a version Maven Central lacks fails with Maven's own words."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from kproxy.kafka import jars
from kproxy.kafka.jars import KafkaSetupError, check_version, preflight
from tests.fixtures.timing import timed


@pytest.fixture
def bare_path(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """PATH holding only what a test puts there; an empty cache."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    monkeypatch.setenv("PATH", str(bin_dir))
    monkeypatch.delenv("JAVA_HOME", raising=False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return bin_dir


REAL_JAVA = jars.find_java()  # before any test narrows PATH


def _real_java() -> str:
    assert REAL_JAVA, "the test machine has Java 17 (Spark needs it too)"
    return os.path.realpath(REAL_JAVA)


def _failed_preflight() -> pytest.ExceptionInfo[KafkaSetupError]:
    with pytest.raises(KafkaSetupError) as caught:
        preflight(version="4.1.0")
    return caught


def test_preflight_names_everything_missing_in_under_a_second(bare_path: Path) -> None:
    caught, spent = timed(_failed_preflight)
    assert spent.within_a_second(), spent
    message = str(caught.value)
    assert "Java 17+" in message and "mvn" in message and "--kafka-home" in message


def test_preflight_with_java_asks_only_for_mvn(bare_path: Path) -> None:
    (bare_path / "java").symlink_to(_real_java())
    caught, spent = timed(_failed_preflight)
    assert spent.within_a_second(), spent
    assert "mvn" in str(caught.value) and "Java" not in str(caught.value)


def test_preflight_refuses_an_old_java(bare_path: Path) -> None:
    # An old JDK cannot be installed here; a script answering as Java 11 does stands in for one.
    fake = bare_path / "java"
    fake.write_text('#!/bin/sh\necho \'openjdk version "11.0.22" 2024-01-16\' >&2\n')
    fake.chmod(0o755)
    with pytest.raises(KafkaSetupError, match="is Java 11"):
        preflight(kafka_home=None, version="4.1.0")


def test_preflight_checks_a_kafka_home(tmp_path: Path) -> None:
    with pytest.raises(KafkaSetupError, match=r"--kafka-home .*no libs/kafka-clients"):
        preflight(kafka_home=tmp_path)
    (tmp_path / "libs").mkdir()
    (tmp_path / "libs" / "kafka-clients-3.9.1.jar").write_bytes(b"")
    preflight(kafka_home=tmp_path)  # a download needs no mvn
    assert jars.from_home(tmp_path).version == "3.9.1"
    with pytest.raises(KafkaSetupError, match="is Kafka 3.9.1, not the requested 4.1.0"):
        jars.from_home(tmp_path, "4.1.0")


@pytest.mark.parametrize("bad", ["4.1", "latest", "4.1.0</version>", "4.1.0; rm -rf /", ""])
def test_versions_are_checked_before_they_reach_a_pom(bad: str) -> None:
    with pytest.raises(KafkaSetupError, match="not a Kafka version"):
        check_version(bad)


def test_a_version_maven_central_lacks_fails_with_mavens_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    with pytest.raises(KafkaSetupError) as caught:
        jars.resolve("0.0.1", "client")
    message = str(caught.value)
    assert "org.apache.kafka:kafka-clients:0.0.1" in message
    assert "kafka-clients:jar:0.0.1" in message  # Maven's own account of what it could not find
    assert jars.cached("0.0.1", "client") is None


def test_kafka_options_belong_to_the_kafka_kind() -> None:
    from click.testing import CliRunner

    from kproxy.cli import main

    result = CliRunner().invoke(main, ["broker", "--kind", "tansu", "--nodes", "3", "--transaction-version", "0"])
    assert result.exit_code == 2
    assert "--nodes, --transaction-version: for --kind kafka only" in result.output


def test_a_cluster_id_never_starts_with_a_dash(monkeypatch: pytest.MonkeyPatch) -> None:
    """The storage tool's parser takes an id starting with "-" for an option and refuses to format."""
    import uuid

    from kproxy.kafka import kraft

    draws = iter([uuid.UUID(bytes=b"\xf8" + bytes(15)), uuid.UUID(bytes=bytes(range(16)))])
    monkeypatch.setattr(kraft.uuid, "uuid4", lambda: next(draws))
    cluster_id = kraft.new_cluster_id()
    assert cluster_id == "AAECAwQFBgcICQoLDA0ODw" and len(cluster_id) == 22
