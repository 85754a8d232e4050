"""Error codes of Fetch and Produce responses without decoding them.

The trace at level `headers` wants each response's error codes. Decoding a
Fetch response for them would copy every record batch; a Fetch response
forwarded cut-through (see kproxy.io.connection) is never whole in memory at
all. `FetchErrorScan` walks the response structure chunk by chunk instead:
it reads the few fields in front of each partition's records, skips the
records without copying them, and collects the error codes.

The walk is a generator that yields how many bytes it wants next: a positive
n to read n bytes (sent back into it), a negative n to skip n bytes. The
scanner is never fatal: on a structure it cannot follow it stops and keeps
what it found (the response itself is forwarded untouched either way).

Produce responses are small and always whole: `produce_error_codes` walks
one in place, a few times faster than a kio decode, which matters at tens of
thousands of small Produce requests a second.
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Union

from kproxy.protocol import apis, batch_scan
from kproxy.protocol.codec import DecodeError, decode_response, error_codes

_Walk = Generator[int, Union[bytes, None], None]

# Fetch versions the walk knows (kio's range; ApiVersions is capped to it).
MIN_VERSION = 4
MAX_VERSION = 18
_FLEXIBLE_FROM = 12
_TOPIC_ID_FROM = 13
# The same for Produce.
PRODUCE_MIN_VERSION = 3
PRODUCE_MAX_VERSION = 13


def _i16(b: bytes) -> int:
    return int.from_bytes(b, "big", signed=True)


_i32 = _i16  # same conversion, named for the field it reads


def _uvarint() -> Generator[int, Union[bytes, None], int]:
    value = shift = 0
    while True:
        b = (yield 1)[0]  # type: ignore[index]
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            return value
        shift += 7
        if shift > 35:
            raise ValueError("varint too long")


def _skip_tagged_fields() -> Generator[int, Union[bytes, None], None]:
    count = yield from _uvarint()
    for _ in range(count):
        yield from _uvarint()  # tag
        size = yield from _uvarint()
        if size:
            yield -size


def _array_length(flexible: bool) -> Generator[int, Union[bytes, None], int]:
    """Element count of an array; -1 for null."""
    if flexible:
        return (yield from _uvarint()) - 1
    return _i32((yield 4))  # type: ignore[arg-type]


def _fetch_walk(version: int, codes: list[int]) -> _Walk:
    flexible = version >= _FLEXIBLE_FROM
    yield -8  # length prefix, correlation id
    if flexible:
        yield from _skip_tagged_fields()  # response header v1
    yield -4  # throttle_time_ms
    if version >= 7:
        _note(codes, _i16((yield 2)))  # type: ignore[arg-type]
        yield -4  # session_id
    for _ in range(max(0, (yield from _array_length(flexible)))):
        if version >= _TOPIC_ID_FROM:
            yield -16  # topic_id
        elif flexible:
            yield -max(0, (yield from _uvarint()) - 1)  # compact topic name
        else:
            yield -max(0, _i16((yield 2)))  # type: ignore[arg-type]
        for _ in range(max(0, (yield from _array_length(flexible)))):
            yield -4  # partition_index
            _note(codes, _i16((yield 2)))  # type: ignore[arg-type]
            yield -16 if version < 5 else -24  # high watermark, last stable offset[, log start offset]
            aborted = yield from _array_length(flexible)
            for _ in range(max(0, aborted)):
                yield -16  # producer_id, first_offset
                if flexible:
                    yield from _skip_tagged_fields()
            if version >= 11:
                yield -4  # preferred_read_replica
            size = (yield from _uvarint()) - 1 if flexible else _i32((yield 4))  # type: ignore[arg-type]
            if size > 0:
                yield -size  # the records: never read
            if flexible:
                yield from _skip_tagged_fields()
        if flexible:
            yield from _skip_tagged_fields()
    # Top-level tagged fields (node endpoints) hold no error codes.


def _note(codes: list[int], code: int) -> None:
    if code and code not in codes:
        codes.append(code)


class FetchErrorScan:
    """Feed a Fetch response frame (length prefix included) in any chunks; read `codes`.

    `codes` lists the distinct non-zero error codes in the order they occur,
    like kproxy.protocol.codec.error_codes does for a decoded response.
    """

    __slots__ = ("codes", "complete", "_walk", "_want", "_buf")

    def __init__(self, version: int) -> None:
        self.codes: list[int] = []
        self.complete = False  # the walk reached the end of the topics
        self._walk = _fetch_walk(version, self.codes)
        self._want: int | None = next(self._walk)
        self._buf = b""

    def feed(self, chunk: bytes | memoryview) -> None:
        pos = 0
        end = len(chunk)
        while self._want is not None and pos < end:
            want = self._want
            if want < 0:
                take = min(-want, end - pos)
                pos += take
                if take < -want:
                    self._want = want + take
                    return
                self._resume(None)
            else:
                piece = bytes(chunk[pos : pos + want - len(self._buf)])
                pos += len(piece)
                buf = self._buf + piece if self._buf else piece
                if len(buf) < want:
                    self._buf = buf
                    return
                self._buf = b""
                self._resume(buf)

    @property
    def pending_skip(self) -> int:
        """Bytes the walk will skip next without looking (0 when it wants to read)."""
        want = self._want
        return -want if want is not None and want < 0 else 0

    @property
    def pending_read(self) -> int:
        """Bytes the walk wants to read next (0 when it skips or is done)."""
        want = self._want
        return want - len(self._buf) if want is not None and want > 0 else 0

    def skip(self, n: int) -> None:
        """The caller passed on n bytes of a pending skip without showing them."""
        want = self._want
        if want is None or want >= 0 or n > -want:
            raise ValueError(f"cannot skip {n} bytes here")
        if n == -want:
            self._resume(None)
        else:
            self._want = want + n

    def _resume(self, data: bytes | None) -> None:
        try:
            self._want = self._walk.send(data)
        except StopIteration:
            self._want = None
            self.complete = True
        except (ValueError, IndexError):
            self._want = None  # a structure the walk cannot follow: keep what was found


def scannable(version: int) -> bool:
    return MIN_VERSION <= version <= MAX_VERSION


def produce_scannable(version: int) -> bool:
    return PRODUCE_MIN_VERSION <= version <= PRODUCE_MAX_VERSION


def produce_error_codes(version: int, frame: bytes) -> list[int] | None:
    """Distinct non-zero error codes of a whole Produce response frame (prefix included).

    None when the frame does not follow the schema; the caller then decodes it.
    """
    try:
        return batch_scan.produce_response_error_codes(version, frame)
    except batch_scan.ScanError:
        return None


def response_error_codes(api_key: int, api_version: int, frame: bytes) -> list[int]:
    """Distinct non-zero error codes of a whole response frame (prefix included).

    Fetch and Produce answers are scanned in place (records skipped, not
    copied); any other answer, or one a scan cannot follow, is decoded with
    kio; one that cannot be decoded has none.
    """
    codes = None
    if api_key == apis.FETCH and scannable(api_version):
        scan = FetchErrorScan(api_version)
        scan.feed(frame)
        codes = scan.codes
    elif api_key == apis.PRODUCE and produce_scannable(api_version):
        codes = produce_error_codes(api_version, frame)
    if codes is None:
        try:
            codes = error_codes(decode_response(api_key, api_version, frame[4:]))
        except DecodeError:
            codes = []
    return codes
