"""A long analysis says what its Spark jobs are doing while they run
(kproxy_spark.progress): each running job by its description, its stages
done and running with their tasks, and the rows read so far; on Spark
Connect, the tasks and bytes Connect's progress reports."""

from __future__ import annotations

import threading
import time

import pytest

from kproxy_spark.progress import JobProgress, describe, watch_jobs

pytestmark = pytest.mark.spark


def test_a_line_names_each_running_job_with_its_stages_tasks_and_rows() -> None:
    jobs = [JobProgress("history checks: one grouped pass per key", 1, 1, 2, 4),
            JobProgress(None, 0, 2, 0, 1)]
    assert describe(jobs, 1234567) == (
        "running history checks: one grouped pass per key (1 stage done, 1 running: 2 of 4 tasks);"
        " a Spark job (0 stages done, 2 running: 0 of 1 task); 1,234,567 rows read so far")
    assert describe(jobs[:1], None, "bytes").endswith("2 of 4 tasks)")
    assert describe([], 10) is None


def _slow(batches):  # noqa: ANN001, ANN202 - mapInArrow: each batch waits, so the job is seen running
    import time as clock

    for batch in batches:
        clock.sleep(0.4)
        yield batch


def test_the_running_jobs_of_the_group_are_told_while_they_run(spark) -> None:
    from pyspark.sql import functions as F

    group = "kproxy-progress-test"
    said: list[str] = []

    def job() -> None:
        spark.sparkContext.setJobGroup(group, "progress test")
        spark.sparkContext.setJobDescription("a slow pass")
        # Two slow stages: the range's (4 tasks), then the shuffle's (2 tasks).
        spark.range(0, 4000, numPartitions=4).mapInArrow(_slow, "id long").repartition(2).mapInArrow(
            _slow, "id long").groupBy((F.col("id") % 3).alias("k")).count().collect()

    worker = threading.Thread(target=job)
    with watch_jobs(spark, group, said.append, every=0.3):
        worker.start()
        worker.join()
    running = [line for line in said if line.startswith("running a slow pass (")]
    assert running, said
    assert any(" of 4 tasks)" in line for line in running), said
    assert all(line.endswith("rows read so far") for line in running), said
    # The first stage's 4,000 rows are counted once its tasks are done, while the second runs.
    assert any(line.startswith("running a slow pass (1 stage done, 1 running: ")
               and line.endswith("; 4,000 rows read so far") for line in running), said


def test_jobs_outside_the_group_and_a_quiet_session_say_nothing(spark) -> None:
    said: list[str] = []
    with watch_jobs(spark, "kproxy-no-such-group", said.append, every=0.1):
        spark.range(0, 1000, numPartitions=2).mapInArrow(_slow, "id long").count()
    assert said == []
    with watch_jobs(spark, "kproxy-no-such-group", said.append, every=0.1):
        time.sleep(0.35)
    assert said == []
