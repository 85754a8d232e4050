"""respond: answer with an error without forwarding the request."""

from __future__ import annotations

from typing import Literal

from kproxy.faults.actions.fields import KafkaError
from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.pipeline.plans import Answer
from kproxy.faults.decisions import Respond
from kproxy.faults.kafka_errors import resolve_error


class RespondParams(ActionParams):
    type: Literal["respond"]
    error: KafkaError


@register("respond", RespondParams, directions=("request",),
          summary="answer the client with `error` and do not forward",
          request_plan=lambda d: Answer(d.error_code))
def build(params: RespondParams, rule_id: str, draw: Draw) -> Respond:
    return Respond(rule_id=rule_id, error_code=resolve_error(params.error))
