"""The action registry: one fault action per module, registered by name.

A rule file's `action.type` is validated against this registry (the rule
model's action field is the discriminated union of every registered params
model), so adding an action is adding one module here and importing it in
`kproxy.faults.actions`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

from pydantic import BaseModel, ConfigDict

from kproxy.faults.decisions import Decision
from kproxy.pipeline.plans import RequestPlan, ResponsePlan

Direction = str  # "request" | "response"
Draw = Callable[[], float]  # a seeded float in [0, 1)


class ActionParams(BaseModel):
    """Base of every action's parameters: strict, unknown keys refused."""

    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


P = TypeVar("P", bound=ActionParams)


@dataclass(frozen=True)
class ActionSpec(Generic[P]):
    name: str
    params: type[P]
    # Builds the decision once a rule applies; `draw` is the rule's seeded stream.
    build: Callable[[P, str, Draw], Decision]
    # Which side of the exchange a rule with this action may be matched on.
    directions: tuple[Direction, ...]
    summary: str
    # What the data path does with the bytes when a rule matched a request
    # (the plan also says what becomes of the response) or a response.
    request_plan: Callable[[Decision], RequestPlan] | None = None
    response_plan: Callable[[Decision], ResponsePlan] | None = None
    # The API names a rule's parameters make sense for (None: any API). A rule
    # whose `match` allows any other API is refused when it is loaded, since
    # the action could only fail on those frames.
    apis: Callable[[P], tuple[str, ...] | None] | None = None


ACTIONS: dict[str, ActionSpec] = {}


def register(
    name: str, params: type[P], *, directions: tuple[Direction, ...], summary: str,
    request_plan: Callable[[Any], RequestPlan] | None = None,
    response_plan: Callable[[Any], ResponsePlan] | None = None,
    apis: Callable[[Any], tuple[str, ...] | None] | None = None,
) -> Callable[[Callable[[P, str, Draw], Decision]], Callable[[P, str, Draw], Decision]]:
    """Register an action: its parameters, how a matched rule builds its decision, and the
    plan the data path carries out for it on each side it may match (one per direction)."""
    if ("request" in directions) != (request_plan is not None) or ("response" in directions) != (
        response_plan is not None
    ):
        raise RuntimeError(f"fault action {name!r} needs a plan for each of its directions {directions}")

    def decorator(build: Callable[[P, str, Draw], Decision]) -> Callable[[P, str, Draw], Decision]:
        if name in ACTIONS:
            raise RuntimeError(f"fault action {name!r} registered twice")
        ACTIONS[name] = ActionSpec(name, params, build, directions, summary, request_plan, response_plan, apis)
        return build

    return decorator
