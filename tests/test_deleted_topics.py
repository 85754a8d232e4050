"""A topic the application deletes: the writes nobody read before it went are not judged, and say so.

TestTxnEtl (franz-go's exactly-once test) deletes its topics when a subtest
passes; any application that cleans up after itself does. Once a topic is
gone no read can find its records, so a write nobody read cannot be told
lost or merely unread: the wire-derived verdict counts those writes in
`stats.derived_history.deleted_unread` rather than calling the run unknown.
"""

from confluent_kafka.admin import AdminClient

from kproxy_spark.derived.describe import set_aside_deleted
from kproxy_spark.report import format_summary
from tests.test_pytest_plugin_example import create_topic, read_committed, write_orders

from tests.test_pytest_plugin_example import _the_suites_spark_session  # noqa: F401  (the suite's Spark)


def delete_topic(bootstrap, topic):
    admin = AdminClient({"bootstrap.servers": bootstrap})  # held until the answer: its handle serves the future
    admin.delete_topics([topic], operation_timeout=15)[topic].result(20)


def test_unread_writes_into_a_deleted_topic_are_not_judged_and_the_rest_still_is(kproxy):
    kept, dropped = kproxy.fresh_name("kept"), kproxy.fresh_name("dropped")
    for topic in (kept, dropped):
        create_topic(kproxy.bootstrap, topic)
    write_orders(kproxy.bootstrap, kept, kproxy.fresh_name("kept-tx"), batches=2, per_batch=3)
    write_orders(kproxy.bootstrap, dropped, kproxy.fresh_name("dropped-tx"), batches=2, per_batch=3)
    assert len(read_committed(kproxy.bootstrap, kept, kproxy.fresh_name("readers"), 6)) == 6
    delete_topic(kproxy.bootstrap, dropped)  # its six writes were never read

    verdict = kproxy.verdict()
    derived = verdict.report["stats"]["derived_history"]
    assert derived["deleted_topics"] == [dropped]
    assert derived["deleted_unread"]["writes"] == 6 and derived["deleted_unread"]["topics"] == [dropped]
    assert verdict.anomalies.get("unseen", 0) == 0
    verdict.assert_valid()
    assert "not judged: 6 write(s) into 1 deleted topic(s)" in format_summary(verdict.report)


def test_only_unseen_writes_of_deleted_topics_are_set_aside():
    derived = {"deleted_topics": ["gone"], "partitions": [{"key": 0, "topic": "gone", "partition": 0},
                                                          {"key": 1, "topic": "here", "partition": 0}]}
    unseen = [{"key": 0, "value": 1}, {"key": 1, "value": 2}, {"key": 0, "value": 3}]
    assert set_aside_deleted(unseen, derived) == [{"key": 1, "value": 2}]
    assert derived["deleted_unread"]["writes"] == 2 and derived["deleted_unread"]["topics"] == ["gone"]
    nothing_deleted = {"deleted_topics": [], "partitions": derived["partitions"]}
    assert set_aside_deleted(unseen, nothing_deleted) == unseen and "deleted_unread" not in nothing_deleted
