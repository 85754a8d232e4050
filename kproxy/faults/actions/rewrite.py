"""rewrite: forward, then change the response (one named field of a Produce or Fetch response).

Each field is one rewrite of kproxy.protocol.response_faults, listed once
in REWRITES; a parameter is accepted only by the fields it applies to.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from pydantic import Field, model_validator

from kproxy.faults.actions.fields import KafkaError
from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.faults.decisions import ControlKind, Rewrite, RewriteField
from kproxy.faults.kafka_errors import resolve_error
from kproxy.faults.limits import MAX_COUNT
from kproxy.pipeline.plans import ResponsePlan, Send
from kproxy.protocol import response_faults as rr

# The error a produce_error_offset_zero rule without `error` answers with.
NOT_LEADER_OR_FOLLOWER = 6

# field -> (decoded response, decision, topic id -> name) -> rewritten response
REWRITES: dict[str, Callable[[Any, Rewrite, Any], Any]] = {
    "produce_error_offset_zero": lambda resp, dec, names: rr.produce_error_with_offset(
        resp, dec.error_code if dec.error_code is not None else NOT_LEADER_OR_FOLLOWER, offset=0
    ),
    "fetch_stale_high_watermark": lambda resp, dec, names: rr.fetch_stale_high_watermark(resp, dec.lag),
    "fetch_stale_last_stable_offset": lambda resp, dec, names: rr.fetch_stale_last_stable_offset(resp, dec.lag),
    "fetch_drop_records": lambda resp, dec, names: rr.fetch_drop_records(resp),
    "fetch_drop_control_batches": lambda resp, dec, names: rr.fetch_drop_control_batches(resp, kinds=dec.markers),
    "fetch_drop_aborted_transactions": lambda resp, dec, names: rr.fetch_drop_aborted_transactions(resp),
    "fetch_skip_batch": lambda resp, dec, names: rr.fetch_skip_batch(resp),
    "fetch_hide_aborted": lambda resp, dec, names: rr.fetch_hide_aborted(resp, end_marker=dec.end_marker),
}

# Each field rewrites the response of one API, named by the field's prefix.
_FIELD_APIS = {"produce_": "produce", "fetch_": "fetch"}


def field_apis(params: RewriteParams) -> tuple[str, ...]:
    """The API a rewrite field applies to: its rule must match that API and no other."""
    return tuple(api for prefix, api in _FIELD_APIS.items() if params.field.startswith(prefix))


if any(sum(field.startswith(prefix) for prefix in _FIELD_APIS) != 1 for field in REWRITES):
    raise RuntimeError("every rewrite field must start with the prefix of exactly one API")


_STALE_FIELDS = ("fetch_stale_high_watermark", "fetch_stale_last_stable_offset")


def apply_rewrite(decision: Rewrite, response: Any, topic_names: Any) -> Any:
    """The decoded `response` as the rule rewrites it (a new payload; the input is not changed)."""
    return REWRITES[decision.field](response, decision, topic_names)


class RewriteParams(ActionParams):
    type: Literal["rewrite"]
    field: RewriteField
    error: KafkaError | None = None
    lag: int | None = Field(default=None, ge=1, le=MAX_COUNT)
    markers: list[ControlKind] | None = Field(default=None, min_length=1, description=(
        "fetch_drop_control_batches: which transaction markers to remove (default both)"))
    end_marker: bool | None = Field(default=None, description=(
        "fetch_hide_aborted: end an aborted-only batch with a no-op control record instead of emptying it"))

    @model_validator(mode="after")
    def _parameters_fit_the_field(self) -> "RewriteParams":
        # A parameter the chosen field ignores is almost always a mistake in the scenario.
        if self.error is not None and self.field != "produce_error_offset_zero":
            raise ValueError(f"'error' only applies to field produce_error_offset_zero, not {self.field}")
        if self.lag is not None and self.field not in _STALE_FIELDS:
            raise ValueError(f"'lag' only applies to fields {', '.join(_STALE_FIELDS)}, not {self.field}")
        if self.markers is not None and self.field != "fetch_drop_control_batches":
            raise ValueError(f"'markers' only applies to field fetch_drop_control_batches, not {self.field}")
        if self.end_marker is not None and self.field != "fetch_hide_aborted":
            raise ValueError(f"'end_marker' only applies to field fetch_hide_aborted, not {self.field}")
        return self


@register("rewrite", RewriteParams, directions=("request", "response"),
          summary="forward, then rewrite a Produce or Fetch response (field: which rewrite)",
          request_plan=lambda d: Send(then=_rewritten(d)), response_plan=lambda d: _rewritten(d),
          apis=field_apis)
def build(params: RewriteParams, rule_id: str, draw: Draw) -> Rewrite:
    error_code = None if params.error is None else resolve_error(params.error)
    markers = tuple(dict.fromkeys(params.markers)) if params.markers else ("commit", "abort")
    return Rewrite(rule_id=rule_id, field=params.field, error_code=error_code, lag=params.lag or 1,
                   markers=markers, end_marker=bool(params.end_marker))


def _rewritten(decision: Rewrite) -> ResponsePlan:
    return ResponsePlan(transform=lambda response, topic_names: apply_rewrite(decision, response, topic_names))
