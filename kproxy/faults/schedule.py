"""Where a schedule is at a given time (Jepsen-nemesis style phases).

Time zero is the engine's epoch; after the last phase the schedule starts
over if `repeat`, else the system stays healthy (no phase).
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.faults.model import Schedule


@dataclass(frozen=True)
class PhaseAt:
    name: str
    started_at: float  # on the caller's clock
    rule_ids: frozenset[str]


def phase_at(schedule: Schedule, epoch: float, now: float) -> PhaseAt | None:
    elapsed = now - epoch
    if elapsed < 0:
        return None
    cycle = schedule.cycle_s
    if elapsed >= cycle:
        if not schedule.repeat:
            return None
        cycles = int(elapsed // cycle)
        elapsed -= cycles * cycle
        epoch += cycles * cycle
    start = 0.0
    for phase in schedule.phases:
        if elapsed < start + phase.duration_s:
            return PhaseAt(phase.name, epoch + start, frozenset(phase.rules))
        start += phase.duration_s
    return None  # float rounding at the very end of a cycle
