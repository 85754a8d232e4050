"""disconnect: close the client or upstream connection around a frame."""

from __future__ import annotations

from typing import Literal

from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.pipeline.plans import Close, ResponsePlan
from kproxy.faults.decisions import Disconnect


class DisconnectParams(ActionParams):
    type: Literal["disconnect"]
    side: Literal["client", "upstream"] = "client"
    when: Literal["before", "after"] = "before"


@register("disconnect", DisconnectParams, directions=("request", "response"),
          summary="close the client or upstream connection, before or after forwarding",
          request_plan=lambda d: Close(d.side, d.when, then=ResponsePlan(withhold=True, close=d.side)),
          response_plan=lambda d: ResponsePlan(withhold=True, close=d.side))
def build(params: DisconnectParams, rule_id: str, draw: Draw) -> Disconnect:
    return Disconnect(rule_id=rule_id, side=params.side, when=params.when)
