"""Each process's membership changes, for the per-key checks to ask about.

A change (an ok/info assign or subscribe, or a crash from its invocation on)
resets what a process is expected to read next. The changes are few (a few
percent of the operations), so they are collected once and handed to every
key's check as a broadcast, instead of shuffling every operation by process
to number them in a window.
"""

from __future__ import annotations

from bisect import bisect_left
from collections import defaultdict
from collections.abc import Iterable

from pyspark.sql import Column, DataFrame
from pyspark.sql import functions as F

from kproxy_spark.history import MEMBERSHIP_FS


def is_reassignment() -> Column:
    """An assign or subscribe that took (or may have taken) effect: ok or info, as in Jepsen."""
    return F.col("f").isin(*MEMBERSHIP_FS) & F.col("type").isin("ok", "info")


def is_change() -> Column:
    return is_reassignment() | (F.col("f") == "crash")


def change_rows(ops: DataFrame) -> DataFrame:
    """process, index, f of every membership change."""
    return ops.where(is_change()).select("process", "index", "f")


class Membership:
    """Per process, its changes in index order."""

    def __init__(self, changes: Iterable[tuple[int, int, str]] = ()) -> None:
        by_process: dict[int, list[tuple[int, str]]] = defaultdict(list)
        for process, index, f in changes:
            by_process[process].append((index, f))
        self._indexes: dict[int, list[int]] = {}
        self._fs: dict[int, list[str]] = {}
        for process, rows in by_process.items():
            rows.sort()
            self._indexes[process] = [i for i, _ in rows]
            self._fs[process] = [f for _, f in rows]

    def before(self, process: int, index: int) -> int:
        """How many changes the process made before the operation at ``index``."""
        return bisect_left(self._indexes.get(process, ()), index)

    def latest_before(self, process: int, index: int) -> str | None:
        """The f of the process's latest change before ``index`` (None before any)."""
        return self.at(process, index)[1]

    def at(self, process: int, index: int) -> tuple[int, str | None]:
        """(before, latest_before) in one look-up: the per-key checks ask both for every operation."""
        indexes = self._indexes.get(process)
        if not indexes:
            return 0, None
        n = bisect_left(indexes, index)
        return n, (self._fs[process][n - 1] if n else None)


def collect_membership(ops: DataFrame) -> Membership:
    table = change_rows(ops).toArrow()
    return Membership(zip(*(table.column(c).to_pylist() for c in ("process", "index", "f"))))
