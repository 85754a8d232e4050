"""Whether trio's loop has nothing to run right now, asked without a pass of its scheduler.

The trace writer works in the loop's idle time, in steps of tens of
microseconds, and between two steps it must know that no request arrived
meanwhile. trio's own answer, `wait_all_tasks_blocked(0)`, is a full pass of
its scheduler and two task switches: about 16 µs on this project's machines,
paid between every two steps, which made most of tracing's CPU at level
`headers` (docs/performance.md, "Tracing's CPU: the writer's turns, its batches and
the bench's reading").

`LoopIdleProbe.idle()` answers the same question in a few microseconds: trio's run
queue is empty, no deadline has passed, and its epoll set holds nothing ready
(the epoll descriptor is polled, which reads its ready list without taking
an event from it; trio's registrations are one-shot, so a taken event would
be lost, and polling takes none). A thread handing the loop work
(`run_sync_soon`) wakes it through a socket in that same set.

These are trio's internals. Where they are not where this trio keeps them
(another version, another I/O backend), `available` is False and the caller
asks trio instead; tests/test_loop_idle.py checks that the installed trio has them.
"""

from __future__ import annotations

import select
from typing import Any

import trio


class LoopIdleProbe:
    """Made inside `trio.run`; `idle()` is True when a scheduler pass would find nothing to run."""

    def __init__(self) -> None:
        self._runner: Any = None
        self._poll: Any = None
        try:
            from trio._core._run import GLOBAL_RUN_CONTEXT

            runner = GLOBAL_RUN_CONTEXT.runner
            epoll = runner.io_manager._epoll  # noqa: SLF001
            runner.runq.__len__, runner.deadlines.next_deadline  # noqa: B018 - present, or AttributeError
            poll = select.poll()
            poll.register(epoll.fileno(), select.POLLIN)
        except (ImportError, AttributeError, RuntimeError, OSError):
            return
        self._runner = runner
        self._poll = poll

    @property
    def available(self) -> bool:
        return self._poll is not None

    def idle(self) -> bool:
        """Nothing runnable, no deadline due, no I/O ready (False when the probe is not available)."""
        runner = self._runner
        if runner is None or runner.runq:
            return False
        if runner.deadlines.next_deadline() <= trio.current_time():
            return False
        return not self._poll.poll(0)
