"""Cheap reads of a consumer's requests for the trace: a Fetch's isolation level, a group API's group id.

Fetch requests and the group APIs ride the fast path and are never decoded
there; the trace still wants these two facts at either level. Both sit at a
fixed place near the start of the body, so they are read in place (a byte,
or a string or two in), a fraction of a kio decode.
"""

from __future__ import annotations

from kproxy.protocol import apis
from kproxy.protocol.codec import request_is_flexible

FETCH_ISOLATION_FROM = 4  # Fetch v4 added isolation_level
FETCH_NO_REPLICA_ID_FROM = 15  # Fetch v15 moved replica_id into a tagged field
OFFSET_FETCH_GROUPS_FROM = 8  # OffsetFetch v8 asks for a list of groups

JOIN_GROUP = apis.API_KEYS["join_group"]
HEARTBEAT = apis.API_KEYS["heartbeat"]
LEAVE_GROUP = apis.API_KEYS["leave_group"]
SYNC_GROUP = apis.API_KEYS["sync_group"]
OFFSET_COMMIT = apis.API_KEYS["offset_commit"]
OFFSET_FETCH = apis.API_KEYS["offset_fetch"]
CONSUMER_GROUP_HEARTBEAT = apis.API_KEYS["consumer_group_heartbeat"]

# APIs whose body starts with the group id.
_GROUP_FIRST = frozenset({JOIN_GROUP, HEARTBEAT, LEAVE_GROUP, SYNC_GROUP, OFFSET_COMMIT, CONSUMER_GROUP_HEARTBEAT})
GROUP_APIS = _GROUP_FIRST | {OFFSET_FETCH, apis.TXN_OFFSET_COMMIT, apis.ADD_OFFSETS_TO_TXN}
# Requests whose trace event carries a fact read here.
FACT_APIS = GROUP_APIS | {apis.FETCH}


def _length(data: bytes, pos: int, flexible: bool) -> tuple[int, int]:
    """(length, next position) of a string (flexible: compact, unsigned varint of length + 1)."""
    if not flexible:
        return int.from_bytes(data[pos : pos + 2], "big", signed=True), pos + 2
    value = shift = 0
    while True:
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if b < 0x80:
            return value - 1, pos
        shift += 7
        if shift > 28:
            raise ValueError("varint too long")


def _text(data: bytes, pos: int, flexible: bool) -> tuple[str | None, int]:
    n, pos = _length(data, pos, flexible)
    if n < 0:
        return None, pos
    end = pos + n
    if end > len(data):
        raise ValueError("string past the end of the frame")
    return bytes(data[pos:end]).decode("utf-8", "replace"), end


def isolation_level(version: int, frame: bytes, body: int) -> int | None:
    """A Fetch request's isolation level (0 read_uncommitted, 1 read_committed); None before v4."""
    if version < FETCH_ISOLATION_FROM:
        return None
    # replica_id (up to v14), max_wait, min_bytes, max_bytes, then isolation_level.
    pos = body + (12 if version >= FETCH_NO_REPLICA_ID_FROM else 16)
    return frame[pos] if pos < len(frame) else None


def group_id(api_key: int, version: int, frame: bytes, body: int) -> str | None:
    """The group id of a group API's request (for OffsetFetch v8+, the one group it asks about); else None."""
    flexible = request_is_flexible(api_key, version)
    pos = body
    if api_key in _GROUP_FIRST:
        return _text(frame, pos, flexible)[0]
    if api_key == apis.TXN_OFFSET_COMMIT:
        _, pos = _text(frame, pos, flexible)  # transactional id
        return _text(frame, pos, flexible)[0]
    if api_key == apis.ADD_OFFSETS_TO_TXN:
        _, pos = _text(frame, pos, flexible)  # transactional id
        return _text(frame, pos + 10, flexible)[0]  # after producer id and epoch
    if api_key == OFFSET_FETCH:
        if version < OFFSET_FETCH_GROUPS_FROM:
            return _text(frame, pos, flexible)[0]
        groups, pos = _length(frame, pos, flexible)  # v8+ is flexible: a compact array
        return _text(frame, pos, flexible)[0] if groups == 1 else None
    return None


def request_facts(api_key: int, version: int, frame: bytes, body: int) -> tuple[int | None, str | None]:
    """(isolation level, group id) of a request whose body starts at `body` in `frame`; (None, None) when
    it carries neither or cannot be read (the request itself is forwarded untouched either way)."""
    try:
        if api_key == apis.FETCH:
            return isolation_level(version, frame, body), None
        if api_key in GROUP_APIS:
            return None, group_id(api_key, version, frame, body)
    except (IndexError, ValueError):
        pass
    return None, None
