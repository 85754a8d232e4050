"""The trace's file system calls, run in order on a thread of their own.

The trace writer decides everything on the proxy's event loop (which file,
which offset, what bytes) and hands each system call here as an operation:
open a file, write a segment, writev side bytes, write them back and drop
them from the page cache, close. One thread runs them in the order they were
submitted, so side bytes always reach the kernel before the segment that
references them, and a killed proxy leaves every file readable up to its
last complete write. The thread holds the interpreter lock only between
calls; the calls themselves (write, writev, fdatasync) release it, so a slow
disk never stalls the event loop.

Until `start()` (and after the thread has exited) operations run at once on
the caller's thread: a writer that was never started drains that way.
"""

from __future__ import annotations

import logging
import threading

from collections import deque
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)


class FileOps:
    """An ordered queue of file operations and the thread that runs them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._ops: deque[tuple[Callable[..., Any], tuple[Any, ...], int]] = deque()
        self._cond = threading.Condition()
        self._thread: threading.Thread | None = None
        self._closed = False
        self.failure: BaseException | None = None
        # Bytes submitted and not yet written: the writer's bound on what waits here.
        self.backlog_bytes = 0
        self.backlog_ops = 0
        self._running = False  # the thread is running operations it took
        # Set by the writer while the loop is idle: an operation of at most
        # this many bytes runs at once on the caller's thread when the thread
        # has nothing queued or running (order is kept). A page-cache write of
        # tens of KiB takes tens of microseconds; handing it to the thread
        # cost the loop the interpreter lock back and forth around each call.
        self.on_loop_max_bytes = 0

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, fn: Callable[..., Any], *args: Any, nbytes: int = 0, on_loop: bool = True) -> None:
        """Run fn(*args) after every operation submitted before it. After a failure, nothing more runs.

        `on_loop=False`: never on the caller's thread (it may wait for the disk).
        """
        if self.failure is not None:
            return
        if self._thread is None:
            self._call(fn, args)
            return
        with self._cond:
            if on_loop and nbytes <= self.on_loop_max_bytes and not self._ops and not self._running and not self._closed:
                inline = True
            else:
                inline = False
            if not inline and not self._closed:
                self._ops.append((fn, args, nbytes))
                self.backlog_bytes += nbytes
                self.backlog_ops += 1
                self._cond.notify()
                return
        if not inline:
            # Closed: the thread runs out what it has, then this runs here, still in order.
            self._thread.join()
        self._call(fn, args)

    def close(self) -> None:
        """Let the thread finish what was submitted and exit."""
        with self._cond:
            self._closed = True
            self._cond.notify()

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the thread to exit; False if it is still running after `timeout`."""
        if self._thread is None:
            return True
        self._thread.join(timeout)
        return not self._thread.is_alive()

    @property
    def pending(self) -> int:
        return len(self._ops)

    @property
    def busy(self) -> bool:
        """Operations are queued or running (one may yet fail)."""
        return bool(self._ops) or self._running

    def _call(self, fn: Callable[..., Any], args: tuple[Any, ...]) -> None:
        if self.failure is not None:
            return
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 - reported to the writer, which raises it on the loop
            log.exception("trace file operation failed")
            self.failure = exc

    def _run(self) -> None:
        ops = self._ops
        cond = self._cond
        while True:
            with cond:
                while not ops and not self._closed:
                    cond.wait()
                if not ops:
                    return
                # All that is queued in one go: one lock round per batch, not per call.
                todo = list(ops)
                ops.clear()
                self._running = True
            for fn, args, _ in todo:
                self._call(fn, args)
            with cond:
                self.backlog_bytes -= sum(n for _, _, n in todo)
                self.backlog_ops -= len(todo)
                self._running = False
