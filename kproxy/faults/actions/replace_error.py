"""replace_error: forward, then tell the client it failed (an ambiguous failure)."""

from __future__ import annotations

from typing import Literal

from kproxy.faults.actions.fields import KafkaError
from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.faults.decisions import ReplaceError
from kproxy.faults.kafka_errors import resolve_error
from kproxy.pipeline.plans import ResponsePlan, Send
from kproxy.protocol.error_responses import replace_error_codes


class ReplaceErrorParams(ActionParams):
    type: Literal["replace_error"]
    error: KafkaError


@register("replace_error", ReplaceErrorParams, directions=("request", "response"),
          summary="forward, then replace the response's error code with `error`",
          request_plan=lambda d: Send(then=_replaced(d)), response_plan=lambda d: _replaced(d))
def build(params: ReplaceErrorParams, rule_id: str, draw: Draw) -> ReplaceError:
    return ReplaceError(rule_id=rule_id, error_code=resolve_error(params.error))


def _replaced(decision: ReplaceError) -> ResponsePlan:
    code = decision.error_code
    return ResponsePlan(transform=lambda response, topic_names: replace_error_codes(response, code))
