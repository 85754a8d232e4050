"""drop_response: forward, but lose the response (the ack never arrives)."""

from __future__ import annotations

from typing import Literal

from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.faults.decisions import DropResponse


class DropResponseParams(ActionParams):
    type: Literal["drop_response"]


@register("drop_response", DropResponseParams, directions=("request", "response"),
          summary="forward, but never give the response to the client")
def build(params: DropResponseParams, rule_id: str, draw: Draw) -> DropResponse:
    return DropResponse(rule_id=rule_id)
