"""Cheap reads of the first fields of a Produce request body.

Every Produce crosses the proxy, so these read only the leading
transactional id and acks instead of decoding the records.
"""

from __future__ import annotations

from kproxy.protocol.codec import DecodeError, RequestHeader, read_uvarint

FLEXIBLE_FROM = 9  # Produce v9+ uses compact strings and a flexible header


def body_start(payload: bytes, start: int, header: RequestHeader) -> int:
    """Where the request body starts in payload (the header starts at `start`)."""
    if header.body_offset >= 0:
        return start + header.body_offset
    # Versions kio cannot decode (v0-v2): non-flexible header, body after client id.
    n = int.from_bytes(payload[start + 8 : start + 10], "big", signed=True)
    return start + 10 + max(n, 0)


def _transactional_id_end(payload: bytes, pos: int, version: int) -> tuple[str | None, int]:
    if version < 3:
        return None, pos
    if version >= FLEXIBLE_FROM:
        n, pos = read_uvarint(payload, pos)
        n -= 1
    else:
        n = int.from_bytes(payload[pos : pos + 2], "big", signed=True)
        pos += 2
    if n < 0:
        return None, pos
    if pos + n > len(payload):
        raise DecodeError("Produce transactional id runs past the end of the frame")
    return payload[pos : pos + n].decode("utf-8", "replace"), pos + n


def produce_head(payload: bytes, start: int, header: RequestHeader) -> tuple[str | None, int]:
    """The Produce request's transactional id (None for non-transactional producers) and acks
    (0: the broker sends no response), read in one walk of the body's head."""
    txn_id, pos = _transactional_id_end(payload, body_start(payload, start, header), header.api_version)
    if pos + 2 > len(payload):
        raise DecodeError("Produce request too short to hold acks")
    return txn_id, int.from_bytes(payload[pos : pos + 2], "big", signed=True)


def produce_transactional_id(payload: bytes, start: int, header: RequestHeader) -> str | None:
    """The Produce request's transactional id (None for non-transactional producers)."""
    txn_id, _ = _transactional_id_end(payload, body_start(payload, start, header), header.api_version)
    return txn_id


def produce_acks(payload: bytes, start: int, header: RequestHeader) -> int:
    """The Produce request's acks; 0 means the broker sends no response."""
    return produce_head(payload, start, header)[1]
