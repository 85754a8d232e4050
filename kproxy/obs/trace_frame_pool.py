"""Buffers for the Produce requests a `records` proxy streams and keeps for the trace, used again once written.

A traced Produce is read into a buffer of its own that waits for the trace
writer, which copies its batches to the side file. A new `bytearray` per
request cost the data path a zero-fill of every produced byte and, as the
heap grew and shrank under frames of up to MiBs, a page fault per 4 KiB:
about a tenth of a `records` proxy's CPU on batched produce. A buffer taken
from here goes back once the side file holds its bytes (the file thread
gives it back after the write that holds its last batch), so its pages stay
warm. It is never zeroed: the stream fills every byte of the frame before
anything reads it, and a frame cut short is dropped with its buffer.
"""

from __future__ import annotations

import threading

# Frames up to this size are pooled; larger ones (rare: above librdkafka's
# default message.max.bytes) get a buffer of their own.
MAX_POOLED_BYTES = 4 * 1024 * 1024
# What the pool keeps at most, in all (the writer's queue holds the rest in flight).
_KEPT_BYTES = 32 * 1024 * 1024
_SMALLEST = 64 * 1024


class PooledBuffer(bytearray):
    """A frame buffer that knows its pool (the file thread gives it back without knowing who asked), and
    how many of its users have yet to give it back."""

    __slots__ = ("holders", "pool")


class FramePool:
    """Buffers by power-of-two size class. `take` on the event loop; `give` there or on the trace's file
    thread, so the count of holders is kept under a lock."""

    def __init__(self) -> None:
        self._free: dict[int, list[PooledBuffer]] = {}
        self._lock = threading.Lock()
        self.kept_bytes = 0

    def take(self, size: int, holders: int = 1) -> memoryview:
        """A writable view of exactly `size` bytes, of a buffer that is used again once each of its
        `holders` has given it back (or garbage). A streamed Produce has two: the stream, which is still
        sending the frame's last bytes when the writer gets the frame, and the writer, once the side file
        holds its batches. Either may be last."""
        if size > MAX_POOLED_BYTES:
            return memoryview(bytearray(size))
        capacity = max(_SMALLEST, 1 << (size - 1).bit_length())
        with self._lock:
            free = self._free.get(capacity)
            buffer = free.pop() if free else None
            if buffer is not None:
                self.kept_bytes -= capacity
        if buffer is None:
            buffer = PooledBuffer(capacity)
            buffer.pool = self
        buffer.holders = holders
        return memoryview(buffer)[:size]

    def give(self, buffer: PooledBuffer) -> None:
        """One holder is done with the buffer; after the last, keep it for another frame, up to the pool's bound."""
        capacity = len(buffer)
        with self._lock:
            buffer.holders -= 1
            if buffer.holders == 0 and self.kept_bytes + capacity <= _KEPT_BYTES:
                self._free.setdefault(capacity, []).append(buffer)
                self.kept_bytes += capacity
