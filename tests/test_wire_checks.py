"""Every wire anomaly on literal histories and traces, found and not found."""

from __future__ import annotations

import pytest

from tests.test_wire_scenarios import PID, TID, error_scenario, torn_scenario

pytestmark = pytest.mark.spark


def _checks(spark, tmp_path, scenario, names=None, **kwargs):
    from kproxy_spark.history import load_history
    from kproxy_spark.traces import load_traces
    from kproxy_spark.attribution import attribute_run
    from kproxy_spark.report import INFORMATIONAL
    from kproxy_spark.wire import read_wire_rows, wire_frame

    history, traces_dir = scenario.write(tmp_path)
    frame = wire_frame(load_history(spark, str(history)), load_traces(spark, traces_dir), **kwargs)
    cases, _ = read_wire_rows(frame.collect())
    attribute_run({}, cases, INFORMATIONAL)
    return {name: rows for name, rows in cases.items() if names is None or name in names}


def test_on_a_session_that_shuffles_into_one_partition_the_wire_frame_is_one_task(spark, tmp_path):
    # Its parts are one partition each; a union would give each its own task and a copy of the whole plan.
    from kproxy_spark.history import load_history
    from kproxy_spark.session import shuffles_into_one
    from kproxy_spark.traces import load_traces
    from kproxy_spark.wire import read_wire_rows, wire_frame

    assert shuffles_into_one(spark), "the premise: the tests' session shuffles into one partition"
    history, traces_dir = torn_scenario().write(tmp_path)
    frame = wire_frame(load_history(spark, str(history)), load_traces(spark, traces_dir))
    assert frame.rdd.getNumPartitions() == 1
    cases, _ = read_wire_rows(frame.collect())
    assert cases["torn-transaction"], "the frame's rows are all there"


def test_pysparks_short_jvm_names_are_kept_in_python_and_name_the_same_classes(spark):
    from pyspark.sql import functions as F

    from kproxy_spark.jvm_calls import PINNED_JVM_NAMES

    jvm = spark.sparkContext._jvm
    for short, qualified in PINNED_JVM_NAMES.items():
        # Attributes of the view, by either name: no call into the JVM to find them.
        assert vars(jvm)[short]._fqn == qualified and vars(jvm)[qualified] is vars(jvm)[short]
    assert spark.range(3).select(F.col("id") + F.lit(1)).collect()[-1][0] == 3


def test_a_column_function_and_a_list_of_columns_cross_in_one_call_each(spark):
    from pyspark.sql import functions as F

    frame = spark.range(3)
    F.col("id")  # the function's member, found once
    client = spark.sparkContext._gateway._gateway_client
    sent = []
    send = client.send_command
    client.send_command = lambda command, *rest, **named: sent.append(command) or send(command, *rest, **named)
    try:
        F.col("a name not asked for before")
        assert len(sent) == 1, sent  # the call alone: no look-up of the class or its member
        del sent[:]
        F.col("a name not asked for before"), F.col("id")
        assert sent == [], sent  # a name's column is asked for once
        columns = [F.col("id").alias(f"c{i}") for i in range(23)]
        del sent[:]
        picked = frame.select(*columns)
        # The list of 23 columns: three List.of and two addAll calls and the ArrayList, not 24 calls.
        assert len([c for c in sent if not c.startswith("m\n")]) <= 10, sent
    finally:
        client.send_command = send
    assert picked.columns == [f"c{i}" for i in range(23)]
    assert picked.collect()[-1] == tuple([2] * 23)


def test_a_reused_column_or_literal_is_the_one_its_arguments_name(spark):
    from pyspark.sql import functions as F

    frame = spark.range(3)
    # Equal in Python, different literals in Spark: the type is part of what is reused.
    picked = frame.select(F.lit(1).alias("one"), F.lit(True).alias("yes"), F.lit(1.5).alias("half"),
                          F.lit("1").alias("text"), F.lit(None).alias("none"))
    assert picked.dtypes == [("one", "int"), ("yes", "boolean"), ("half", "double"), ("text", "string"),
                             ("none", "void")]
    # One column object in two frames and twice in one: each resolves against its own frame.
    other = spark.range(5, 7)
    name = F.col("id")
    assert [r[0] for r in frame.where(name > 0).select(name + name).collect()] == [2, 4]
    assert [r[0] for r in other.where(F.col("id") > 5).select(F.col("id")).collect()] == [6]


def test_torn_transaction_is_found_and_attributed_to_the_stale_end_txn(spark, tmp_path):
    found = _checks(spark, tmp_path, torn_scenario())

    [torn] = found["torn-transaction"]
    assert torn["source"] == "history" and torn["index"] == 2 and torn["client_type"] == "fail"
    assert torn["committed"] == [[7, 2], [7, 3]] and torn["aborted"] == [[7, 1]]
    assert torn["txn_clients"] == [1] and torn["txn_brokers"] == [1, 2]
    [stale] = torn["stale_end_txns"]
    assert (stale["txn_client"], stale["txn_broker"], stale["end_txn_commit"]) == (1, 2, True)
    assert (stale["conn_id"], stale["correlation_id"], stale["copy"]) == (1, 3, 1)
    assert (stale["rule"], stale["action"]) == ("torn", "duplicate")
    assert torn["rules"] == ["torn"]
    assert torn["explanation"] == (
        "txn op 2 (process 0, tx-0, client aborted): records [7,2] [7,3] committed but [7,1] aborted;"
        " cause: the EndTxn(commit) of client txn 1, duplicated by rule 'torn' and delivered while broker txn 2"
        " was open (conn 1, correlation id 3)"
    )

    [end] = found["stale-end-txn"]
    assert (end["txn_client"], end["txn_broker"], end["hazard"], end["rule"]) == (1, 2, "stale_end_txn", "torn")
    assert (end["transactional_id"], end["producer_id"]) == (TID, PID)
    assert end["explanation"] == (
        "EndTxn(commit) of client txn 1 from tx-0 (producer 1000, epoch 0), duplicated by rule 'torn' and"
        " delivered while broker txn 2 was open (conn 1, correlation id 3); the broker accepted it"
    )

    [late] = found["late-produce"]
    assert late["records"] == [[7, 2], [7, 3]] and late["landed_offsets"] == [2, 3]
    assert (late["txn_client"], late["txn_broker"], late["rule"]) == (1, 2, "torn")
    assert late["explanation"] == (
        "Produce of records [7,2] [7,3] in client txn 1 of tx-0 (producer 1000), delayed by rule 'torn' and"
        " delivered while broker txn 2 was open (conn 1, correlation id 2), landed at offsets 2, 3"
        " in a transaction that committed"
    )

    [mismatch] = found["client-outcome-mismatch"]
    assert mismatch["direction"] == "client-fail-wire-committed" and mismatch["index"] == 2
    assert mismatch["committed"] == [[7, 2], [7, 3]]
    assert mismatch["explanation"] == (
        "txn op 2 (process 0, client aborted) but the wire committed [7,2] [7,3] (and aborted [7,1]);"
        " cause: the EndTxn(commit) of client txn 1, duplicated by rule 'torn' and delivered while broker txn 2"
        " was open (conn 1, correlation id 3)"
    )

    [aborted_read] = found["broker-aborted-read"]
    assert aborted_read["offsets"] == [0] and aborted_read["records"] == [[7, 1]]
    # The traced record is decided by the EndTxn(abort) the broker applied after it.
    assert aborted_read["known_by"] == ["end_txn"]
    assert aborted_read["explanation"] == (
        "a read_committed Fetch (conn 2, correlation id 1) returned 1 record(s) of aborted transactions:"
        " topic t partition 0 at offset(s) 0 (aborted per the EndTxn), and its aborted-transactions list covers"
        " none of them; the broker's own response"
    )
    assert aborted_read["cause"]["by"] == "broker" and aborted_read["cause"]["name"] == "aborted-txn-not-listed"

    impact = {(r["rule"], r["anomaly"]): r["cases"] for r in found["fault-impact"]}
    assert impact[("torn", "torn-transaction")] == 1
    assert impact[("torn", "stale-end-txn")] == 1
    assert impact[("torn", "late-produce")] == 1

    latency = {r["api"]: r for r in found["latency"]}
    assert set(latency) == {"produce", "end_txn", "fetch"}
    assert latency["end_txn"]["responses"] == 3 and latency["end_txn"]["p99_ms"] == 2.0


def test_without_the_stale_end_txn_nothing_is_torn(spark, tmp_path):
    found = _checks(spark, tmp_path, torn_scenario(stale=False, aborted_read=False))
    for name in ("torn-transaction", "stale-end-txn", "client-outcome-mismatch", "broker-aborted-read",
                 "spurious-offset", "ambiguous-error"):
        assert found[name] == [], name
    # The delayed Produce still slid into a later transaction: that hazard is reported alone.
    assert len(found["late-produce"]) == 1


def test_wire_only_transactions_are_checked_by_their_client_side_number(spark, tmp_path):
    scenario = torn_scenario()
    scenario.ops = [op for op in scenario.ops if op["f"] != "txn"]
    for index, op in enumerate(scenario.ops):
        op["index"] = index
    found = _checks(spark, tmp_path, scenario, names={"torn-transaction", "client-outcome-mismatch"})
    [torn] = found["torn-transaction"]
    assert torn["source"] == "wire" and torn["index"] is None
    assert torn["txn_clients"] == [1] and torn["committed"] == [[7, 2], [7, 3]] and torn["aborted"] == [[7, 1]]
    assert torn["explanation"].startswith(
        "client txn 1 of tx-0 (producer 1000, in no history op): records [7,2] [7,3] committed but [7,1] aborted;"
        " cause: the EndTxn(commit) of client txn 1, duplicated by rule 'torn'"
    )
    assert found["client-outcome-mismatch"] == []


def test_client_ok_but_wire_aborted_is_a_mismatch(spark, tmp_path):
    scenario = torn_scenario(stale=False)
    # The client believed the first transaction committed.
    fail = next(op for op in scenario.ops if op["type"] == "fail")
    fail["type"] = "ok"
    del fail["error"]
    found = _checks(spark, tmp_path, scenario, names={"client-outcome-mismatch"})
    [mismatch] = found["client-outcome-mismatch"]
    assert mismatch["direction"] == "client-ok-wire-aborted"
    assert mismatch["aborted"] == [[7, 1], [7, 2], [7, 3]]
    # No EndTxn with a hazard decided them; the delayed Produce's rule is all there is to point at.
    assert mismatch["explanation"] == (
        "txn op 2 (process 0, client committed) but the wire aborted [7,1] [7,2] [7,3];"
        " no EndTxn with a hazard decided them; fault rules involved: 'torn'"
    )


def test_spurious_offset_and_ambiguous_error(spark, tmp_path):
    found = _checks(spark, tmp_path, error_scenario(client_type="fail"),
                    names={"spurious-offset", "ambiguous-error", "client-outcome-mismatch"})
    [spurious] = found["spurious-offset"]
    assert (spurious["key"], spurious["value"], spurious["client_offset"]) == (8, 1, 0)
    assert spurious["error_codes"] == [7] and spurious["rules"] == ["err"]
    assert spurious["explanation"] == (
        "op 3 (process 0) reported key 8 value 1 at offset 0, but every Produce of it was answered with an error"
        " (REQUEST_TIMED_OUT); fault rules involved: 'err'"
    )

    [ambiguous] = found["ambiguous-error"]
    assert (ambiguous["key"], ambiguous["value"], ambiguous["topic"]) == (9, 5, "u")
    assert ambiguous["read_offsets"] == [0] and ambiguous["client_type"] == "fail"
    [produce] = ambiguous["errored_produces"]
    assert (produce["outcome"], produce["rule"]) == ("rewritten", "err")
    assert ambiguous["explanation"] == (
        "every Produce of key 9 value 5 was answered with an error (REQUEST_TIMED_OUT), yet a Fetch read it from u"
        " partition 0 at offset 0; the client saw op 5 fail (REQUEST_TIMED_OUT); fault rules involved: 'err'"
    )

    # A definite failure whose write is in the log is also a client/wire mismatch.
    [mismatch] = found["client-outcome-mismatch"]
    assert mismatch["direction"] == "client-fail-wire-committed" and mismatch["committed"] == [[9, 5]]
    assert mismatch["explanation"] == "send op 5 (process 0, client failed: REQUEST_TIMED_OUT) but the wire committed [9,5]"


def test_a_successful_retry_is_neither_spurious_nor_ambiguous(spark, tmp_path):
    scenario = error_scenario(retried=True, client_type="info")
    # Without a read of key 9 its errored write is not known to have landed.
    scenario.events = [e for e in scenario.events if e["api"] != "fetch"]
    found = _checks(spark, tmp_path, scenario, names={"spurious-offset", "ambiguous-error", "client-outcome-mismatch"})
    assert found["spurious-offset"] == []
    assert found["ambiguous-error"] == []
    assert found["client-outcome-mismatch"] == []


def test_records_the_aborted_transactions_list_covers_are_no_aborted_read(spark, tmp_path):
    # Kafka serves read_committed this way: the aborted batches come along
    # with the list that tells the client to drop them.
    found = _checks(spark, tmp_path, torn_scenario(listed=True), names={"broker-aborted-read", "torn-transaction"})
    assert found["broker-aborted-read"] == []
    assert len(found["torn-transaction"]) == 1


def test_a_list_entry_covers_its_producer_only_up_to_the_next_marker(spark, tmp_path):
    scenario = torn_scenario(stale=False, listed=True)
    fetch = next(e for e in scenario.events if e["api"] == "fetch" and e["direction"] == "response")
    [part] = fetch["partitions"]
    # The entry of the second aborted transaction (offset 2) is missing: the
    # first entry ended at the abort marker at offset 1, so 2 and 3 are bare.
    part["aborted_transactions"] = [{"producer_id": PID, "first_offset": 0}]
    [case] = _checks(spark, tmp_path, scenario, names={"broker-aborted-read"})["broker-aborted-read"]
    assert case["offsets"] == [2, 3] and case["records"] == [[7, 2], [7, 3]]


def test_read_uncommitted_fetches_are_not_aborted_reads(spark, tmp_path):
    found = _checks(spark, tmp_path, torn_scenario(), names={"broker-aborted-read", "torn-transaction"},
                    isolation="read_uncommitted")
    assert found["broker-aborted-read"] == []
    assert len(found["torn-transaction"]) == 1


@pytest.mark.parametrize(("numbers", "how"), [
    ((2, 2), "delivered after an EndTxn of client txn 2 had reached the broker, into broker txn 2"),
    ((3, 2), "delivered into broker txn 2, whose EndTxn had not reached the broker yet"),
])
def test_a_late_produce_says_which_kind_of_late_it_was(spark, tmp_path, numbers, how):
    scenario = torn_scenario()
    late = next(e for e in scenario.events if e.get("hazard") == "late_produce" and e["direction"] == "request")
    late["txn_client"], late["txn_broker"] = numbers
    [case] = _checks(spark, tmp_path, scenario, names={"late-produce"})["late-produce"]
    assert case["explanation"] == (
        f"Produce of records [7,2] [7,3] in client txn {numbers[0]} of tx-0 (producer 1000), delayed by rule 'torn'"
        f" and {how} (conn 1, correlation id 2), landed at offsets 2, 3 in a transaction that committed"
    )
