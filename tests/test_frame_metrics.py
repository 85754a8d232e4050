"""kproxy_frames_total counts what the trace counts, source by source.

Real producers through a real `kproxy run` in front of the real broker, with a
rule that answers Produce requests itself (respond) and one that copies them
over the proxy's own connection (duplicate). Per API, direction and source,
the counter equals the trace's events: client requests, the broker's
responses, the proxy's own responses and the ghost copies with theirs.
"""

from __future__ import annotations

import signal
import time
from collections import Counter
from pathlib import Path

import httpx
from confluent_kafka import Producer
from prometheus_client.parser import text_string_to_metric_families

from kproxy.obs.trace_files import iter_trace_events
from tests.fixtures.proxy import metric_value

RULES = """\
version: 1
rules:
  - id: answer-produce
    match: {api: produce, client_id: answered}
    action: {type: respond, error: NOT_LEADER_OR_FOLLOWER}
    limits: {count: 2}
  - id: copy-produce
    match: {api: produce, client_id: copied}
    action: {type: duplicate, copies: 2}
"""


def frame_counts(admin_url: str) -> Counter[tuple[str, str, str]]:
    text = httpx.get(f"{admin_url}/metrics", timeout=5).text
    counts: Counter[tuple[str, str, str]] = Counter()
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if sample.name == "kproxy_frames_total" and sample.value:
                counts[sample.labels["api"], sample.labels["direction"], sample.labels["source"]] = int(sample.value)
    return counts


def trace_counts(events: list[dict]) -> Counter[tuple[str, str, str]]:
    counts: Counter[tuple[str, str, str]] = Counter()
    traced = set()
    for e in events:
        if e["direction"] == "request":
            traced.add((e["conn_id"], e["correlation_id"], e["copy"]))
            counts[e["api"], "request", "ghost" if e["copy"] else "client"] += 1
        elif e["direction"] == "response":
            source = {"ghost": "ghost", "answered": "proxy", "refused": "proxy"}.get(e["outcome"], "broker")
            counts[e["api"], "response", source] += 1
    # A request a close cut short before its delivery was counted on arrival; the close event lists it.
    for e in events:
        for entry in (e["in_flight"] or ()) if e["direction"] == "close" else ():
            if (entry["conn_id"], entry["correlation_id"], entry["copy"]) not in traced:
                counts[entry["api"], "request", "client"] += 1
    return counts


def test_frame_counter_equals_the_trace_by_source(proxy_factory, topic_name: str, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    traces = tmp_path / "traces"
    proxy = proxy_factory("--rules", str(rules), "--traces", str(traces))
    for client_id in ("answered", "copied", "plain"):
        producer = Producer({"bootstrap.servers": proxy.bootstrap, "client.id": client_id,
                             "message.timeout.ms": 15000, "retry.backoff.ms": 50})
        for i in range(3):
            producer.produce(topic_name, value=b"%s %d" % (client_id.encode(), i))
            producer.flush(15)
    # Copies are answered on the proxy's own connection, after the client's own answer.
    deadline = time.monotonic() + 10
    while metric_value(proxy, "kproxy_pending_requests", state="ghost") and time.monotonic() < deadline:
        time.sleep(0.1)
    counted = frame_counts(proxy.admin_url)
    assert proxy.stop(signal.SIGTERM) == 0, proxy.log_text()[-2000:]

    assert counted["produce", "response", "proxy"] == 2
    assert counted["produce", "request", "ghost"] == counted["produce", "response", "ghost"] == 6
    assert counted["produce", "request", "client"] == 3 + 3 + 2 + 3  # the answered ones were retried
    assert trace_counts(list(iter_trace_events(traces))) == counted
