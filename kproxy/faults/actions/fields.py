"""Parameter types shared by several actions."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, PlainValidator, WithJsonSchema

from kproxy.faults.kafka_errors import resolve_error
from kproxy.faults.limits import MAX_FAULT_MS


def _known_error(value: Any) -> str | int:
    if not isinstance(value, (str, int)):
        raise ValueError(f"an error is a Kafka error name like NOT_LEADER_OR_FOLLOWER or a numeric code, not {value!r}")
    resolve_error(value)  # raises ValueError, which pydantic reports at this field
    return value


# A Kafka error by name (NOT_LEADER_OR_FOLLOWER) or numeric code (6), kept as written.
KafkaError = Annotated[
    Any,
    PlainValidator(_known_error),
    WithJsonSchema({"anyOf": [{"type": "string"}, {"type": "integer"}],
                    "description": "Kafka error name (NOT_LEADER_OR_FOLLOWER) or numeric code (6)"}),
]
Milliseconds = Annotated[float, Field(ge=0, le=MAX_FAULT_MS, allow_inf_nan=False)]
HoldEvent = Literal["next_txn_records", "client_retry", "client_disconnect"]
