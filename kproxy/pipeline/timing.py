"""Per-stage latency: how long each request spends in each stage (opt-in).

The pipeline never reads a clock of its own: the shell hands it one when
per-stage latency is on, and None otherwise (then no stage is timed, and the
data path pays one `is None` test per stage).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from kproxy.obs import metrics
from kproxy.protocol import apis


class StageTimer:
    def __init__(self, clock: Callable[[], float]) -> None:
        self.now = clock
        self._series: dict[tuple[int, str], Any] = {}
        # The everyday APIs' series exist from start-up, as the other per-API
        # series do (kproxy.obs.metrics): a burst that begins and ends between
        # two scrapes still shows as an increase from zero.
        for name in metrics.EVERYDAY_APIS:
            api_key = apis.API_KEYS.get(name)
            if api_key is not None:
                for stage in metrics.STAGES:
                    self._series[(api_key, stage)] = metrics.stage_latency.labels(name, stage)

    def observe(self, api_key: int, stage: str, seconds: float) -> None:
        series = self._series.get((api_key, stage))
        if series is None:
            series = self._series[(api_key, stage)] = metrics.stage_latency.labels(apis.api_name(api_key), stage)
        series.observe(seconds)
