"""What the engine tells the proxy to do with one request or response.

Each decision is a frozen dataclass carrying the id of the rule that made it
(empty for `Forward`) and a class-level `action` name, the same name the rule
file uses, the trace records and the `action` metric label carries. Times are
in seconds here (rule files speak milliseconds) so the trio shell can pass them
straight to `trio.sleep`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar, Literal

# What releases a held request or copy (the rule file's `until` / `hold_until`).
ReleaseOn = Literal["next_txn_records", "client_retry", "client_disconnect"]
Side = Literal["client", "upstream"]
When = Literal["before", "after"]
RewriteField = Literal[
    "produce_error_offset_zero",
    "fetch_stale_high_watermark",
    "fetch_stale_last_stable_offset",
    "fetch_drop_records",
    "fetch_drop_control_batches",
    "fetch_drop_aborted_transactions",
    "fetch_skip_batch",
    "fetch_hide_aborted",
]
ControlKind = Literal["commit", "abort"]


@dataclass(frozen=True, slots=True)
class Forward:
    """No rule applies: pass the frame through untouched."""

    rule_id: str
    action: ClassVar[str] = "forward"


@dataclass(frozen=True, slots=True)
class Delay:
    """Hold the frame for `seconds`, then pass it on (jitter already drawn)."""

    rule_id: str
    seconds: float
    action: ClassVar[str] = "delay"


@dataclass(frozen=True, slots=True)
class Duplicate:
    """Forward the request, then `copies` extra copies `spacing_s` apart.

    The extra copies go over the proxy's own upstream connection and their
    responses are traced and discarded. With `release_on` (the rule's
    `hold_until`), the copies wait for that event before they are sent.
    """

    rule_id: str
    copies: int
    spacing_s: float
    release_on: ReleaseOn | None
    action: ClassVar[str] = "duplicate"


@dataclass(frozen=True, slots=True)
class Drop:
    """Blackhole the request: never forwarded, never answered."""

    rule_id: str
    action: ClassVar[str] = "drop"


@dataclass(frozen=True, slots=True)
class Respond:
    """Answer the client with `error_code` without forwarding the request."""

    rule_id: str
    error_code: int
    action: ClassVar[str] = "respond"


@dataclass(frozen=True, slots=True)
class ReplaceError:
    """Forward, then replace the response's error code (an ambiguous failure)."""

    rule_id: str
    error_code: int
    action: ClassVar[str] = "replace_error"


@dataclass(frozen=True, slots=True)
class DropResponse:
    """Forward, but never give the response to the client (a lost ack)."""

    rule_id: str
    action: ClassVar[str] = "drop_response"


@dataclass(frozen=True, slots=True)
class Disconnect:
    """Close the `side` connection, `before` or `after` forwarding the frame."""

    rule_id: str
    side: Side
    when: When
    action: ClassVar[str] = "disconnect"


@dataclass(frozen=True, slots=True)
class Hold:
    """Keep the request until `release_on` happens (the rule's `until`), then deliver it late.

    After `timeout_s` (None: no limit) it is delivered anyway. With `ghost`,
    delivery goes over the proxy's own upstream connection even if the client
    has hung up, and the response is traced and discarded.
    """

    rule_id: str
    release_on: ReleaseOn
    timeout_s: float | None
    ghost: bool
    action: ClassVar[str] = "hold"


@dataclass(frozen=True, slots=True)
class Rewrite:
    """Forward, then rewrite `field` in the response.

    `error_code` applies to `produce_error_offset_zero` (None: keep the
    broker's error); `lag` is how many offsets a stale watermark trails by;
    `markers` are the control batches `fetch_drop_control_batches` removes;
    `end_marker` makes `fetch_hide_aborted` end an aborted-only batch with a
    no-op control record instead of emptying it.
    """

    rule_id: str
    field: RewriteField
    error_code: int | None
    lag: int
    markers: tuple[ControlKind, ...] = ("commit", "abort")
    end_marker: bool = False
    action: ClassVar[str] = "rewrite"


Decision = Forward | Delay | Duplicate | Drop | Respond | ReplaceError | DropResponse | Disconnect | Hold | Rewrite

FORWARD = Forward(rule_id="")
