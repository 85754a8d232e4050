"""What the data path does with one exchange's bytes: the plans stages return.

A small, closed vocabulary about bytes only. The trio shell (kproxy/io) carries
a plan out; it never needs to know which fault action, rule or hazard chose
it. A request plan also says what becomes of the response (`then`), so a rule
that acts on the answer (replace its error, rewrite it, lose it) needs no
second look at the decision once the broker has answered.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

Side = Literal["client", "upstream"]
# What releases a parked request (or a copy kept back): the producer's next
# transaction sent records, the client retried the request, or it hung up.
ReleaseOn = Literal["next_txn_records", "client_retry", "client_disconnect"]
# (decoded response, topic id -> name) -> the response the client gets instead.
Transform = Callable[[Any, Any], Any]


@dataclass(frozen=True, slots=True)
class ResponsePlan:
    """What becomes of the broker's answer before it goes back to the client."""

    delay_s: float = 0.0  # hold the answer back this long
    transform: Transform | None = None  # the client gets this rewrite of the decoded answer
    withhold: bool = False  # the client never gets it (a lost ack)
    close: Side | None = None  # then cut this side of the connection


PASS = ResponsePlan()


@dataclass(frozen=True, slots=True)
class Send:
    """Deliver the request to the broker now, on the client's connection."""

    then: ResponsePlan = PASS


@dataclass(frozen=True, slots=True)
class SendLater:
    """Deliver it after `seconds`; later responses on the connection wait behind it."""

    seconds: float
    then: ResponsePlan = PASS


@dataclass(frozen=True, slots=True)
class Park:
    """Keep it back until `release_on` (or `timeout_s`, None: no limit), then deliver it late.

    With `ghost` it goes over the proxy's own connection, whose answer is traced and discarded.
    """

    release_on: ReleaseOn
    timeout_s: float | None
    ghost: bool
    then: ResponsePlan = PASS


@dataclass(frozen=True, slots=True)
class SendCopies:
    """Deliver it now, then `copies` more over the proxy's own connection `spacing_s` apart
    (after `release_on`, when set); the copies' answers are traced and discarded."""

    copies: int
    spacing_s: float
    release_on: ReleaseOn | None
    then: ResponsePlan = PASS


@dataclass(frozen=True, slots=True)
class Answer:
    """Answer the client with `error_code` in the broker's stead; nothing is delivered."""

    error_code: int
    then: ResponsePlan = PASS


@dataclass(frozen=True, slots=True)
class Withhold:
    """Neither deliver nor answer it: later responses on the connection wait behind it."""

    then: ResponsePlan = PASS


@dataclass(frozen=True, slots=True)
class Close:
    """Cut `side` of the connection instead of delivering (`before`), or once delivered
    (`after`: when the answer is in, which the client then never gets)."""

    side: Side
    when: Literal["before", "after"]
    then: ResponsePlan = PASS


RequestPlan = Send | SendLater | Park | SendCopies | Answer | Withhold | Close

SEND = Send()
