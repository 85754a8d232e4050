"""Kafka error codes by name: the one table, and the one way to name a code.

kio's ErrorCode enum is the table of record, so every error the protocol
knows has its name. Names are spelt as Kafka's documentation, client logs
and the rules spell them (NOT_LEADER_OR_FOLLOWER); a code kio does not know
(a newer broker's) is named by its number rather than refused, so a report
or a trace summary still shows it.
"""

from __future__ import annotations

from kio.schema.errors import ErrorCode

ERROR_NAMES: dict[int, str] = {int(code): code.name.upper() for code in ErrorCode}


def error_name(code: int) -> str:
    """Kafka's name for `code` (NOT_LEADER_OR_FOLLOWER), or the number itself if kio does not know it."""
    return ERROR_NAMES.get(code) or str(code)
