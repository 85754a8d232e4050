"""An archive of the Spark driver's classes, written once and mapped by every
later driver JVM started here.

A cold analysis loads Spark's classes from some 250 jars; the JVM's
class-data sharing maps them from one file instead, already parsed and
verified. Measured on the 10-operation input with traces: Spark's start
3.4-3.7 s -> 1.7-1.9 s, the whole `kproxy analyze` 12.8-13.5 s -> 10.0-10.4 s
(docs/performance-analysis.md, "Classes from an archive").

The archive belongs to one Java and one Spark install: its name hashes both.
The first one-off analysis that finds none writes it as its JVM exits
(`-XX:ArchiveClassesAtExit`, a few seconds more, once); the process waits
for that and moves the finished file into place, so a half-written archive
is never mapped. While one process writes it, others run without. A JVM
that cannot map an archive (another Java, a damaged file) runs without it,
silently (`-Xshare:auto`). KPROXY_CLASS_ARCHIVE=off turns it off.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from kproxy.brokers.process import pid_alive

#: Bumped when the options below change what an archive holds.
FORMAT = "1"
#: How long a process waits at exit for its JVM to write the archive.
WRITE_WAIT_S = 120.0
#: The JVM's notes about classes it cannot archive (signed jars, old class
#: versions) are not the user's business.
QUIET = "-Xlog:cds*=off"


def archive_dir() -> Path:
    if os.environ.get("KPROXY_CLASS_ARCHIVE_DIR"):
        return Path(os.environ["KPROXY_CLASS_ARCHIVE_DIR"])
    cache = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "kproxy" / "class-archive"


def _java() -> str | None:
    home = os.environ.get("JAVA_HOME")
    java = shutil.which("java", path=os.path.join(home, "bin")) if home else shutil.which("java")
    return os.path.realpath(java) if java else None


def archive_path() -> Path | None:
    """Where this Java and this Spark's archive is (or would be); None when
    turned off or no Java is found."""
    if os.environ.get("KPROXY_CLASS_ARCHIVE", "on") == "off":
        return None
    java = _java()
    if java is None:
        return None
    import pyspark

    jars = Path(pyspark.__file__).parent / "jars"
    digest = hashlib.sha256()
    stat = os.stat(java)
    # The JVM maps an archive only over the very jars it was written from (their
    # paths, sizes and times): a venv made again at the same path needs a new one.
    listed = sorted((j.name, j.stat().st_size, j.stat().st_mtime_ns) for j in jars.iterdir()) if jars.is_dir() else []
    for part in (FORMAT, java, stat.st_size, stat.st_mtime_ns, pyspark.__version__, jars, *listed):
        digest.update(f"{part}\0".encode())
    return archive_dir() / f"spark-{pyspark.__version__}-{digest.hexdigest()[:16]}.jsa"


@dataclass
class ClassArchive:
    """The JVM options for one driver: map the archive, or write it."""

    path: Path | None
    writing: Path | None = None  # the partial file this process's JVM writes at its exit

    @classmethod
    def for_driver(cls, may_write: bool) -> ClassArchive:
        path = archive_path()
        if path is None or path.is_file():
            return cls(path)
        if not may_write:
            return cls(None)
        partial = path.with_name(f"{path.name}.{os.getpid()}.part")
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            taken = _take(path.with_name(path.name + ".lock"))
        except OSError:  # a cache it cannot write (a read-only home): run without
            return cls(None)
        if not taken:
            return cls(None)
        for left in path.parent.glob(path.name + ".*.part"):  # a killed writer's
            with contextlib.suppress(OSError):
                left.unlink()
        return cls(path, partial)

    def java_options(self) -> list[str]:
        if self.path is None:
            return []
        if self.writing is not None:
            return [f"-XX:ArchiveClassesAtExit={self.writing}", QUIET]
        return [f"-XX:SharedArchiveFile={self.path}", "-Xshare:auto", QUIET]

    def started(self, session: Any) -> None:
        """After the driver started: when it writes the archive, wait for its
        JVM at this process's exit and move the archive into place."""
        if self.writing is None:
            return
        process = getattr(session.sparkContext._gateway, "proc", None)
        atexit.register(self._finish, session, process)

    def _finish(self, session: Any, process: Any) -> None:
        assert self.path is not None and self.writing is not None
        lock = self.path.with_name(self.path.name + ".lock")
        try:
            if process is not None and process.poll() is None:
                # Stopped first: a JVM that left under a running context would
                # break its accumulator connection, and PySpark would say so.
                with contextlib.suppress(Exception):
                    session.stop()
                # PySpark's gateway exits when its stdin closes; the JVM writes the archive as it exits.
                with contextlib.suppress(OSError):
                    process.stdin.close()
                process.wait(timeout=WRITE_WAIT_S)
            if process is not None and process.returncode == 0 and self.writing.is_file() \
                    and self.writing.stat().st_size > 0:
                os.replace(self.writing, self.path)
                _prune(self.path)
        except Exception:  # noqa: BLE001 - an archive not written is only a slower next start
            pass
        finally:
            with contextlib.suppress(OSError):
                self.writing.unlink()
            with contextlib.suppress(OSError):
                lock.unlink()


#: Archives kept side by side (one per Java and Spark install: a venv of its own each, an upgrade).
KEEP = 3


def _prune(newest: Path) -> None:
    """Drop all but the KEEP most recently written archives: each is 170 MB or more."""
    archives = sorted(newest.parent.glob("spark-*.jsa"), key=lambda p: p.stat().st_mtime, reverse=True)
    for old in archives[KEEP:]:
        with contextlib.suppress(OSError):
            old.unlink()


def _held(lock: Path) -> bool:
    """Whether a writer holds `lock`: it names a live process, or names none
    yet and is fresh (its writer has just made it)."""
    try:
        owner = int(lock.read_text() or "0")
        age = time.time() - lock.stat().st_mtime
    except (OSError, ValueError):
        return False
    return pid_alive(owner) if owner else age < 60


def _take(lock: Path) -> bool:
    """The right to write the archive: a lock file naming its pid; one whose
    process is gone is taken over."""
    for _ in range(2):
        try:
            fd = os.open(lock, os.O_CREAT | os.O_EXCL | os.O_WRONLY, 0o644)
        except FileExistsError:
            if _held(lock):
                return False
            with contextlib.suppress(OSError):
                lock.unlink()
            continue
        with os.fdopen(fd, "w") as out:
            out.write(str(os.getpid()))
        return True
    return False


def _wait_for_writer(lock: Path, timeout: float) -> None:
    """Until no writer holds `lock` (or `timeout`)."""
    deadline = time.monotonic() + timeout
    while _held(lock) and time.monotonic() < deadline:
        time.sleep(0.2)


def write() -> Path | None:
    """Write this Java and Spark's archive if there is none: a local session
    that runs one small analysis (the engine's warm-up), so the archive holds
    what an analysis loads. Returns the archive's path (None when turned off)."""
    path = archive_path()
    if path is None or path.is_file():
        return path
    import subprocess
    import sys

    # A process of its own: the archive is written as its JVM exits.
    code = ("from kproxy_spark.session import get_session; from kproxy.engine.warm_up import warm_up; "
            "warm_up(get_session('local[2]', app_name='kproxy-class-archive', quick_start=True))")
    for _ in range(2):
        done = subprocess.run([sys.executable, "-c", code], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                              text=True)
        if done.returncode != 0 or path.is_file():
            break
        # Another driver held the right to write it (one starting at the same
        # time): its archive comes when its JVM exits, unless that JVM exits
        # badly (killed, or a cluster's driver), and then this one tries again.
        _wait_for_writer(path.with_name(path.name + ".lock"), WRITE_WAIT_S)
        if path.is_file():
            break
    if done.returncode != 0 or not path.is_file():
        raise RuntimeError(f"the class archive {path} was not written (exit {done.returncode}; another process"
                           f" may be writing it):\n{done.stderr[-3000:]}")
    return path


if __name__ == "__main__":
    written = write()
    print(f"class archive: {written}" if written else "class archive: turned off (KPROXY_CLASS_ARCHIVE=off)")
