"""hold: keep a request back until an event, then deliver it late."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kproxy.faults.actions.fields import HoldEvent
from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.pipeline.plans import Park
from kproxy.faults.decisions import Hold
from kproxy.faults.limits import MAX_FAULT_MS


class HoldParams(ActionParams):
    type: Literal["hold"]
    until: HoldEvent
    # Deliver anyway after this long; absent means wait for the event however long it takes.
    timeout_ms: float | None = Field(default=None, gt=0, le=MAX_FAULT_MS, allow_inf_nan=False)
    # Deliver over the proxy's own upstream connection, even after the client hung up.
    ghost: bool = False


@register("hold", HoldParams, directions=("request",),
          summary="keep the request until an event (or timeout_ms), then deliver it late; ghost: after the client hung up",
          request_plan=lambda d: Park(d.release_on, d.timeout_s, d.ghost))
def build(params: HoldParams, rule_id: str, draw: Draw) -> Hold:
    timeout_s = None if params.timeout_ms is None else params.timeout_ms / 1000
    return Hold(rule_id=rule_id, release_on=params.until, timeout_s=timeout_s, ghost=params.ghost)
