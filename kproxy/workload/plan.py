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
    """The run's bound: an op count, a deadline, or both; shared by the workers."""

    def __init__(self, ops: int | None, deadline: float | None, clock) -> None:  # type: ignore[no-untyped-def]
        self._remaining = ops
        self._deadline = deadline
        self._clock = clock
        self._lock = threading.Lock()
        self._stopped = False

    def take(self) -> bool:
        """True when one more operation may start."""
        with self._lock:
            if self._stopped:
                return False
            if self._deadline is not None and self._clock() >= self._deadline:
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
