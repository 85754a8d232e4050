"""Where Apache Kafka's jars come from: a Kafka download, or Maven Central through `mvn`.

A download (`--kafka-home DIR`) is used as it is: its `libs/` is the classpath.
Otherwise `mvn` resolves `org.apache.kafka:kafka_2.13:V` (the broker) or
`org.apache.kafka:kafka-clients:V` (the Java client) with their runtime
dependencies into a per-version cache, once per machine:

    $XDG_CACHE_HOME/kproxy/kafka/V/broker/lib/*.jar   (default ~/.cache/...)
    $XDG_CACHE_HOME/kproxy/kafka/V/client/lib/*.jar

A cache directory counts only once its `jars.txt` (the classpath, written
last) exists, so an interrupted download is redone, never half used. A lock
file keeps two processes from resolving the same version at once.

Maven Central's Kafka poms name no logging backend (the distribution adds
one), so slf4j-simple is resolved beside them: the broker's log goes to its
stderr, which the launcher writes to a file under the run's directory.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from kproxy.brokers.process import BrokerError

GROUP = "org.apache.kafka"
BROKER_ARTIFACT = "kafka_2.13"
CLIENT_ARTIFACT = "kafka-clients"
# The logging backend added to Maven Central's jars; 1.7.x matches the
# slf4j-api every Kafka release from 3.x to 4.x depends on.
SLF4J_SIMPLE = ("org.slf4j", "slf4j-simple", "1.7.36")
MIN_JAVA = 17
# The newest Kafka on Maven Central when kproxy was last measured against it
# (docs/kafka-versions.md): the default broker and Java client version.
DEFAULT_VERSION = "4.4.0"
VERSION_RE = re.compile(r"^\d+\.\d+\.\d+(?:-[A-Za-z0-9.]+)?$")
MVN_TIMEOUT = 900.0

Say = Callable[[str], None]


class KafkaSetupError(BrokerError):
    """Something Apache Kafka needs is missing or could not be fetched; the message names it."""


@dataclass(frozen=True)
class Java:
    path: str
    major: int


@dataclass(frozen=True)
class KafkaJars:
    """A classpath and where it came from."""

    version: str
    classpath: tuple[Path, ...]
    source: str  # "kafka-home DIR" or "maven cache DIR"
    home: Path | None = None  # a Kafka download, whose config/ may hold its logging setup

    @property
    def classpath_arg(self) -> str:
        return os.pathsep.join(str(p) for p in self.classpath)


def cache_root() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kproxy" / "kafka"


def check_version(version: str) -> str:
    if not VERSION_RE.match(version):
        raise KafkaSetupError(f"not a Kafka version: {version!r} (expected e.g. 4.1.0 or 3.9.1)")
    return version


def major_minor(version: str) -> tuple[int, int]:
    parts = check_version(version).split("-")[0].split(".")
    return int(parts[0]), int(parts[1])


# --- preflight ------------------------------------------------------------------

def find_java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(Path(home) / "bin" / "java", os.X_OK):
        return str(Path(home) / "bin" / "java")
    return shutil.which("java")


def java_major(java: str) -> int | None:
    """The feature version `java -version` reports (8 for 1.8.0_x), or None if it does not run."""
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r'version "(\d+)(?:\.(\d+))?', out.stderr + out.stdout)
    if not match:
        return None
    first = int(match.group(1))
    return int(match.group(2) or 0) if first == 1 else first


def find_mvn() -> str | None:
    return shutil.which("mvn")


def home_version(home: Path) -> str | None:
    """The Kafka version of a download, from its kafka-clients jar's name."""
    for jar in sorted((home / "libs").glob(f"{CLIENT_ARTIFACT}-*.jar")):
        version = jar.stem[len(CLIENT_ARTIFACT) + 1:]
        if VERSION_RE.match(version):
            return version
    return None


def preflight(*, kafka_home: Path | None = None, version: str | None = None, part: str = "broker") -> Java:
    """Check, without downloading anything, that Kafka can run here; name everything missing at once.

    Java 17+ is always needed; `mvn` only when neither a Kafka download nor a
    complete cache entry for `version` provides the jars.
    """
    missing: list[str] = []
    java_path = find_java()
    major = java_major(java_path) if java_path else None
    if java_path is None:
        missing.append("Java 17+ (no `java` on PATH or in $JAVA_HOME; install openjdk-17-jre-headless)")
    elif major is None:
        missing.append(f"Java 17+ ({java_path} -version did not run)")
    elif major < MIN_JAVA:
        missing.append(f"Java 17+ ({java_path} is Java {major}; install openjdk-17 or point JAVA_HOME at one)")
    if kafka_home is not None:
        if not (kafka_home / "libs").is_dir() or home_version(kafka_home) is None:
            missing.append(f"a Kafka download at --kafka-home {kafka_home} (no libs/kafka-clients-*.jar there)")
    elif version is not None and cached(version, part) is not None:
        pass
    elif find_mvn() is None:
        missing.append("mvn, to fetch Kafka's jars from Maven Central (install maven), or --kafka-home DIR")
    if version is not None:
        check_version(version)
    if missing:
        raise KafkaSetupError("Apache Kafka cannot run here; missing: " + "; ".join(missing))
    assert java_path is not None and major is not None
    return Java(java_path, major)


# --- the cache --------------------------------------------------------------------

def part_dir(version: str, part: str) -> Path:
    return cache_root() / check_version(version) / part


def cached(version: str, part: str) -> KafkaJars | None:
    directory = part_dir(version, part)
    listing = directory / "jars.txt"
    if not listing.is_file():
        return None
    jars = tuple(directory / "lib" / name for name in listing.read_text().split())
    if not jars or not all(j.is_file() for j in jars):
        return None
    return KafkaJars(version, jars, f"maven cache {directory}")


@contextlib.contextmanager
def locked(path: Path) -> Iterator[None]:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def _pom(artifacts: list[tuple[str, str, str]]) -> str:
    deps = "\n".join(
        f"    <dependency><groupId>{g}</groupId><artifactId>{a}</artifactId><version>{v}</version></dependency>"
        for g, a, v in artifacts)
    return f"""<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>kproxy.local</groupId>
  <artifactId>kafka-jars</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencies>
{deps}
  </dependencies>
</project>
"""


_DOWNLOADED = re.compile(r"Downloaded from \S+: \S+ \(([\d.]+) (B|kB|MB|GB)")
_UNITS = {"B": 1, "kB": 1e3, "MB": 1e6, "GB": 1e9}


def _run_mvn(mvn: str, work: Path, out_dir: Path, say: Say, what: str) -> None:
    cmd = [mvn, "-B", "-f", str(work / "pom.xml"), "dependency:copy-dependencies",
           "-DincludeScope=runtime", f"-DoutputDirectory={out_dir}"]
    files, size, last = 0, 0.0, time.monotonic()
    tail: list[str] = []
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, cwd=work)
    assert proc.stdout is not None
    deadline = time.monotonic() + MVN_TIMEOUT
    try:
        for line in proc.stdout:
            line = line.rstrip()
            tail = (tail + [line])[-40:]
            match = _DOWNLOADED.search(line)
            if match:
                files += 1
                size += float(match.group(1)) * _UNITS[match.group(2)]
                if time.monotonic() - last > 2.0:
                    last = time.monotonic()
                    say(f"  {what}: {files} files downloaded ({size / 1e6:.1f} MB) ...")
            if time.monotonic() > deadline:
                proc.kill()
                raise KafkaSetupError(f"mvn took longer than {MVN_TIMEOUT:.0f} s resolving {what}")
        rc = proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    if rc != 0:
        errors = [line for line in tail if line.startswith("[ERROR]") and line.strip() != "[ERROR]"]
        detail = "\n".join(errors[:6]) or "\n".join(tail[-10:])
        raise KafkaSetupError(f"mvn could not resolve {what} from Maven Central (exit {rc}):\n{detail}")
    if files:
        say(f"  {what}: {files} files downloaded ({size / 1e6:.1f} MB)")


def resolve(version: str, part: str, say: Say = lambda _: None) -> KafkaJars:
    """The cached jars of `part` ("broker" or "client") of Kafka `version`, fetched first if needed."""
    check_version(version)
    artifact = {"broker": BROKER_ARTIFACT, "client": CLIENT_ARTIFACT}[part]
    found = cached(version, part)
    if found is not None:
        return found
    mvn = find_mvn()
    if mvn is None:
        raise KafkaSetupError("mvn is needed to fetch Kafka's jars from Maven Central (install maven), "
                              "or pass --kafka-home DIR")
    directory = part_dir(version, part)
    with locked(directory.parent / f".{part}.lock"):
        found = cached(version, part)  # another process may have finished while we waited
        if found is not None:
            return found
        what = f"{GROUP}:{artifact}:{version}"
        say(f"fetching {what} and its runtime dependencies from Maven Central into {directory}")
        directory.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(prefix=f".{part}-", dir=directory.parent) as tmp:
            work = Path(tmp)
            (work / "pom.xml").write_text(_pom([(GROUP, artifact, version), SLF4J_SIMPLE]))
            _run_mvn(mvn, work, work / "lib", say, what)
            jars = sorted(p.name for p in (work / "lib").glob("*.jar"))
            if not any(name.startswith(f"{artifact}-{version}") for name in jars):
                raise KafkaSetupError(f"mvn finished but {artifact}-{version}.jar is not among the jars")
            if directory.exists():
                shutil.rmtree(directory)
            directory.mkdir()
            (work / "lib").rename(directory / "lib")
            (directory / "jars.txt").write_text("\n".join(jars) + "\n")
    found = cached(version, part)
    assert found is not None
    say(f"{len(found.classpath)} jars cached in {directory}")
    return found


def from_home(home: Path, version: str | None = None) -> KafkaJars:
    """The classpath of a Kafka download (its libs/)."""
    home = home.expanduser().resolve()
    found = home_version(home)
    if found is None:
        raise KafkaSetupError(f"--kafka-home {home}: no libs/kafka-clients-*.jar, not a Kafka download")
    if version is not None and version != found:
        raise KafkaSetupError(f"--kafka-home {home} is Kafka {found}, not the requested {version}")
    jars = tuple(sorted((home / "libs").glob("*.jar")))
    return KafkaJars(found, jars, f"kafka-home {home}", home=home)


def broker_jars(version: str | None, kafka_home: Path | None = None, say: Say = lambda _: None) -> KafkaJars:
    if kafka_home is not None:
        return from_home(kafka_home, version)
    if version is None:
        raise KafkaSetupError("a Kafka version (--version) or a Kafka download (--kafka-home) is needed")
    return resolve(version, "broker", say)


def client_jars(version: str, kafka_home: Path | None = None, say: Say = lambda _: None) -> KafkaJars:
    """kafka-clients and its dependencies; a download's libs/ has them too."""
    if kafka_home is not None:
        return from_home(kafka_home, None)
    return resolve(version, "client", say)


def main(argv: list[str] | None = None) -> int:
    """`python -m kproxy.kafka.jars [VERSION ...]`: fetch the broker's and the Java client's jars ahead of use."""
    import sys

    versions = (sys.argv[1:] if argv is None else argv) or [DEFAULT_VERSION]
    try:
        for version in versions:
            preflight(version=version)
            for part in ("broker", "client"):
                found = resolve(version, part, say=lambda text: print(text, file=sys.stderr, flush=True))
                print(f"kafka {version} {part}: {found.source}", file=sys.stderr)
    except KafkaSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
