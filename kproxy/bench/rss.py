"""Resident memory of a process, and the peak of a process with its descendants.

`kproxy analyze` is a Python process that starts a Spark JVM as its child;
in local mode that JVM is the Spark driver and its executors, and holds
nearly all the memory. Measuring only the Python process (what
`/usr/bin/time` reports) misses it, so the benchmark samples the whole tree.
Linux only: it reads /proc.
"""

from __future__ import annotations

import os
import re
import threading
from collections import Counter
from pathlib import Path

PROC = Path("/proc")


def _status_bytes(pid: int, field: str) -> int:
    try:
        with open(PROC / str(pid) / "status") as status:
            for line in status:
                if line.startswith(field):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0  # gone, or a zombie (no Vm lines)


def rss_bytes(pid: int) -> int:
    """The process's resident set size now; 0 when it is gone."""
    return _status_bytes(pid, "VmRSS:")


def hwm_bytes(pid: int) -> int:
    """The peak resident set size of the process's current program.

    Unlike the rusage of wait4 (and /usr/bin/time), it does not carry the
    parent's memory that a fork copied before the exec: a benchmark that
    holds a generated history in memory would otherwise be counted as
    the analysis's."""
    return _status_bytes(pid, "VmHWM:")


def _parents() -> dict[int, int]:
    """pid -> parent pid of every process now."""
    parents = {}
    for entry in os.scandir(PROC):
        if not entry.name.isdigit():
            continue
        try:
            stat = (PROC / entry.name / "stat").read_text()
        except OSError:
            continue  # exited while we looked
        # The command name (field 2) is in parentheses and may hold spaces.
        fields = stat[stat.rindex(")") + 2:].split()
        parents[int(entry.name)] = int(fields[1])
    return parents


def descendants(pid: int) -> list[int]:
    """The process and every process below it, now."""
    children: dict[int, list[int]] = {}
    for child, parent in _parents().items():
        children.setdefault(parent, []).append(child)
    tree, todo = [], [pid]
    while todo:
        current = todo.pop()
        tree.append(current)
        todo.extend(children.get(current, ()))
    return tree


#: How Linux names (its first 15 characters) the threads of a Spark JVM whose CPU the bench tells apart.
JIT_THREAD_NAMES = ("C1 CompilerThre", "C2 CompilerThre")
TASK_THREAD_NAME = "Executor task l"  # "Executor task launch worker for task N"
_UNNAMED_THREAD = re.compile(r"Thread-\d+")

#: The parts of an analysis's CPU (PeakTreeRss.parts_cpu_s), in the order the bench tells them.
PARTS = ("jit", "planning", "tasks", "jvm other", "python")


def thread_part(name: str) -> str:
    """Which part of a JVM's CPU a thread's is, by its name: its JIT compilers ("jit"); Spark's executor
    tasks ("tasks"); the threads named Thread-N ("planning"), which is how py4j's threads are named: a
    JVM thread serves each Python thread that calls into it, and there the driver's DataFrames are built
    and its jobs planned (a JVM's other unnamed threads are named alike and counted there too); or the
    rest ("jvm other": start-up, the collector, Spark's scheduler and services)."""
    if name.startswith(JIT_THREAD_NAMES):
        return "jit"
    if name.startswith(TASK_THREAD_NAME):
        return "tasks"
    if _UNNAMED_THREAD.fullmatch(name.strip()):
        return "planning"
    return "jvm other"


def _comm(path: Path) -> str | None:
    try:
        return path.read_text().rstrip("\n")
    except OSError:
        return None  # exited while we looked


def _stat_ticks(stat_path: Path) -> tuple[str, int] | None:
    """(start time, user + system CPU in clock ticks) of a process's or a thread's `stat`, or None when
    it is gone."""
    try:
        stat = stat_path.read_text()
    except OSError:
        return None
    fields = stat[stat.rindex(")") + 2:].split()
    return fields[19], int(fields[11]) + int(fields[12])


def cpu_ticks(pid: int) -> tuple[str, int] | None:
    """(the process's start time, its user + system CPU in clock ticks), or
    None when it is gone. The start time tells a reused pid from the first."""
    return _stat_ticks(PROC / str(pid) / "stat")


class PeakTreeRss:
    """Samples a process tree's summed RSS in a thread until stopped; `peak`
    is the largest sample, `root_peak` the root process's own high-water
    mark as last seen (growth in its final interval before exit is missed).
    `cpu_s`: the CPU time (user + system) of every process seen in the tree,
    each as last sampled (a process's final interval is missed, as is a
    process that lived less than one interval). `parts_cpu_s`: the same CPU
    by part (PARTS): a JVM's by its threads' names (thread_part), every other
    process's as "python" (in an analysis: the driver, the history's line
    check, PySpark's daemon and workers); `jit_cpu_s` is its "jit": a fresh
    Spark JVM compiles the generated code of every stage it runs, and on two
    cores that is CPU the analysis does not get (docs/performance-analysis.md).
    A context manager: sampling stops on exit."""

    def __init__(self, pid: int, interval_s: float = 0.2) -> None:
        self.pid = pid
        self.interval_s = interval_s
        self.peak = 0
        self.root_peak = 0
        self._ticks: dict[tuple[int, str], int] = {}
        self._jvm: dict[tuple[int, str], bool] = {}  # (pid, start time) -> whether it is a JVM
        # (pid, start time, thread id) -> its part (its name is read once), and its ticks as last sampled.
        self._thread_parts: dict[tuple[int, str, str], str] = {}
        self._thread_ticks: dict[tuple[int, str, str], int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, name=f"rss-{pid}", daemon=True)

    @property
    def cpu_s(self) -> float:
        return sum(self._ticks.values()) / os.sysconf("SC_CLK_TCK")

    @property
    def parts_cpu_s(self) -> dict[str, float]:
        ticks: Counter[str] = Counter()
        for key, seen in self._thread_ticks.items():
            ticks[self._thread_parts[key]] += seen
        for key, seen in self._ticks.items():
            if not self._jvm.get(key):
                ticks["python"] += seen
        return {part: ticks[part] / os.sysconf("SC_CLK_TCK") for part in PARTS}

    @property
    def jit_cpu_s(self) -> float:
        return self.parts_cpu_s["jit"]

    def _sample_threads(self, pid: int, start: str) -> None:
        try:
            threads = os.listdir(PROC / str(pid) / "task")
        except OSError:
            return
        for tid in threads:
            key = (pid, start, tid)
            if key not in self._thread_parts:
                name = _comm(PROC / str(pid) / "task" / tid / "comm")
                if name is None:
                    continue
                self._thread_parts[key] = thread_part(name)
            seen = _stat_ticks(PROC / str(pid) / "task" / tid / "stat")
            if seen is not None:
                self._thread_ticks[key] = seen[1]

    def _sample(self) -> None:
        while not self._stop.is_set():
            tree = descendants(self.pid)
            self.peak = max(self.peak, sum(rss_bytes(p) for p in tree))
            self.root_peak = max(self.root_peak, hwm_bytes(self.pid))
            for pid in tree:
                seen = cpu_ticks(pid)
                if seen is None:
                    continue
                key = (pid, seen[0])
                self._ticks[key] = seen[1]
                # Read again until it is a JVM: a child is named as its parent between its fork and its exec.
                if not self._jvm.get(key):
                    self._jvm[key] = _comm(PROC / str(pid) / "comm") == "java"
                if self._jvm[key]:
                    self._sample_threads(pid, seen[0])
            self._stop.wait(self.interval_s)

    def __enter__(self) -> PeakTreeRss:
        self._thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self._stop.set()
        self._thread.join()
