"""Request/response headers and kio payload decode/encode.

Header parsing is hand-rolled with `struct` because it runs for every frame;
bodies are decoded with kio only when something (a rewrite, a rule, the
transaction tracker or the trace) needs them.
"""

from __future__ import annotations

import io
import struct
from dataclasses import dataclass
from functools import lru_cache
from typing import Any

from kio.index import load_request_schema, load_response_schema
from kio.schema.request_header.v2.header import RequestHeader as FlexibleRequestHeader
from kio.schema.response_header.v1.header import ResponseHeader as FlexibleResponseHeader
from kio.serial import entity_reader, entity_writer

from kproxy.protocol.apis import can_decode

_REQUEST_HEAD = struct.Struct(">hhih")  # api key, api version, correlation id, client id length
_I32 = struct.Struct(">i")


class DecodeError(ValueError):
    """A body that had to be decoded is not valid for its API and version."""


@dataclass(frozen=True, slots=True)
class RequestHeader:
    api_key: int
    api_version: int
    correlation_id: int
    client_id: str | None
    # Offset of the body inside the frame payload; -1 when the header's tagged
    # fields could not be skipped because the version is unknown to kio.
    body_offset: int


class ClientIds:
    """The last client id a connection sent, raw and decoded.

    A client sends the same client id in every request: comparing it in
    place and reusing the string costs less than decoding a new one each
    time, and every request the proxy holds then shares one string.
    """

    __slots__ = ("raw", "text")

    def __init__(self) -> None:
        self.raw = b""
        self.text = ""

    def decode(self, payload: bytes, pos: int, n: int) -> str:
        raw = self.raw
        if n == len(raw) and payload.startswith(raw, pos):
            return self.text
        raw = payload[pos : pos + n]
        self.raw, self.text = raw, raw.decode("utf-8", "replace")
        return self.text


def parse_request_header(payload: bytes, start: int = 0, client_ids: ClientIds | None = None) -> RequestHeader:
    """Parse a request header from a frame payload starting at `start`.

    With `client_ids` (one per connection), a client id equal to the last one is not decoded again.
    Raises DecodeError when the payload is too short to hold a header.
    """
    try:
        api_key, api_version, correlation_id, n = _REQUEST_HEAD.unpack_from(payload, start)
    except struct.error as exc:
        raise DecodeError(f"request shorter than a request header ({len(payload) - start} bytes)") from exc
    pos = start + 10
    client_id = None
    if n >= 0:
        if pos + n > len(payload):
            raise DecodeError("request header's client id runs past the end of the frame")
        if client_ids is None:
            client_id = payload[pos : pos + n].decode("utf-8", "replace")
        else:
            client_id = client_ids.decode(payload, pos, n)
        pos += n
    if can_decode(api_key, api_version):
        if request_is_flexible(api_key, api_version):
            pos = skip_tagged_fields(payload, pos)
    else:
        pos = -1
    return RequestHeader(api_key, api_version, correlation_id, client_id, pos - start if pos >= 0 else -1)


def response_correlation_id(payload: bytes, start: int = 0) -> int:
    return _I32.unpack_from(payload, start)[0]


def read_uvarint(data: bytes, pos: int) -> tuple[int, int]:
    shift = 0
    value = 0
    while True:
        if pos >= len(data):
            raise DecodeError("varint runs past the end of the frame")
        b = data[pos]
        pos += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value, pos
        shift += 7
        if shift > 35:
            raise DecodeError("varint too long")


def skip_tagged_fields(data: bytes, pos: int) -> int:
    count, pos = read_uvarint(data, pos)
    for _ in range(count):
        _, pos = read_uvarint(data, pos)
        size, pos = read_uvarint(data, pos)
        pos += size
    if pos > len(data):
        raise DecodeError("tagged fields run past the end of the frame")
    return pos


@lru_cache(maxsize=None)
def request_type(api_key: int, api_version: int) -> type | None:
    if not can_decode(api_key, api_version):
        return None
    return load_request_schema(api_key, api_version)


@lru_cache(maxsize=None)
def response_type(api_key: int, api_version: int) -> type | None:
    if not can_decode(api_key, api_version):
        return None
    return load_response_schema(api_key, api_version)


@lru_cache(maxsize=None)
def request_is_flexible(api_key: int, api_version: int) -> bool:
    cls = request_type(api_key, api_version)
    return cls is not None and cls.__header_schema__ is FlexibleRequestHeader


@lru_cache(maxsize=None)
def response_is_flexible(api_key: int, api_version: int) -> bool:
    cls = response_type(api_key, api_version)
    return cls is not None and cls.__header_schema__ is FlexibleResponseHeader


@lru_cache(maxsize=None)
def _reader(cls: type) -> Any:
    return entity_reader(cls)


@lru_cache(maxsize=None)
def _writer(cls: type) -> Any:
    return entity_writer(cls)


def decode_request(header: RequestHeader, payload: bytes, start: int = 0) -> Any:
    """Decode a request body; the frame payload (no length prefix) begins at `start`."""
    if header.body_offset < 0:
        raise DecodeError(f"no decoder for api {header.api_key} v{header.api_version}")
    return decode_request_body(header.api_key, header.api_version, payload, start + header.body_offset)


def decode_request_body(api_key: int, api_version: int, payload: bytes, pos: int) -> Any:
    """Decode a request body that starts at `pos` in `payload`."""
    cls = request_type(api_key, api_version)
    if cls is None:
        raise DecodeError(f"no decoder for api {api_key} v{api_version}")
    try:
        value, _ = _reader(cls)(payload, pos)
    except Exception as exc:  # kio raises a variety of errors on bad input
        raise DecodeError(f"undecodable {cls.__name__}: {exc}") from exc
    return value


def response_body_offset(api_key: int, api_version: int, payload: bytes) -> int:
    pos = 4
    if response_is_flexible(api_key, api_version):
        pos = skip_tagged_fields(payload, pos)
    return pos


def decode_response(api_key: int, api_version: int, payload: bytes) -> Any:
    """Decode a response body (payload = frame without length prefix)."""
    cls = response_type(api_key, api_version)
    if cls is None:
        raise DecodeError(f"no decoder for api {api_key} v{api_version}")
    try:
        value, _ = _reader(cls)(payload, response_body_offset(api_key, api_version, payload))
    except DecodeError:
        raise
    except Exception as exc:
        raise DecodeError(f"undecodable {cls.__name__}: {exc}") from exc
    return value


def encode_body(value: Any) -> bytes:
    buf = io.BytesIO()
    _writer(type(value))(buf, value)
    return buf.getvalue()


def encode_response(value: Any, correlation_id: int) -> bytes:
    """A complete response frame (length prefix included) for a kio payload."""
    head = _I32.pack(correlation_id)
    if type(value).__header_schema__ is FlexibleResponseHeader:
        head += b"\x00"  # no tagged fields
    body = head + encode_body(value)
    return len(body).to_bytes(4, "big") + body


def encode_request(value: Any, correlation_id: int, client_id: str | None) -> bytes:
    """A complete request frame (length prefix included) for a kio payload."""
    cls = type(value)
    head = struct.pack(">hhi", cls.__api_key__, cls.__version__, correlation_id)
    if client_id is None:
        head += b"\xff\xff"
    else:
        raw = client_id.encode()
        head += len(raw).to_bytes(2, "big") + raw
    if cls.__header_schema__ is FlexibleRequestHeader:
        head += b"\x00"
    body = head + encode_body(value)
    return len(body).to_bytes(4, "big") + body


def error_codes(value: Any, limit: int = 64) -> list[int]:
    """Distinct non-zero error codes anywhere in a decoded payload (bounded walk)."""
    found: list[int] = []
    stack = [value]
    seen = 0
    while stack and seen < 10_000:
        item = stack.pop()
        seen += 1
        if isinstance(item, tuple):
            stack.extend(item)
            continue
        fields = getattr(item, "__dataclass_fields__", None)
        if not fields:
            continue
        for name in fields:
            v = getattr(item, name)
            if name == "error_code" or name.endswith("_error_code"):
                code = int(v)
                if code and code not in found:
                    found.append(code)
                    if len(found) >= limit:
                        return found
            elif isinstance(v, tuple) and v and hasattr(v[0], "__dataclass_fields__"):
                stack.extend(v)
            elif hasattr(v, "__dataclass_fields__"):
                stack.append(v)
    return found
