"""Size-prefixed Kafka framing, sans-IO.

A `FrameBuffer` is fed whatever bytes a socket returned and hands back the
complete frames in order. It never copies a frame twice: frames are sliced out
of the accumulated buffer once. Malformed lengths raise `FrameError` with a
reason that names what was wrong; the caller closes that connection.
"""

from __future__ import annotations


DEFAULT_MAX_FRAME_BYTES = 100 * 1024 * 1024  # Kafka's socket.request.max.bytes


class FrameError(Exception):
    """The byte stream is not valid Kafka framing; the connection must close."""

    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason  # a bounded metric label (see obs.metrics.CLOSE_REASONS)


class FrameBuffer:
    """Accumulates a byte stream and cuts it into whole frames.

    `feed` returns one contiguous block of complete frames (length prefixes
    included, exactly the bytes that arrived) and the offset where each frame
    starts, so a caller that changes nothing can forward the block as is.
    """

    __slots__ = ("_buf", "_max", "_need")

    def __init__(self, max_frame_bytes: int = DEFAULT_MAX_FRAME_BYTES) -> None:
        self._buf: bytes | bytearray = b""
        self._max = max_frame_bytes
        # Bytes the buffered partial frame needs before anything can complete;
        # waiting for it keeps a large frame arriving in small chunks linear.
        self._need = 0

    def feed(self, chunk: bytes) -> tuple[bytes, list[int]]:
        """Add bytes; return (block of complete frames, frame start offsets)."""
        buf = self._buf
        if buf:
            if not isinstance(buf, bytearray):
                buf = self._buf = bytearray(buf)
            buf += chunk
            if len(buf) < self._need:
                return b"", []
            data = bytes(buf)
        else:
            data = chunk
        offsets: list[int] = []
        pos = 0
        end = len(data)
        limit = self._max
        while end - pos >= 4:
            size = int.from_bytes(data[pos : pos + 4], "big", signed=True)
            if size < 0:
                raise FrameError("negative_length", f"negative frame length {size}")
            if size > limit:
                raise FrameError("frame_too_large", f"frame length {size} exceeds the limit of {limit} bytes")
            if end - pos - 4 < size:
                break
            offsets.append(pos)
            pos += 4 + size
        if pos == end:
            self._buf = b""
            return data, offsets
        rest = end - pos
        self._need = 4 + int.from_bytes(data[pos : pos + 4], "big") if rest >= 4 else 4
        # Kept as bytes until more arrives: the start of a large response is
        # usually handed straight on (take_pending), and then never copied.
        self._buf = data[pos:] if pos else data
        return data[:pos], offsets

    @property
    def pending(self) -> int:
        """Bytes of an incomplete frame still waiting for the rest."""
        return len(self._buf)

    @property
    def pending_frame_size(self) -> int:
        """Whole size (prefix included) of the incomplete frame, once its prefix is in; else 0."""
        return self._need if len(self._buf) >= 4 else 0

    def peek_pending(self, n: int) -> bytes:
        """The first n bytes of the incomplete frame (fewer if fewer arrived)."""
        return bytes(self._buf[:n])

    def take_pending(self) -> bytes:
        """Hand over the incomplete frame's bytes so far; the caller forwards the rest itself."""
        data = self._buf
        self._buf = b""
        self._need = 0
        return data if isinstance(data, bytes) else bytes(data)

    def check_eof(self) -> None:
        """The peer closed: anything left over is a truncated frame."""
        if self._buf:
            raise FrameError(
                "truncated_frame", f"connection closed inside a frame ({len(self._buf)} bytes of it received)"
            )


def split_frames(block: bytes, offsets: list[int]) -> list[bytes]:
    """Payloads (without length prefix) of the frames in a block from `feed`."""
    ends = offsets[1:] + [len(block)]
    return [block[start + 4 : end] for start, end in zip(offsets, ends)]


def frame(payload: bytes) -> bytes:
    """Prefix a payload with its length."""
    return len(payload).to_bytes(4, "big") + payload
