"""Rows the driver makes itself reach Spark as Arrow, without a Python worker.

A list of rows given to createDataFrame is unpickled by a Python worker whose
environment differs from the SQL functions' workers, so a small analysis
started a second Python daemon (and a worker) to read the trace's segment
index. The frames the analysis builds from the driver's own rows are read by
the JVM alone.
"""

from __future__ import annotations

from pathlib import Path

from kproxy_spark.session import rows_frame

SEGMENTS = Path(__file__).parent / "data" / "old-traces" / "segments"


def lineage(frame) -> str:  # noqa: ANN001 - a classic DataFrame
    return frame._jdf.queryExecution().toRdd().toDebugString()


def test_rows_frame_keeps_rows_types_and_nulls(spark) -> None:
    columns = [("t", "int64"), ("phase", "int32"), ("value", "string"), ("error", "string")]
    frame = rows_frame(spark, [(-1, 0, "[1,2]", None), (2**40, 1, "x", "boom")], columns)
    assert frame.schema.simpleString() == "struct<t:bigint,phase:int,value:string,error:string>"
    assert [tuple(row) for row in frame.collect()] == [(-1, 0, "[1,2]", None), (2**40, 1, "x", "boom")]
    assert "PythonRDD" not in lineage(frame)


def test_rows_frame_of_no_rows_has_its_columns(spark) -> None:
    frame = rows_frame(spark, [], [("op", "int64")])
    assert frame.schema.simpleString() == "struct<op:bigint>" and frame.count() == 0


def test_a_list_of_rows_would_need_a_python_worker(spark) -> None:
    # What rows_frame avoids: if this stops holding, the helper is no longer needed.
    assert "PythonRDD" in lineage(spark.createDataFrame([(1,)], "op long"))


def test_segment_traces_are_read_from_an_index_the_jvm_holds(spark) -> None:
    from kproxy_spark.traces import load_traces

    traces = load_traces(spark, SEGMENTS)
    assert "PythonRDD" not in lineage(traces)
    assert traces.count() > 0
