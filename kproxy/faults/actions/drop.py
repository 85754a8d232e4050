"""drop: blackhole a request (never forwarded, never answered)."""

from __future__ import annotations

from typing import Literal

from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.pipeline.plans import Withhold
from kproxy.faults.decisions import Drop


class DropParams(ActionParams):
    type: Literal["drop"]


@register("drop", DropParams, directions=("request",), summary="never forward the request, never answer it",
          request_plan=lambda d: Withhold())
def build(params: DropParams, rule_id: str, draw: Draw) -> Drop:
    return Drop(rule_id=rule_id)
