"""Every request's outcome, as the trace tells it.

A traced request has an outcome when the trace says what became of it:

- a response event answers it (from the broker, or made by the proxy);
- its own event says no answer comes (`dropped`: a rule blackholed it;
  `refused`: guard mode refused a copy the client never sent);
- a close event lists it in `in_flight`: the connection (or the proxy's own
  ghost link) closed while it had no answer, with the reason.

Requests are keyed by (proxy_id, conn_id, correlation_id, copy), as the
analysis pairs them. A folded idle Fetch exchange (`repeats`, docs/traces.md)
stands for the requests from its `first_correlation_id` to its
`correlation_id`, one by one, each answered by the folded response. A
Produce sent with acks=0 has no answer by design and
the trace does not say which ones were: keep acks=0 out of runs you check
this way.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

# Request outcomes that need no response event.
UNANSWERED_BY_DESIGN = ("dropped", "refused")

Key = tuple[str, int, int, int]


@dataclass
class Accounting:
    requests: int = 0
    answered: int = 0
    unanswered_by_design: int = 0
    # (close reason, in-flight state) -> requests lost with a closed connection
    lost_at_close: Counter[tuple[str, str]] = field(default_factory=Counter)
    # in-flight entries of close events whose request was never traced (a delay cut short)
    untraced_in_flight: int = 0
    # requests with no outcome at all: each is a hole in the trace
    without_outcome: list[dict[str, Any]] = field(default_factory=list)

    def summary(self) -> dict[str, Any]:
        return {
            "requests": self.requests,
            "answered": self.answered,
            "unanswered_by_design": self.unanswered_by_design,
            "lost_at_close": {f"{reason}/{state}": n for (reason, state), n in sorted(self.lost_at_close.items())},
            "untraced_in_flight": self.untraced_in_flight,
            "without_outcome": len(self.without_outcome),
        }


def _key(event: dict[str, Any], conn_id: Any = None) -> Key:
    return (
        event.get("proxy_id") or "",
        int(event["conn_id"] if conn_id is None else conn_id),
        int(event["correlation_id"]),
        int(event.get("copy") or 0),
    )


def _keys(event: dict[str, Any]) -> list[Key]:
    """The requests an event speaks for: one, or every one a folded exchange stands for."""
    key = _key(event)
    first = event.get("first_correlation_id")
    if not event.get("repeats") or first is None:
        return [key]
    proxy_id, conn_id, last, copy = key
    return [(proxy_id, conn_id, cid, copy) for cid in range(int(first), last + 1)]


def account(events: Iterable[dict[str, Any]]) -> Accounting:
    """Sort every traced request into answered, unanswered by design, lost at a close, or without outcome."""
    requests: dict[Key, dict[str, Any]] = {}
    answered: set[Key] = set()
    closed: dict[Key, tuple[str, str]] = {}
    for event in events:
        direction = event.get("direction")
        if direction == "request":
            for key in _keys(event):
                requests[key] = event
        elif direction == "response":
            answered.update(_keys(event))
        elif direction == "close":
            proxy_id = event.get("proxy_id") or ""
            for entry in event.get("in_flight") or ():
                key = (proxy_id, int(entry["conn_id"]), int(entry["correlation_id"]), int(entry.get("copy") or 0))
                closed.setdefault(key, (event.get("close_reason") or "unknown", entry.get("state") or "unknown"))
    result = Accounting(requests=len(requests))
    for key, event in requests.items():
        if key in answered:
            result.answered += 1
        elif event.get("outcome") in UNANSWERED_BY_DESIGN:
            result.unanswered_by_design += 1
        elif key in closed:
            result.lost_at_close[closed[key]] += 1
        else:
            result.without_outcome.append(event)
    result.untraced_in_flight = sum(1 for key in closed if key not in requests)
    return result
