"""delay: hold a frame for a while, then pass it on."""

from __future__ import annotations

from typing import Literal

from kproxy.faults.actions.fields import Milliseconds
from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.pipeline.plans import ResponsePlan, SendLater
from kproxy.faults.decisions import Delay


class DelayParams(ActionParams):
    type: Literal["delay"]
    ms: Milliseconds
    # Uniform jitter in [-jitter_ms, +jitter_ms], drawn from the rule's seeded stream.
    jitter_ms: Milliseconds = 0


@register("delay", DelayParams, directions=("request", "response"), summary="hold the frame ms (+/- jitter_ms), then pass it on",
          request_plan=lambda d: SendLater(d.seconds), response_plan=lambda d: ResponsePlan(delay_s=d.seconds))
def build(params: DelayParams, rule_id: str, draw: Draw) -> Delay:
    ms = params.ms
    if params.jitter_ms:
        ms += (2 * draw() - 1) * params.jitter_ms
    return Delay(rule_id=rule_id, seconds=max(ms, 0.0) / 1000)
