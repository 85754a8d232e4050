"""disconnect: close the client or upstream connection around a frame."""

from __future__ import annotations

from typing import Literal

from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.faults.decisions import Disconnect


class DisconnectParams(ActionParams):
    type: Literal["disconnect"]
    side: Literal["client", "upstream"] = "client"
    when: Literal["before", "after"] = "before"


@register("disconnect", DisconnectParams, directions=("request", "response"),
          summary="close the client or upstream connection, before or after forwarding")
def build(params: DisconnectParams, rule_id: str, draw: Draw) -> Disconnect:
    return Disconnect(rule_id=rule_id, side=params.side, when=params.when)
