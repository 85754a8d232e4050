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

# Frames up to this size are pooled; larger ones (rare: above librdkafka's
# default message.max.bytes) get a buffer of their own.
MAX_POOLED_BYTES = 4 * 1024 * 1024
# What the pool keeps at most, in all (the writer's queue holds the rest in flight).
_KEPT_BYTES = 32 * 1024 * 1024
_SMALLEST = 64 * 1024


class PooledBuffer(bytearray):
    """A frame buffer that knows its pool (the file thread gives it back without knowing who asked)."""

    __slots__ = ("pool",)


class FramePool:
    """Buffers by power-of-two size class. `take` on the event loop, `give` on the trace's file thread:
    a list's append and pop are atomic under the interpreter lock."""

    def __init__(self) -> None:
        self._free: dict[int, list[PooledBuffer]] = {}
        self.kept_bytes = 0

    def take(self, size: int) -> memoryview:
        """A writable view of exactly `size` bytes, of a buffer that is given back later or garbage."""
        if size > MAX_POOLED_BYTES:
            return memoryview(bytearray(size))
        capacity = max(_SMALLEST, 1 << (size - 1).bit_length())
        free = self._free.get(capacity)
        if free:
            buffer = free.pop()
            self.kept_bytes -= capacity
        else:
            buffer = PooledBuffer(capacity)
            buffer.pool = self
        return memoryview(buffer)[:size]

    def give(self, buffer: PooledBuffer) -> None:
        """The buffer's bytes are written: keep it for another frame, up to the pool's bound."""
        capacity = len(buffer)
        if self.kept_bytes + capacity <= _KEPT_BYTES:
            self._free.setdefault(capacity, []).append(buffer)
            self.kept_bytes += capacity
