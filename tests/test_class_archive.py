"""The archive of Spark's classes (kproxy_spark.class_archive): written once,
mapped by every later driver JVM, never half-written where a JVM would map it."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest

from kproxy_spark import class_archive
from kproxy_spark.class_archive import ClassArchive, _take, archive_path, write


def test_one_process_writes_the_archive_and_a_dead_writers_lock_is_taken_over(tmp_path):
    lock = tmp_path / "a.jsa.lock"
    assert _take(lock) and lock.read_text() == str(os.getpid())
    assert not _take(lock)  # this process is alive: it is still writing
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(dead.stdout.strip())
    assert _take(lock) and lock.read_text() == str(os.getpid())
    lock.write_text("")  # a writer that has just made its lock and not yet named itself
    assert not _take(lock)


def test_options_map_an_archive_write_a_missing_one_or_are_none(tmp_path, monkeypatch):
    monkeypatch.setenv("KPROXY_CLASS_ARCHIVE_DIR", str(tmp_path))
    path = archive_path()
    assert path is not None and path.parent == tmp_path and path.name.startswith("spark-")
    assert ClassArchive.for_driver(may_write=False).java_options() == []  # none yet, and this one may not write
    killed = path.with_name(path.name + ".1.part")  # what a writer killed before its exit left
    killed.write_bytes(b"half an archive")
    writer = ClassArchive.for_driver(may_write=True)
    assert not killed.exists()
    [dump, quiet] = writer.java_options()
    assert dump == f"-XX:ArchiveClassesAtExit={path}.{os.getpid()}.part" and quiet == class_archive.QUIET
    assert ClassArchive.for_driver(may_write=True).java_options() == []  # the first writer holds the lock
    path.write_bytes(b"an archive")
    assert ClassArchive.for_driver(may_write=True).java_options() == [
        f"-XX:SharedArchiveFile={path}", "-Xshare:auto", class_archive.QUIET]
    monkeypatch.setenv("KPROXY_CLASS_ARCHIVE", "off")
    assert archive_path() is None and ClassArchive.for_driver(may_write=True).java_options() == []


_MAPPED = """
import os, subprocess
from kproxy_spark.session import get_session
spark = get_session("local[1]", quick_start=True)
jvm = subprocess.run(["pgrep", "-P", str(os.getpid()), "java"], capture_output=True, text=True).stdout.split()[0]
print(open(f"/proc/{jvm}/maps").read())
"""


@pytest.mark.spark
def test_a_driver_jvm_maps_the_written_archive():
    # The machine's own archive (`make test` writes it before the suite; written here if not).
    path = write()
    assert path is not None and path.is_file() and path.stat().st_size > 1_000_000
    assert not list(path.parent.glob(path.name + ".*")), "a lock or partial archive was left behind"
    maps = subprocess.run([sys.executable, "-c", _MAPPED], capture_output=True, text=True, timeout=120)
    assert maps.returncode == 0, maps.stderr[-2000:]
    assert str(path) in maps.stdout, "the driver JVM did not map the archive"
    assert "cds" not in maps.stderr.lower(), maps.stderr[-2000:]


def test_only_the_most_recent_archives_are_kept(tmp_path):
    for age, name in enumerate(["spark-a.jsa", "spark-b.jsa", "spark-c.jsa", "spark-d.jsa", "spark-e.jsa"]):
        (tmp_path / name).write_bytes(b"x")
        os.utime(tmp_path / name, (1_000_000 + age, 1_000_000 + age))
    (tmp_path / "other.txt").write_text("not an archive")
    class_archive._prune(tmp_path / "spark-e.jsa")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other.txt", "spark-c.jsa", "spark-d.jsa", "spark-e.jsa"]


def test_a_cache_it_cannot_write_leaves_the_driver_without_an_archive(tmp_path, monkeypatch):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    monkeypatch.setenv("KPROXY_CLASS_ARCHIVE_DIR", str(blocked / "class-archive"))
    assert ClassArchive.for_driver(may_write=True).java_options() == []


def test_jars_written_again_name_another_archive(tmp_path, monkeypatch):
    # A venv made again at the same path: the JVM would refuse the old archive over the new jars.
    import pyspark

    jars = tmp_path / "pyspark" / "jars"
    jars.mkdir(parents=True)
    (jars / "spark-core.jar").write_bytes(b"classes")
    monkeypatch.setattr(pyspark, "__file__", str(tmp_path / "pyspark" / "__init__.py"))
    monkeypatch.setenv("KPROXY_CLASS_ARCHIVE_DIR", str(tmp_path / "archives"))
    first = archive_path()
    os.utime(jars / "spark-core.jar", ns=(1_000_000_000, 1_000_000_000))
    assert archive_path() != first


def test_a_writer_s_lock_is_waited_for_until_its_process_is_gone(tmp_path):
    lock = tmp_path / "a.jsa.lock"
    writer = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(0.6)"])
    lock.write_text(str(writer.pid))
    begun = time.monotonic()
    class_archive._wait_for_writer(lock, timeout=30)  # it exits unreaped: a zombie writes nothing
    assert 0.4 <= time.monotonic() - begun < 10
    assert writer.wait(1) == 0
    lock.write_text("")  # a lock whose writer has not named itself yet is waited for, up to the timeout
    begun = time.monotonic()
    class_archive._wait_for_writer(lock, timeout=0.5)
    assert 0.5 <= time.monotonic() - begun < 5
    lock.unlink()
    class_archive._wait_for_writer(lock, timeout=30)  # no lock: no writer


@pytest.mark.spark
def test_a_process_whose_driver_runs_takes_no_right_to_write_the_archive(spark, tmp_path, monkeypatch):
    from kproxy.testing.verdict import SMALL_TRACE_CONF
    from kproxy_spark.session import get_session

    monkeypatch.setenv("KPROXY_CLASS_ARCHIVE_DIR", str(tmp_path))
    # A one-off run's settings in a process that already has a driver: it is handed that one, starts no
    # JVM, so it neither writes the archive nor keeps others from writing it until the process exits.
    # (With the shared session's own settings: getOrCreate sets them on the session every test uses.)
    assert get_session("local[2]", quick_start=True, conf=SMALL_TRACE_CONF) is spark
    assert list(tmp_path.iterdir()) == []
