"""Kafka error codes, as rules may spell them (name or number).

kio's ErrorCode enum is the table of record, so every error the protocol knows
can be injected, and a typo is refused at load time instead of on the wire.
A code is named back by kproxy.protocol.errors.error_name, in the spelling
rules use.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode


def resolve_error(spec: str | int) -> int:
    """The numeric error code named by `spec`; ValueError if it is unknown."""
    if isinstance(spec, bool):
        raise ValueError("an error is a Kafka error name or a numeric code, not a boolean")
    if isinstance(spec, int):
        try:
            return int(ErrorCode(spec))
        except ValueError:
            raise ValueError(f"unknown Kafka error code {spec}") from None
    try:
        return int(ErrorCode[spec.strip().lower()])
    except KeyError:
        raise ValueError(f"unknown Kafka error name {spec!r} (for example NOT_LEADER_OR_FOLLOWER or 6)") from None
