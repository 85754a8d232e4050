"""Choosing each worker's next operation; the RNG is passed in, so a seed fixes the choices."""

from __future__ import annotations

import random
import threading
from dataclasses import dataclass

from kproxy.workload.config import WorkloadConfig


@dataclass(frozen=True)
class OpPlan:
    """What a worker does next.

    kind: "crash", "assign" (assign or subscribe, per the config), "send",
    "poll" or "txn". micro_ops lists "send"/"poll" for send, poll and txn
    operations (keys and values are drawn when the op runs, from the shared
    key space). abort: a txn that is to be aborted on purpose.
    """

    kind: str
    micro_ops: tuple[str, ...] = ()
    abort: bool = False


def plan_op(rng: random.Random, config: WorkloadConfig) -> OpPlan:
    r = rng.random()
    if r < config.crash_probability:
        return OpPlan("crash")
    if r < config.crash_probability + config.reassign_probability:
        return OpPlan("assign")
    length = rng.randint(1, config.max_txn_length)
    if config.txn:
        micro_ops = tuple("send" if rng.random() < 0.5 else "poll" for _ in range(length))
        return OpPlan("txn", micro_ops, abort=rng.random() < config.abort_probability)
    if rng.random() < 0.5:
        return OpPlan("send", ("send",) * length)
    return OpPlan("poll", ("poll",))


class OpBudget:
    """The run's bound: an op count, a duration, or both; shared by the workers.

    The duration counts from the moment the first worker has its clients
    open, not from the start: on a loaded machine or a slow broker, opening
    a transactional producer can take seconds, and a short run would
    otherwise end before its first operation. Opening is itself bounded:
    with no worker open after `duration + open_grace` seconds, the run
    ends (the warnings logged say why the clients would not open).
    """

    def __init__(self, ops: int | None, duration: float | None, clock, open_grace: float = 0.0) -> None:  # type: ignore[no-untyped-def]
        self._remaining = ops
        self._duration = duration
        self._clock = clock
        self._give_up_opening_at = None if duration is None else clock() + duration + open_grace
        self._deadline: float | None = None
        self._lock = threading.Lock()
        self._stopped = False

    def opened(self) -> None:
        """A worker has its clients open: the first call starts the duration."""
        with self._lock:
            if self._deadline is None and self._duration is not None:
                self._deadline = self._clock() + self._duration

    def take(self) -> bool:
        """True when one more operation may start (or a worker may go on opening its clients)."""
        with self._lock:
            if self._stopped:
                return False
            now = self._clock()
            over = now >= self._deadline if self._deadline is not None else (
                self._give_up_opening_at is not None and now >= self._give_up_opening_at)
            if over:
                self._stopped = True
                return False
            if self._remaining is not None:
                if self._remaining <= 0:
                    self._stopped = True
                    return False
                self._remaining -= 1
            return True

    def stop(self) -> None:
        with self._lock:
            self._stopped = True

    @property
    def stopped(self) -> bool:
        with self._lock:
            return self._stopped
