"""Run a command as a process group of its own: wall time, peak memory of
the whole tree, and nothing left behind.

`kproxy analyze` starts a Spark JVM, which starts Python workers; a timeout
that stopped only the first process would leave the rest running, and
memory measured on the first process alone would miss the JVM.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading
import time
from dataclasses import dataclass
from pathlib import Path

from kproxy.bench.rss import PeakTreeRss


@dataclass(frozen=True)
class TreeRun:
    pid: int
    exit_code: int | None  # None: stopped at the timeout
    wall_s: float
    peak_rss_bytes: int  # the process and its descendants, sampled
    own_peak_rss_bytes: int  # the process alone: its high-water mark (VmHWM) as last sampled
    cpu_s: float  # user + system CPU of the process and its descendants, sampled (PeakTreeRss.cpu_s)
    jit_cpu_s: float  # of it, the JIT compiler threads' of any JVM among them (PeakTreeRss.jit_cpu_s)
    parts_cpu_s: dict[str, float]  # the CPU by part: JIT, planning, tasks, the JVM's other, Python (PeakTreeRss)


GONE_TIMEOUT_S = 10.0


def kill_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def wait_group_gone(pgid: int, timeout_s: float = GONE_TIMEOUT_S) -> bool:
    """SIGKILL is delivered asynchronously and an orphan lingers until init
    reaps it: wait until no process of the group is left."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def run_tree(command: list[str], log_path: Path, timeout_s: float, sample_interval_s: float = 0.2) -> TreeRun:
    """Run command with stdout and stderr to log_path; SIGKILL its process
    group at timeout_s, and in any case once it has exited."""
    with open(log_path, "wb") as log:
        started = time.monotonic()
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        stopped = threading.Event()

        def stop_at_timeout() -> None:
            stopped.set()
            kill_group(process.pid)

        timer = threading.Timer(timeout_s, stop_at_timeout)
        timer.start()
        try:
            with PeakTreeRss(process.pid, sample_interval_s) as sampler:
                exit_code = process.wait()
        finally:
            timer.cancel()
            # Children that outlived their parent (a JVM being torn down) go too.
            kill_group(process.pid)
        wall_s = time.monotonic() - started
        wait_group_gone(process.pid)
    return TreeRun(process.pid, None if stopped.is_set() else exit_code, wall_s, sampler.peak, sampler.root_peak,
                   round(sampler.cpu_s, 2), round(sampler.jit_cpu_s, 2),
                   {part: round(cpu, 2) for part, cpu in sampler.parts_cpu_s.items()})
