"""How many shuffle partitions the analysis asks for: by the input's bytes, in whole rounds of the cores."""

import pytest

from kproxy_spark.session import BYTES_PER_PARTITION, _LOCAL_MASTER, shuffle_partitions_for

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
