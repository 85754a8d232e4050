"""How many shuffle partitions the analysis asks for: by the input's bytes, in whole rounds of the cores."""

import pytest

from kproxy_spark.session import (
    BYTES_PER_PARTITION,
    SPREAD_PASS_BYTES,
    _LOCAL_MASTER,
    pass_partitions_for,
    shuffle_partitions_for,
)

PART = BYTES_PER_PARTITION


@pytest.mark.parametrize(
    ("input_bytes", "cores", "partitions"),
    [
        (0, 2, 1),
        (PART, 2, 1),  # one partition stays one: the small inputs' single-partition plans depend on it
        (PART + 1, 2, 2),
        (3 * PART, 2, 4),  # a million operations' history: three tasks on two cores left one core idle
        (3 * PART, None, 3),  # cores unknown (a cluster, Spark Connect): by the bytes alone
        (3 * PART, 8, 8),
        (41 * PART, 2, 42),
        (26 * PART, 2, 26),
        (1000 * PART, 2, 400),  # the ceiling holds
        (1000 * PART, 3, 400),
    ],
)
def test_partitions_follow_the_bytes_in_whole_rounds_of_the_cores(input_bytes: int, cores: int | None,
                                                                   partitions: int) -> None:
    assert shuffle_partitions_for(input_bytes, cores=cores) == partitions


@pytest.mark.parametrize(
    ("master", "count"),
    [("local", None), ("local[2]", "2"), ("local[*]", "*"), ("local[4,2]", "4"), ("local-cluster[2,1,1024]", "x"),
     ("spark://host:7077", "x")],
)
def test_local_masters_name_their_cores(master: str, count: str | None) -> None:
    found = _LOCAL_MASTER.fullmatch(master)
    assert (found.group(1) if found else "x") == count


def test_the_tests_local_session_counts_its_two_cores(spark) -> None:  # noqa: ANN001 - the session fixture
    from kproxy_spark.session import local_cores

    assert spark.sparkContext.master == "local[2]" and local_cores(spark) == 2


@pytest.mark.parametrize(
    ("input_bytes", "shuffle", "cores", "tasks"),
    [
        (SPREAD_PASS_BYTES - 1, 1, 2, 1),  # a small history: the extra shuffle would cost what it saves
        (SPREAD_PASS_BYTES, 1, 2, 2),  # 100,000 operations' history: one task beside an idle core
        (3 * PART, 4, 2, 4),  # the shuffle's partitions already fill the cores
        (SPREAD_PASS_BYTES, 1, None, 1),  # a cluster or Spark Connect: executors not counted here
        (SPREAD_PASS_BYTES, 1, 1, 1),
    ],
)
def test_the_history_pass_spreads_over_the_local_cores_once_the_input_is_not_small(
        input_bytes: int, shuffle: int, cores: int | None, tasks: int) -> None:
    assert pass_partitions_for(input_bytes, shuffle, cores) == tasks


def test_the_pass_runs_in_as_many_tasks_as_size_for_input_asks(spark, tmp_path) -> None:  # noqa: ANN001
    """Two tasks for a history whose shuffle has one partition; the same cases as in one."""
    from kproxy_spark.checks.keypass import history_pass, read_rows
    from kproxy_spark.history import load_history
    from kproxy_spark.session import PASS_PARTITIONS_CONF
    from tests.fixtures.spark import op, write_history

    path = write_history(tmp_path / "h.jsonl", [
        op(0, "ok", "send", [["send", key, [0, key]]]) for key in range(6)
    ] + [op(1, "ok", "poll", [["poll", {str(key): [[0, key]] for key in range(6)}]])])
    before = (spark.conf.get("spark.sql.shuffle.partitions"), spark.conf.get(PASS_PARTITIONS_CONF, None))
    spark.conf.set("spark.sql.shuffle.partitions", "1")
    try:
        found = []
        for tasks in ("1", "2"):
            spark.conf.set(PASS_PARTITIONS_CONF, tasks)
            frame = history_pass(load_history(spark, path))
            found.append((frame.rdd.getNumPartitions(), sorted(map(tuple, frame.collect()))))
    finally:
        spark.conf.set("spark.sql.shuffle.partitions", before[0])
        if before[1] is None:
            spark.conf.unset(PASS_PARTITIONS_CONF)
        else:
            spark.conf.set(PASS_PARTITIONS_CONF, before[1])
    assert found[0][0] == 1 and found[1][0] == 2
    assert found[0][1] == found[1][1] and found[0][1]
