"""Python work on the executors without the cycle collector running through it.

The grouped passes build a million short-lived tuples per hundred thousand
operations (one Event per row, a Segment per operation and key). Each 700
allocations start a collection of the youngest objects, and every tenth of
those a scan of the older ones, the worker's modules and kept state included:
at 100,000 operations the history pass's Python took 3.4 s of CPU with the
collector and 2.5 s without (docs/performance-analysis.md, "The cycle
collector"). Reference counting frees nearly all of it anyway; the few
cycles (a Segment's prev/next links) are collected once the pause ends.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cycle collector off for the block, back on after (if it was on)."""
    was_on = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_on:
            gc.enable()
