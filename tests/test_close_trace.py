"""Every request accounted for: a connection's close event lists what it left unanswered.

A disconnect rule cuts a connection because of one request while others are
still out: one awaiting the broker (a scripted broker that never answers),
one held back by a delay rule. The trace's close event names the reason, the
rule, and each of those requests with where it was, so no traced request is
left without an outcome.
"""

from __future__ import annotations

import signal
import time
import socket
from pathlib import Path

from kproxy.obs.accounting import account
from kproxy.obs.trace_files import iter_trace_events
from kproxy.obs.trace_schema import FIELD_NAMES
from tests.fixtures.proxy import SILENT_UPSTREAM
from tests.fixtures.scripted import ScriptedUpstream
from tests.test_proxy_bad_input import closed_by_peer, raw_connect, request_frame

API_VERSIONS, METADATA = 18, 3
METADATA_V1_ALL_TOPICS = b"\xff\xff\xff\xff"  # topics: null

RULES = """\
version: 1
rules:
  - id: slow-second-versions
    match: {api: api_versions, client_id: close-test, after: 1}
    action: {type: delay, ms: 60000}
  - id: cut-on-metadata
    match: {api: metadata, client_id: close-test}
    action: {type: disconnect}
"""


class SilentBroker(ScriptedUpstream):
    """Reads every request and answers none: requests stay in flight."""

    def answer(self, conn: socket.socket) -> None:
        while conn.recv(65536):
            pass


def test_close_event_lists_the_requests_a_cut_connection_left_unanswered(proxy_factory, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    rules.write_text(RULES)
    traces = tmp_path / "traces"
    with SilentBroker() as broker:
        proxy = proxy_factory("--rules", str(rules), "--traces", str(traces), *SILENT_UPSTREAM,
                              upstream=broker.address)
        s = raw_connect(proxy.bootstrap)
        s.sendall(request_frame(API_VERSIONS, 0, 1, b"", b"close-test")   # forwarded, never answered
                  + request_frame(API_VERSIONS, 0, 2, b"", b"close-test")  # delayed a minute
                  + request_frame(METADATA, 1, 3, METADATA_V1_ALL_TOPICS, b"close-test"))  # cut
        assert closed_by_peer(s)
        s.close()
        assert proxy.stop(signal.SIGTERM) == 0, proxy.log_text()[-2000:]

    events = list(iter_trace_events(traces))
    assert all(set(e) <= set(FIELD_NAMES) for e in events)
    closes = [e for e in events if e["direction"] == "close"]
    cut = [e for e in closes if e["close_reason"] == "fault_disconnect"]
    assert len(cut) == 1, closes
    # The others: the start-up check's connection (opened and closed by kproxy.proxy_process).
    assert all(e["close_reason"] == "client_closed" and e["in_flight"] == [] for e in closes if e not in cut)
    close = cut[0]
    assert close["close_reason"] == "fault_disconnect"
    assert (close["rule"], close["action"]) == ("cut-on-metadata", "disconnect")
    assert close["client_addr"] and close["broker_id"] == -1 and close["api"] is None
    conn = close["conn_id"]
    assert [(f["conn_id"], f["correlation_id"], f["copy"], f["api"], f["state"]) for f in close["in_flight"]] == [
        (conn, 1, 0, "api_versions", "awaiting_broker"),
        (conn, 2, 0, "api_versions", "delayed"),
    ]
    requests = {e["correlation_id"]: e["outcome"] for e in events if e["direction"] == "request"}
    # The delayed request never reached the broker: it has no request event, only its close entry.
    assert requests == {1: "delivered", 3: "dropped"}

    accounted = account(events)
    assert accounted.without_outcome == []
    assert accounted.summary() == {
        "requests": 2, "answered": 0, "unanswered_by_design": 1,
        "lost_at_close": {"fault_disconnect/awaiting_broker": 1},
        "untraced_in_flight": 1, "without_outcome": 0,
    }


def test_account_finds_a_request_without_outcome() -> None:
    """The check can fail: a request with neither answer nor close entry is reported."""
    base = {"proxy_id": "p", "conn_id": 1, "copy": 0, "api": "produce"}
    events = [
        {**base, "direction": "request", "correlation_id": 1, "outcome": "delivered"},
        {**base, "direction": "response", "correlation_id": 1, "outcome": "delivered"},
        {**base, "direction": "request", "correlation_id": 2, "outcome": "delivered"},
        {**base, "direction": "request", "correlation_id": 3, "outcome": "delivered"},
        {"proxy_id": "p", "conn_id": 1, "direction": "close", "close_reason": "client_closed",
         "in_flight": [{"conn_id": 1, "correlation_id": 3, "copy": 0, "state": "awaiting_broker"}]},
    ]
    accounted = account(events)
    assert [e["correlation_id"] for e in accounted.without_outcome] == [2]
    assert accounted.answered == 1 and dict(accounted.lost_at_close) == {("client_closed", "awaiting_broker"): 1}


def test_ghost_link_close_lists_its_unanswered_copies(proxy_factory, tmp_path: Path) -> None:
    """A duplicate's copy travels on the proxy's own link; stopped unanswered, that link's close lists it."""
    rules = tmp_path / "rules.yaml"
    rules.write_text("""\
version: 1
rules:
  - id: copy-versions
    match: {api: api_versions, client_id: close-test}
    action: {type: duplicate, copies: 1}
""")
    traces = tmp_path / "traces"
    with SilentBroker() as broker:
        proxy = proxy_factory("--rules", str(rules), "--traces", str(traces), *SILENT_UPSTREAM,
                              upstream=broker.address)
        s = raw_connect(proxy.bootstrap)
        s.sendall(request_frame(API_VERSIONS, 0, 5, b"", b"close-test"))
        deadline = time.monotonic() + 10
        while "ghost" not in str(list(iter_trace_events(traces)) if traces.exists() else []):
            assert time.monotonic() < deadline, "the copy was never traced"
            time.sleep(0.1)
        assert proxy.stop(signal.SIGTERM) == 0, proxy.log_text()[-2000:]
        s.close()

    events = list(iter_trace_events(traces))
    (client,) = [e for e in events if e["direction"] == "close" and e["in_flight"] and e["conn_id"] >= 0]
    (link,) = [e for e in events if e["direction"] == "close" and e["conn_id"] == -1]
    assert client["close_reason"] == link["close_reason"] == "proxy_shutdown"
    assert [(f["correlation_id"], f["copy"], f["state"]) for f in client["in_flight"]] == [(5, 0, "awaiting_broker")]
    assert link["client_addr"] is None and link["broker_id"] == -1
    assert [(f["conn_id"], f["correlation_id"], f["copy"], f["state"]) for f in link["in_flight"]] == [
        (client["conn_id"], 5, 1, "awaiting_broker")]
    accounted = account(events)
    assert accounted.without_outcome == [] and accounted.requests == 2
