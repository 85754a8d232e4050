"""The rule file, as pydantic models: strict types, unknown keys refused.

These models check each value on its own. Checks that relate several parts of
a file (duplicate ids, phases naming rules, actions allowed on a direction)
live in `kproxy.faults.consistency`, and `kproxy.faults.loader` turns both
kinds of problem into `file:line: path: message` errors.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, Literal, Union

from pydantic import BaseModel, ConfigDict, Field, PlainValidator, WithJsonSchema, model_validator

from kproxy.faults.actions import ACTIONS
from kproxy.faults.fieldspecs import parse_apis, parse_partitions, parse_txn_number, parse_versions
from kproxy.faults.globs import check_glob
from kproxy.faults.limits import MAX_COUNT, MAX_DURATION_S, MAX_RULES, MAX_SEED

# Ids and phase names become metric labels and URL path segments: keep them plain.
NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,99}$"


def _checked_by(parse: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """Validate with `parse` but keep the value as written."""

    def validate(value: Any) -> Any:
        parse(value)
        return value

    return validate


def _spelled(parse: Callable[[Any], Any], schema: dict[str, Any]) -> Any:
    # A single plain validator gives one clear error for a multi-form field,
    # where a pydantic union would report one error per alternative.
    return Annotated[Any, PlainValidator(_checked_by(parse)), WithJsonSchema(schema)]


_API_ITEM = {"anyOf": [{"type": "string"}, {"type": "integer", "minimum": 0}]}
_VERSION_ITEM = {"anyOf": [{"type": "integer", "minimum": 0}, {"type": "string", "pattern": r"^\d+(-\d*|\+)?$"}]}

ApiField = _spelled(parse_apis, {"anyOf": [_API_ITEM, {"type": "array", "items": _API_ITEM, "minItems": 1}],
                                 "description": "API name (end_txn, EndTxn) or key number, or a list"})
VersionsField = _spelled(parse_versions, {"anyOf": [_VERSION_ITEM, {"type": "array", "items": _VERSION_ITEM, "minItems": 1}],
                                          "description": "version, range \"3-5\", open range \"3+\", or a list"})
PartitionField = _spelled(parse_partitions, {"anyOf": [{"type": "integer", "minimum": 0},
                                                       {"type": "array", "items": {"type": "integer", "minimum": 0}, "minItems": 1}]})
TxnNumberField = _spelled(parse_txn_number, {"anyOf": [
    {"type": "integer", "minimum": 1},
    {"type": "object", "properties": {"min": {"type": "integer", "minimum": 1}, "max": {"type": "integer", "minimum": 1}},
     "additionalProperties": False, "minProperties": 1},
], "description": "synthetic client-side transaction number (1 = the producer's first transaction), or {min, max}"})
Glob = Annotated[str, PlainValidator(lambda v: check_glob(v) if isinstance(v, str) else _not_a_string(v)),
                 WithJsonSchema({"type": "string", "description": "shell-style glob: * ? [abc] [!abc]"})]
Name = Annotated[str, Field(pattern=NAME_PATTERN)]


def _not_a_string(value: Any) -> str:
    raise ValueError(f"a glob is a string, not {value!r}")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class Match(_Strict):
    """Which frames a rule applies to. Every key given must match; absent keys match anything."""

    api: ApiField | None = None
    versions: VersionsField | None = None
    direction: Literal["request", "response"] = "request"
    transactional_id: Glob | None = None
    client_id: Glob | None = None
    topic: Glob | None = None
    partition: PartitionField | None = None
    committed: bool | None = Field(default=None, description="EndTxn only: true for commit, false for abort")
    txn_number: TxnNumberField | None = None
    nth: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="apply only to the n-th match (after `after`)")
    every: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="apply to every k-th match (after `after`)")
    after: int | None = Field(default=None, ge=0, le=MAX_COUNT, description="skip the first n matches")
    probability: float | None = Field(default=None, ge=0, le=1, allow_inf_nan=False, description="seeded chance of applying")
    phase: Name | None = Field(default=None, description="only while this schedule phase is active")


class Limits(_Strict):
    count: int | None = Field(default=None, ge=1, le=MAX_COUNT, description="apply at most this many times")
    once: bool = Field(default=False, description="same as count: 1")
    duration_s: float | None = Field(default=None, gt=0, le=MAX_DURATION_S, allow_inf_nan=False, description="active this long after load, or after its phase started")

    @model_validator(mode="after")
    def _once_agrees_with_count(self) -> "Limits":
        if self.once and self.count not in (None, 1):
            raise ValueError(f"once: true means count: 1, but count is {self.count}")
        return self

    @property
    def max_applications(self) -> int | None:
        return 1 if self.once else self.count


# The action field is the tagged union of every registered action's parameters.
Action = Annotated[Union[tuple(spec.params for spec in ACTIONS.values())], Field(discriminator="type")]  # type: ignore[misc]


class Rule(_Strict):
    id: Name
    description: str = ""
    enabled: bool = True
    match: Match = Field(default_factory=Match)
    action: Action
    limits: Limits = Field(default_factory=Limits)


class Phase(_Strict):
    name: Name
    duration_s: float = Field(gt=0, le=MAX_DURATION_S, allow_inf_nan=False)
    rules: list[Name] = Field(default_factory=list, description="ids of rules active in this phase")


class Schedule(_Strict):
    phases: list[Phase] = Field(min_length=1)
    repeat: bool = Field(default=False, description="start over after the last phase (else healthy from then on)")

    @property
    def cycle_s(self) -> float:
        return sum(p.duration_s for p in self.phases)


class RuleFile(_Strict):
    version: Literal[1]
    seed: int | None = Field(default=None, ge=0, le=MAX_SEED, description="seed of the probability and jitter draws")
    rules: list[Rule] = Field(default_factory=list, max_length=MAX_RULES)
    schedule: Schedule | None = None
