"""Why a connection ends on purpose."""

from __future__ import annotations


class ConnectionClosed(Exception):
    """Ends a connection on purpose, with the reason for metrics and logs."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
