"""What the trace says of consumers: where each Fetch asked to read from, its isolation level, the group
of group requests, and the offsets OffsetCommit and TxnOffsetCommit commit.

Literal frames encoded with the Kafka schemas (kio), handed to the trace as
the data path hands them (fast path: `TraceEvents.fast_request`; off it: the
pipeline, then `TraceEvents.request`), written by a real TraceWriter and
read back with `iter_trace_events`.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib
import uuid
from pathlib import Path
from typing import Any

import pytest
from kio.schema.errors import ErrorCode

from kproxy.obs.trace import TraceWriter
from kproxy.obs.trace_events import TraceEvents
from kproxy.obs.trace_files import iter_trace_events
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis
from kproxy.protocol.codec import encode_request, encode_response, parse_request_header
from kproxy.protocol.request_peek import request_facts
from tests.test_pipeline import pipeline

TOPIC_ID = uuid.UUID("6b1a3bc2-4f1e-4e52-9d5e-0c4a7f1e2d3b")
UNKNOWN_ID = uuid.UUID("00000000-0000-0000-0000-0000000000aa")
NAMES = {TOPIC_ID: "orders"}
GROUP = "billing"
TXN, PID, EPOCH = "tx-1", 4000, 3


class Conn:
    conn_id, client_addr, node_id = 9, "127.0.0.1:5", 1


def build(cls: type, **values: Any) -> Any:
    """A kio entity from the values its version has (others are dropped)."""
    names = {f.name for f in dataclasses.fields(cls)}
    return cls(**{k: v for k, v in values.items() if k in names})


def schema(api: str, version: int, kind: str = "request") -> Any:
    return importlib.import_module(f"kio.schema.{api}.v{version}.{kind}")


def topic(name: str, by_id: uuid.UUID = TOPIC_ID) -> dict[str, Any]:
    # Names up to Fetch v12 / OffsetCommit v9, ids after; build() keeps the one the version has.
    return {"topic": name, "name": name, "topic_id": by_id}


def fetch_request(version: int, topics: dict[str, list[tuple[int, int]]], *, isolation: int = 1,
                  session: tuple[int, int] = (0, -1), forgotten: tuple[str, ...] = ()) -> Any:
    m = schema("fetch", version)
    ids = {"orders": TOPIC_ID}
    return build(
        m.FetchRequest, replica_id=-1, max_wait=datetime.timedelta(milliseconds=500), min_bytes=1,
        max_bytes=50 << 20, isolation_level=isolation, session_id=session[0], session_epoch=session[1], rack_id="",
        topics=tuple(
            build(m.FetchTopic, **topic(name, ids.get(name, UNKNOWN_ID)), partitions=tuple(
                build(m.FetchPartition, partition=p, fetch_offset=offset, partition_max_bytes=1 << 20,
                      current_leader_epoch=-1, last_fetched_epoch=-1, log_start_offset=-1)
                for p, offset in parts))
            for name, parts in topics.items()),
        forgotten_topics_data=tuple(build(m.ForgottenTopic, **topic(name), partitions=(0,)) for name in forgotten),
    )


def offset_commit(version: int, offsets: dict[int, int]) -> Any:
    m = schema("offset_commit", version)
    return build(
        m.OffsetCommitRequest, group_id=GROUP, generation_id_or_member_epoch=5, member_id="m-1",
        group_instance_id=None, retention_time=datetime.timedelta(milliseconds=-1),
        topics=(build(m.OffsetCommitRequestTopic, **topic("orders"), partitions=tuple(
            build(m.OffsetCommitRequestPartition, partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                  committed_metadata="")
            for p, o in offsets.items())),),
    )


def txn_offset_commit(version: int, offsets: dict[int, int]) -> Any:
    m = schema("txn_offset_commit", version)
    return build(
        m.TxnOffsetCommitRequest, transactional_id=TXN, group_id=GROUP, producer_id=PID, producer_epoch=EPOCH,
        generation_id=7, member_id="m-7", group_instance_id=None,
        topics=(build(m.TxnOffsetCommitRequestTopic, name="orders", partitions=tuple(
            build(m.TxnOffsetCommitRequestPartition, partition_index=p, committed_offset=o, committed_leader_epoch=-1,
                  committed_metadata=None)
            for p, o in offsets.items())),),
    )


def txn_offset_commit_answer(version: int, errors: dict[int, int], correlation_id: int) -> bytes:
    m = schema("txn_offset_commit", version, "response")
    body = m.TxnOffsetCommitResponse(throttle_time=datetime.timedelta(0), topics=(m.TxnOffsetCommitResponseTopic(
        name="orders", partitions=tuple(m.TxnOffsetCommitResponsePartition(partition_index=p, error_code=ErrorCode(e))
                                        for p, e in errors.items())),))
    return encode_response(body, correlation_id)


def offset_commit_answer(version: int, errors: dict[int, int], correlation_id: int) -> bytes:
    m = schema("offset_commit", version, "response")
    body = build(m.OffsetCommitResponse, throttle_time=datetime.timedelta(0), topics=(build(
        m.OffsetCommitResponseTopic, **topic("orders"), partitions=tuple(
            m.OffsetCommitResponsePartition(partition_index=p, error_code=ErrorCode(e)) for p, e in errors.items())),))
    return encode_response(body, correlation_id)


def fast_path(events: TraceEvents, body: Any, correlation_id: int = 1) -> tuple[Any, Exchange]:
    """What the request pump hands the trace for a request it forwards untouched."""
    frame = encode_request(body, correlation_id, "c")
    header = parse_request_header(frame, 4)
    ex = Exchange(header.api_key, header.api_version, correlation_id, "c", 0.0)
    framed = header.api_key in events.framed_requests
    return events.fast_request(Conn, ex, len(frame) - 4, frame if framed else None, header if framed else None), ex


def traced(tmp_path: Path, level: str, offer: Any) -> tuple[TraceWriter, TraceEvents]:
    """A writer at `level` and the data path's events for it, after `offer(events, writer)` handed it events."""
    writer = TraceWriter(tmp_path / level, proxy_id="t", level=level)
    events = TraceEvents("t", level == "records", dict(NAMES), writer.raw_ledger)
    offer(events, writer)
    return writer, events


async def written(writer: TraceWriter) -> list[dict]:
    await writer.aclose()
    assert writer.raw_ledger.held == 0
    return list(iter_trace_events(writer.directory))


def positions(event: dict) -> list[tuple[str, int, int | None, int | None]]:
    # These entries hold only the fields that apply; the others read as null.
    return [(p["topic"], p["partition"], p.get("fetch_offset"), p.get("committed_offset")) for p in event["partitions"]]


# ------------------------------------------------------------------ Fetch requests

FETCHES = [
    # (version, what the request lists, session id and epoch, what the trace names the topic)
    pytest.param(4, {"orders": [(0, 17), (1, 40)]}, (0, -1), id="v4-no-sessions"),
    pytest.param(7, {"orders": [(1, 41)]}, (12, 3), id="v7-incremental-session"),
    pytest.param(11, {"orders": [(0, 17), (1, 40)]}, (0, 0), id="v11-full-session-request"),
    pytest.param(12, {"orders": [(2, 5)]}, (12, 4), id="v12-flexible"),
    pytest.param(13, {"orders": [(0, 17), (1, 40)]}, (0, -1), id="v13-topic-ids"),
    pytest.param(15, {"orders": [(0, 99)]}, (12, 9), id="v15-no-replica-id"),
]


@pytest.mark.parametrize(("version", "listed", "session"), FETCHES)
async def test_a_fetch_request_carries_each_listed_position_and_its_isolation_level(
    tmp_path: Path, version: int, listed: dict, session: tuple[int, int]
) -> None:
    def offer(events: TraceEvents, writer: TraceWriter) -> None:
        # An incremental session request also tells the broker what to forget: not traced.
        forgotten = ("payments",) if session[1] > 0 else ()
        for corr, isolation in ((1, 1), (2, 0)):
            row, _ = fast_path(events, fetch_request(version, listed, isolation=isolation, session=session,
                                                     forgotten=forgotten), corr)
            assert writer.offer(row)

    writer, _ = traced(tmp_path, "records", offer)
    committed, uncommitted = await written(writer)
    want = [("orders", p, offset, None) for p, offset in listed["orders"]]
    # v13+ names the topic by id: the same id -> name map as the responses maps it back.
    assert positions(committed) == positions(uncommitted) == want
    assert (committed["isolation_level"], uncommitted["isolation_level"]) == (1, 0)
    assert committed["api"] == "fetch" and committed["direction"] == "request" and committed["group_id"] is None
    assert all(set(p) == {"topic", "partition", "fetch_offset"} for p in committed["partitions"])


async def test_a_fetch_by_a_topic_id_not_yet_named_traces_the_id_as_text(tmp_path: Path) -> None:
    def offer(events: TraceEvents, writer: TraceWriter) -> None:
        writer.offer(fast_path(events, fetch_request(13, {"new": [(0, 3)]}))[0])

    writer, _ = traced(tmp_path, "records", offer)
    (event,) = await written(writer)
    assert positions(event) == [(str(UNKNOWN_ID), 0, 3, None)]


async def test_headers_level_keeps_the_isolation_level_and_group_and_no_partitions(tmp_path: Path) -> None:
    def offer(events: TraceEvents, writer: TraceWriter) -> None:
        assert apis.PRODUCE not in events.framed_requests  # a Produce frame is not kept at this level
        writer.offer(fast_path(events, fetch_request(12, {"orders": [(0, 17)]}, isolation=1))[0])
        writer.offer(fast_path(events, offset_commit(8, {0: 18}), 2)[0])

    writer, _ = traced(tmp_path, "headers", offer)
    fetch, commit = await written(writer)
    assert (fetch["isolation_level"], fetch["partitions"]) == (1, None)
    assert (commit["group_id"], commit["partitions"]) == (GROUP, None)


async def test_a_fetch_off_the_fast_path_is_traced_alike(tmp_path: Path) -> None:
    """A rule on Fetch requests takes them through the stages: the same positions and isolation level."""
    path = pipeline([{"id": "slow", "match": {"api": "fetch"}, "action": {"type": "delay", "ms": 1}}])
    writer = TraceWriter(tmp_path, proxy_id="t", level="records")
    events = TraceEvents("t", True, dict(NAMES), writer.raw_ledger)
    frame = encode_request(fetch_request(13, {"orders": [(0, 17)]}), 1, "c")
    ex = Exchange(apis.FETCH, 13, 1, "c", 0.0)
    ex.header, ex.request_frame = parse_request_header(frame, 4), frame
    path.on_request(ex, 0.0)
    events.request_records(ex)
    writer.offer(events.request(Conn, ex))
    (event,) = await written(writer)
    assert (positions(event), event["isolation_level"], event["rule"]) == ([("orders", 0, 17, None)], 1, "slow")


async def test_a_repeated_fetch_is_decoded_once_and_a_topic_named_since_is_named(tmp_path: Path) -> None:
    """An idle consumer repeats its Fetch: the writer looks the body up; a topic id Metadata names later is a new key."""
    writer = TraceWriter(tmp_path, proxy_id="t", level="records")
    names: dict = {}
    events = TraceEvents("t", True, names, writer.raw_ledger)
    body = fetch_request(13, {"orders": [(0, 17)]})
    for corr in (1, 2):
        writer.offer(fast_path(events, body, corr)[0])
    await writer.aclose()  # composed and written: the id was not known yet
    names.update(NAMES)
    writer = TraceWriter(tmp_path / "later", proxy_id="t", level="records")
    events.ledger = writer.raw_ledger
    writer.offer(fast_path(events, body, 3)[0])
    first, again, named = [*iter_trace_events(tmp_path), *await written(writer)]
    assert positions(first) == positions(again) == [(str(TOPIC_ID), 0, 17, None)]
    assert positions(named) == [("orders", 0, 17, None)]
    assert len(events.request_views._recent) == 2  # one decode per distinct (body, map)


@pytest.mark.parametrize("fmt", ["segments", "jsonl", "parquet"])
async def test_positions_read_back_from_every_format(tmp_path: Path, fmt: str) -> None:
    writer = TraceWriter(tmp_path, proxy_id="t", level="records", fmt=fmt)
    events = TraceEvents("t", True, dict(NAMES), writer.raw_ledger)
    writer.offer(fast_path(events, fetch_request(12, {"orders": [(0, 17)]}))[0])
    writer.offer(fast_path(events, offset_commit(8, {0: 18}), 2)[0])
    fetch, commit = await written(writer)
    assert (positions(fetch), fetch["isolation_level"]) == ([("orders", 0, 17, None)], 1)
    assert (positions(commit), commit["group_id"]) == ([("orders", 0, None, 18)], GROUP)


# ------------------------------------------------------------------ OffsetCommit and its answer


@pytest.mark.parametrize("version", range(2, 11))
async def test_an_offset_commit_carries_its_group_and_committed_offsets(tmp_path: Path, version: int) -> None:
    def offer(events: TraceEvents, writer: TraceWriter) -> None:
        row, ex = fast_path(events, offset_commit(version, {0: 18, 1: 41}))
        writer.offer(row)
        writer.offer(events.fast_response(Conn, ex, offset_commit_answer(version, {0: 0, 1: 25}, 1), 0.0))

    writer, _ = traced(tmp_path, "records", offer)
    request, response = await written(writer)
    assert request["group_id"] == GROUP and request["isolation_level"] is None
    assert positions(request) == [("orders", 0, None, 18), ("orders", 1, None, 41)]  # v10: by topic id
    assert response["error_codes"] == [25] and response["error_code"] == 25
    assert [(p["topic"], p["partition"], p["error_code"]) for p in response["partitions"]] == [
        ("orders", 0, 0), ("orders", 1, 25)]


# ------------------------------------------------------------------ DeleteTopics: what no later read can find


def delete_topics(version: int, names: tuple[str, ...]) -> Any:
    m = schema("delete_topics", version)
    if version < 6:
        return build(m.DeleteTopicsRequest, topic_names=names, timeout=datetime.timedelta(seconds=5))
    # v6+: by name, or by topic id alone (the trace names it from what Metadata told it).
    states = tuple(m.DeleteTopicState(name=None, topic_id=TOPIC_ID) if n == "orders" else
                   m.DeleteTopicState(name=n, topic_id=UNKNOWN_ID) for n in names)
    return build(m.DeleteTopicsRequest, topics=states, timeout=datetime.timedelta(seconds=5))


def delete_topics_answer(version: int, errors: dict[str, int], correlation_id: int) -> bytes:
    m = schema("delete_topics", version, "response")
    results = tuple(build(m.DeletableTopicResult, name=n, topic_id=TOPIC_ID, error_code=ErrorCode(e),
                          error_message=None) for n, e in errors.items())
    return encode_response(build(m.DeleteTopicsResponse, throttle_time=datetime.timedelta(0), responses=results),
                           correlation_id)


@pytest.mark.parametrize("version", range(1, 7))
async def test_a_delete_topics_carries_the_topics_it_deletes_and_each_answer(tmp_path: Path, version: int) -> None:
    def offer(events: TraceEvents, writer: TraceWriter) -> None:
        row, ex = fast_path(events, delete_topics(version, ("orders", "audit")))
        writer.offer(row)
        writer.offer(events.fast_response(Conn, ex, delete_topics_answer(version, {"orders": 0, "audit": 41}, 1), 0.0))

    writer, _ = traced(tmp_path, "records", offer)
    request, response = await written(writer)
    assert [p["topic"] for p in request["partitions"]] == ["orders", "audit"]
    assert [(p["topic"], p["error_code"]) for p in response["partitions"]] == [("orders", 0), ("audit", 41)]
    # At level `headers` the event is there, without its topics.
    writer, _ = traced(tmp_path, "headers", offer)
    request, response = await written(writer)
    assert request["partitions"] is None and response["error_codes"] == [41]


# ------------------------------------------------------------------ TxnOffsetCommit: the tracker decodes it


@pytest.mark.parametrize("version", range(6))
async def test_a_txn_offset_commit_carries_group_offsets_producer_and_transaction(tmp_path: Path, version: int) -> None:
    path = pipeline()
    writer = TraceWriter(tmp_path, proxy_id="t", level="records")
    events = TraceEvents("t", True, dict(NAMES), writer.raw_ledger)
    frame = encode_request(txn_offset_commit(version, {0: 18, 3: 7}), 5, "c")
    ex = Exchange(apis.TXN_OFFSET_COMMIT, version, 5, "c", 0.0)
    ex.header, ex.request_frame = parse_request_header(frame, 4), frame
    assert apis.TXN_OFFSET_COMMIT in path.routing.slow_request_apis
    path.on_request(ex, 0.0)  # decoded and numbered, as on the data path
    events.request_records(ex)
    writer.offer(events.request(Conn, ex))
    answer = txn_offset_commit_answer(version, {0: 0, 3: 47}, 5)
    answered = path.on_answer(ex, answer, path.response_plan(ex, 0.0), 0.0)
    writer.offer(events.response(Conn, ex, len(answer) - 4, answered.codes, answered.decoded, 0.0))
    request, response = await written(writer)
    assert (request["transactional_id"], request["producer_id"], request["producer_epoch"], request["txn_client"]) == (
        TXN, PID, EPOCH, 1)
    assert request["group_id"] == GROUP
    assert positions(request) == [("orders", 0, None, 18), ("orders", 3, None, 7)]
    assert response["error_codes"] == [47]
    assert [(p["topic"], p["partition"], p["error_code"]) for p in response["partitions"]] == [
        ("orders", 0, 0), ("orders", 3, 47)]


# ------------------------------------------------------------------ group ids, read in place


def _facts(api: str, version: int, **body: Any) -> tuple[int | None, str | None]:
    frame = encode_request(build(getattr(schema(api, version), "".join(w.title() for w in api.split("_")) + "Request"),
                                 **body), 1, "c")
    header = parse_request_header(frame, 4)
    return request_facts(header.api_key, version, frame, 4 + header.body_offset)


GROUP_REQUESTS = [
    ("join_group", v, {"group_id": GROUP, "session_timeout": datetime.timedelta(seconds=10),
                       "rebalance_timeout": datetime.timedelta(seconds=10), "member_id": "", "group_instance_id": None,
                       "protocol_type": "consumer", "protocols": (), "reason": None})
    for v in (0, 5, 6, 9)
] + [
    ("sync_group", v, {"group_id": GROUP, "generation_id": 1, "member_id": "m", "group_instance_id": None,
                       "protocol_type": None, "protocol_name": None, "assignments": ()})
    for v in (0, 3, 4, 5)
] + [
    ("heartbeat", v, {"group_id": GROUP, "generation_id": 1, "member_id": "m", "group_instance_id": None})
    for v in (0, 3, 4)
] + [
    ("leave_group", v, {"group_id": GROUP, "member_id": "m", "members": ()}) for v in (0, 3, 4, 5)
] + [
    ("consumer_group_heartbeat", v, {"group_id": GROUP, "member_id": "m", "member_epoch": 0,
                                     "rebalance_timeout": datetime.timedelta(seconds=10),
                                     "subscribed_topic_names": ("orders",), "topic_partitions": ()})
    for v in (0, 1)
] + [
    ("offset_fetch", v, {"group_id": GROUP, "topics": None, "require_stable": False}) for v in (1, 5, 6, 7)
] + [
    ("add_offsets_to_txn", v, {"transactional_id": TXN, "producer_id": PID, "producer_epoch": EPOCH,
                               "group_id": GROUP})
    for v in (0, 2, 3, 4)
]


@pytest.mark.parametrize(("api", "version", "body"), GROUP_REQUESTS, ids=lambda v: str(v) if isinstance(v, int) else
                         v if isinstance(v, str) else "")
def test_group_requests_name_their_group(api: str, version: int, body: dict) -> None:
    assert _facts(api, version, **body) == (None, GROUP)


def test_an_offset_fetch_for_several_groups_names_none() -> None:
    m = schema("offset_fetch", 8)

    def groups(*ids: str) -> tuple:
        return tuple(m.OffsetFetchRequestGroup(group_id=g, topics=None) for g in ids)

    assert _facts("offset_fetch", 8, groups=groups(GROUP)) == (None, GROUP)
    assert _facts("offset_fetch", 8, groups=groups(GROUP, "other")) == (None, None)


def test_a_request_cut_short_has_no_facts_rather_than_an_error() -> None:
    frame = encode_request(offset_commit(8, {0: 1}), 1, "c")
    header = parse_request_header(frame, 4)
    body = 4 + header.body_offset
    assert request_facts(apis.API_KEYS["offset_commit"], 8, frame[: body + 3], body) == (None, None)
    assert request_facts(apis.FETCH, 12, frame[: body + 3], body) == (None, None)


# ------------------------------------------------------------------ traces written before these fields

DATA = Path(__file__).parent / "data"
OLD = DATA / "old-traces"
NEW_FIELDS = ("isolation_level", "group_id")
NEW_PARTITION_FIELDS = ("fetch_offset", "committed_offset")


@pytest.mark.parametrize("fmt", ["segments", "parquet"])
def test_a_trace_written_before_the_consumer_fields_reads_with_them_null(fmt: str) -> None:
    from kproxy.obs.trace_schema import FIELD_NAMES

    events = list(iter_trace_events(OLD / fmt))
    apis_ = ("fetch", "offset_commit", "txn_offset_commit")
    assert [(e["api"], e["direction"]) for e in events] == [(a, d) for a in apis_ for d in ("request", "response")]
    for event in events:
        assert set(event) == set(FIELD_NAMES) and all(event[name] is None for name in NEW_FIELDS)
    (part,) = events[1]["partitions"]  # the Fetch response: its records still come from the side file
    assert [(r["offset"], r["key"]) for r in part["records"]] == [(40, "k40"), (41, "k41")]
    assert all(part.get(name) is None for name in NEW_PARTITION_FIELDS)
    assert events[4]["transactional_id"] == "tx-1" and events[4]["txn_client"] == 1


def test_recorded_json_lines_traces_still_read_and_export() -> None:
    import io

    from kproxy.obs.trace_files import export_jsonl, iter_file_events

    for path in sorted((DATA / "recorded").glob("*/traces/*.jsonl.gz")):
        events = list(iter_file_events(path))
        assert events and all(e.get(name) is None for e in events for name in NEW_FIELDS)
        out = io.BytesIO()
        assert export_jsonl(path, out) == len(events)


@pytest.mark.spark
def test_the_analysis_reads_old_traces_of_every_format_with_the_new_fields_null(spark, tmp_path: Path) -> None:
    """Segments (columns by name), Parquet (top-level and nested columns the file lacks) and JSON Lines."""
    import shutil

    from kproxy_spark.traces import load_traces
    from pyspark.sql import functions as F

    mixed = tmp_path / "traces"  # read recursively: the old segment and Parquet folders and a JSON Lines file
    shutil.copytree(OLD, mixed)
    shutil.copy(DATA / "recorded" / "noida-healthy" / "traces" / "trace.jsonl.gz", mixed / "trace.jsonl.gz")
    rows = load_traces(spark, mixed).select(
        "proxy_id", "api", "direction", *NEW_FIELDS,
        F.transform("partitions", lambda p: F.struct(*(p[name] for name in NEW_PARTITION_FIELDS),
                                                      p["records"]["offset"].alias("offsets"))).alias("parts"),
    ).collect()
    assert all(row[name] is None for row in rows for name in NEW_FIELDS)
    parts = [part for row in rows for part in row["parts"] or ()]
    assert parts and all(part[name] is None for part in parts for name in NEW_PARTITION_FIELDS)
    old = [row for row in rows if row["proxy_id"] == "old"]
    assert len(old) == 12 and len(rows) > 100  # both old files, and the recorded run
    fetched = [part["offsets"] for row in old if row["api"] == "fetch" and row["direction"] == "response"
               for part in row["parts"]]
    assert fetched == [[40, 41], [40, 41]]  # the records, from the side files of both formats


# ------------------------------------------------------------------ live: a real proxy, broker and clients


@pytest.mark.timeout(90)
def test_a_read_committed_consumer_and_a_transactional_offset_commit_are_traced(proxy_factory, broker, tmp_path: Path):
    """confluent-kafka through a records-level proxy: a read_committed consumer in a group, a transaction that
    sends its offsets, and a plain commit; the trace alone says where it read from and what it committed."""
    import time

    from confluent_kafka import Consumer, Producer, TopicPartition

    from tests.fixtures.broker import create_topic

    run = uuid.uuid4().hex[:8]
    source, sink, group = f"in-{run}", f"out-{run}", f"g-{run}"
    for name in (source, sink):
        create_topic(broker.bootstrap, name)
    traces = tmp_path / "traces"
    proxy = proxy_factory("--traces", str(traces), "--trace-level", "records")
    plain = Producer({"bootstrap.servers": proxy.bootstrap})
    for i in range(3):
        plain.produce(source, value=b"v%d" % i, partition=0)
    assert plain.flush(10) == 0
    consumer = Consumer({"bootstrap.servers": proxy.bootstrap, "group.id": group, "isolation.level": "read_committed",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest", "session.timeout.ms": 6000})
    consumer.subscribe([source])
    got = []
    deadline = time.monotonic() + 30
    while len(got) < 3 and time.monotonic() < deadline:
        message = consumer.poll(0.2)
        if message is not None and not message.error():
            got.append(message.offset())
    assert got == [0, 1, 2]
    producer = Producer({"bootstrap.servers": proxy.bootstrap, "transactional.id": f"tx-{run}"})
    producer.init_transactions(10)
    producer.begin_transaction()
    producer.produce(sink, value=b"out", partition=0)
    producer.send_offsets_to_transaction([TopicPartition(source, 0, 3)], consumer.consumer_group_metadata(), 10)
    producer.commit_transaction(10)
    consumer.commit(offsets=[TopicPartition(source, 0, 3)], asynchronous=False)
    consumer.close()
    producer.flush(5)
    proxy.stop()  # the writer writes everything it accepted before it exits

    requests = [e for e in iter_trace_events(traces) if e["direction"] == "request"]
    fetches = [e for e in requests if e["api"] == "fetch" and e["partitions"]]
    assert fetches and {e["isolation_level"] for e in fetches} == {1}
    asked = {(p["topic"], p["partition"], p["fetch_offset"]) for e in fetches for p in e["partitions"]}
    assert {(source, 0, 0), (source, 0, 3)} <= asked  # from the start, then past what it read
    (txn_commit,) = [e for e in requests if e["api"] == "txn_offset_commit"]
    assert txn_commit["group_id"] == group and txn_commit["transactional_id"] == f"tx-{run}"
    assert txn_commit["txn_client"] is not None and txn_commit["producer_id"] is not None
    assert positions(txn_commit) == [(source, 0, None, 3)]
    commits = [e for e in requests if e["api"] == "offset_commit"]
    assert commits and all(e["group_id"] == group for e in commits)
    assert (source, 0, None, 3) in {c for e in commits for c in positions(e)}
    grouped = {e["group_id"] for e in requests if e["api"] in ("add_offsets_to_txn", "join_group", "sync_group")}
    assert grouped == {group}
