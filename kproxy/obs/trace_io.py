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

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
        self._thread.start()

    @property
    def threaded(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, fn: Callable[..., Any], *args: Any, nbytes: int = 0) -> None:
        """Run fn(*args) after every operation submitted before it. After a failure, nothing more runs."""
        if self.failure is not None:
            return
        if self._thread is None:
            self._call(fn, args)
            return
        with self._cond:
            if not self._closed:
                self._ops.append((fn, args, nbytes))
                self.backlog_bytes += nbytes
                self.backlog_ops += 1
                self._cond.notify()
                return
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
                fn, args, nbytes = ops.popleft()
            self._call(fn, args)
            with cond:
                self.backlog_bytes -= nbytes
                self.backlog_ops -= 1
