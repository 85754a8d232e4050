"""rewrite: forward, then change one field of the response."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, model_validator

from kproxy.faults.actions.fields import KafkaError
from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.faults.decisions import Rewrite, RewriteField
from kproxy.faults.kafka_errors import resolve_error
from kproxy.faults.limits import MAX_COUNT

_STALE_FIELDS = ("fetch_stale_high_watermark", "fetch_stale_last_stable_offset")


class RewriteParams(ActionParams):
    type: Literal["rewrite"]
    field: RewriteField
    error: KafkaError | None = None
    lag: int | None = Field(default=None, ge=1, le=MAX_COUNT)

    @model_validator(mode="after")
    def _parameters_fit_the_field(self) -> "RewriteParams":
        # A parameter the chosen field ignores is almost always a mistake in the scenario.
        if self.error is not None and self.field != "produce_error_offset_zero":
            raise ValueError(f"'error' only applies to field produce_error_offset_zero, not {self.field}")
        if self.lag is not None and self.field not in _STALE_FIELDS:
            raise ValueError(f"'lag' only applies to fields {', '.join(_STALE_FIELDS)}, not {self.field}")
        return self


@register("rewrite", RewriteParams, directions=("request", "response"),
          summary="forward, then rewrite a Produce or Fetch response field")
def build(params: RewriteParams, rule_id: str, draw: Draw) -> Rewrite:
    error_code = None if params.error is None else resolve_error(params.error)
    return Rewrite(rule_id=rule_id, field=params.field, error_code=error_code, lag=params.lag or 1)
