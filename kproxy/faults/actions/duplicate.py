"""duplicate: forward a request, then send extra copies of it."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from kproxy.faults.actions.fields import HoldEvent, Milliseconds
from kproxy.faults.actions.registry import ActionParams, Draw, register
from kproxy.pipeline.plans import SendCopies
from kproxy.faults.decisions import Duplicate


class DuplicateParams(ActionParams):
    type: Literal["duplicate"]
    copies: int = Field(default=1, ge=1, le=100)
    spacing_ms: Milliseconds = 0
    # Keep the copies back until this event, so they land in a later transaction.
    hold_until: HoldEvent | None = None


@register("duplicate", DuplicateParams, directions=("request",),
          summary="forward, then send `copies` extra copies spacing_ms apart (responses discarded)",
          request_plan=lambda d: SendCopies(d.copies, d.spacing_s, d.release_on))
def build(params: DuplicateParams, rule_id: str, draw: Draw) -> Duplicate:
    return Duplicate(rule_id=rule_id, copies=params.copies, spacing_s=params.spacing_ms / 1000,
                     release_on=params.hold_until)
