"""drop_response: forward, but lose the response (the ack never arrives)."""

from __future__ import annotations

from typing import Literal

from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.pipeline.plans import ResponsePlan, Send

_LOST = ResponsePlan(withhold=True)
from kproxy.faults.decisions import DropResponse


class DropResponseParams(ActionParams):
    type: Literal["drop_response"]


@register("drop_response", DropResponseParams, directions=("request", "response"),
          summary="forward, but never give the response to the client",
          request_plan=lambda d: Send(then=_LOST), response_plan=lambda d: _LOST)
def build(params: DropResponseParams, rule_id: str, draw: Draw) -> DropResponse:
    return DropResponse(rule_id=rule_id)
