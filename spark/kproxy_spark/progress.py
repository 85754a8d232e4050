"""What a long analysis is doing, every 10 seconds, while its Spark jobs run.

The analysis prints a line as each phase ends; a phase of a large input runs
for minutes (a million operations' history checks, a large trace's wire
checks), and nothing was printed meanwhile. While `watch_jobs` runs, a line
names every running job of the analysis by its description, with its stages
done and running and the running stages' tasks done of all, and the rows the
analysis's stages have read so far (their input and shuffle records, from
Spark's status store, counted as tasks finish): a user can tell a slow
analysis from a stuck one.

On Spark Connect the status comes from Connect's progress handler, which
gives tasks and bytes read, not rows or job descriptions.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

#: Seconds between two lines; the first comes this long after the watch starts.
EVERY_S = 10.0


@dataclass(frozen=True)
class JobProgress:
    """One running job: its description (None when not known), its stages done and running, and the
    running stages' tasks done of all."""

    description: str | None
    stages_done: int
    stages_running: int
    tasks_done: int
    tasks: int


def describe(jobs: list[JobProgress], read: int | None, read_unit: str = "rows") -> str | None:
    """The line for what runs, or None when nothing does."""
    if not jobs:
        return None
    parts = [f"{job.description or 'a Spark job'} ({_count(job.stages_done, 'stage')} done,"
             f" {job.stages_running:,} running: {job.tasks_done:,} of {_count(job.tasks, 'task')})" for job in jobs]
    line = "running " + "; ".join(parts)
    if read is not None:
        line += f"; {read:,} {read_unit} read so far"
    return line


def _count(n: int, what: str) -> str:
    return f"{n:,} {what}" + ("" if n == 1 else "s")


class _ClassicStatus:
    """The running stages of one job group, from the SparkContext's status tracker and status store."""

    def __init__(self, spark, group: str) -> None:  # noqa: ANN001 - a classic SparkSession
        context = spark.sparkContext
        self._tracker = context.statusTracker()
        self._group = group
        try:
            self._store = context._jsc.sc().statusStore()  # noqa: SLF001 - rows read: not in PySpark's tracker
        except Exception:  # noqa: BLE001 - a Spark without it: tasks only
            self._store = None
        self._rows: dict[int, int] = {}  # stage -> rows read
        # Stages done, whose rows no longer change: not asked again (a poll is a few JVM calls a stage).
        self._final: set[int] = set()
        self._descriptions: dict[int, str | None] = {}  # job -> its description

    def poll(self) -> tuple[list[JobProgress], int | None]:
        running: list[JobProgress] = []
        active = set(self._tracker.getActiveStageIds())
        for job_id in self._tracker.getJobIdsForGroup(self._group):
            job = self._tracker.getJobInfo(job_id)
            if job is None:
                continue
            done, live, tasks_done, tasks = 0, 0, 0, 0
            for stage_id in job.stageIds:
                if stage_id in self._final:
                    done += 1
                    continue
                stage = self._tracker.getStageInfo(stage_id)
                data = self._stage_data(stage_id)
                if data is not None:
                    if self._descriptions.get(job_id) is None:
                        self._descriptions[job_id] = data[0]
                    self._rows[stage_id] = data[1]
                if stage is None:
                    continue
                if stage_id in active:
                    live += 1
                    tasks_done += stage.numCompletedTasks
                    tasks += stage.numTasks
                elif stage.numTasks and stage.numCompletedTasks == stage.numTasks:
                    done += 1
                    self._final.add(stage_id)
            if job.status == "RUNNING" and live:
                running.append(JobProgress(self._descriptions.get(job_id), done, live, tasks_done, tasks))
        return running, (sum(self._rows.values()) if self._store is not None else None)

    def _stage_data(self, stage_id: int) -> tuple[str | None, int] | None:
        """(the stage's job description, rows it has read), or None when the store cannot say."""
        if self._store is None:
            return None
        try:
            data = self._store.lastStageAttempt(stage_id)
            description = data.description()
            return (description.get() if description.isDefined() else None,
                    data.inputRecords() + data.shuffleReadRecords())
        except Exception:  # noqa: BLE001 - a stage the store no longer holds
            return None


class _ConnectStatus:
    """The running stages of a Spark Connect session's operations, from Connect's progress handler."""

    def __init__(self, spark) -> None:  # noqa: ANN001 - a Connect SparkSession
        self._spark = spark
        self._lock = threading.Lock()
        self._stages: dict[int, tuple[bool, int, int]] = {}  # stage -> (done, tasks done, tasks)
        self._bytes: dict[int, int] = {}
        spark.registerProgressHandler(self._on_progress)

    def _on_progress(self, stages, inflight_tasks, operation_id, done) -> None:  # noqa: ANN001, ARG002
        with self._lock:
            for stage in stages or ():
                self._bytes[stage.stage_id] = stage.num_bytes_read
                self._stages[stage.stage_id] = (stage.done or done, stage.num_completed_tasks, stage.num_tasks)

    def poll(self) -> tuple[list[JobProgress], int | None]:
        with self._lock:
            live = [(d, t) for finished, d, t in self._stages.values() if not finished]
            if not live:
                return [], sum(self._bytes.values())
            done = sum(1 for finished, _, _ in self._stages.values() if finished)
            job = JobProgress(None, done, len(live), sum(d for d, _ in live), sum(t for _, t in live))
            return [job], sum(self._bytes.values())

    def close(self) -> None:
        self._spark.removeProgressHandler(self._on_progress)


@contextmanager
def watch_jobs(spark, group: str | None, say: Callable[[str], None], every: float = EVERY_S) -> Iterator[None]:  # noqa: ANN001
    """While the block runs, `say` what the analysis's jobs (job group `group` on a classic session) are
    doing, every `every` seconds; nothing when nothing runs."""
    from kproxy_spark.session import is_connect

    connect = is_connect(spark)
    status = _ConnectStatus(spark) if connect else _ClassicStatus(spark, group) if group else None
    if status is None:
        yield
        return
    unit = "bytes" if connect else "rows"
    stop = threading.Event()

    def run() -> None:
        while not stop.wait(every):
            try:
                line = describe(*status.poll(), read_unit=unit)
            except Exception:  # noqa: BLE001 - progress must never fail the analysis
                continue
            if line is not None and not stop.is_set():
                say(line)

    watcher = threading.Thread(target=run, name="kproxy-progress", daemon=True)
    watcher.start()
    try:
        yield
    finally:
        stop.set()
        watcher.join()
        if connect:
            status.close()
