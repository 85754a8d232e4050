"""Warming a Spark session: the first analysis in a fresh JVM takes two to
three times as long as the next (its code is still being loaded and
compiled), so one small analysis of a synthetic history runs first.

`warm_up` is what the engine does before it takes requests; `WarmingSession`
does the same in a thread of its own while the caller runs something else,
as `kproxy demo` does during its workload, which leaves a core idle.
"""

from __future__ import annotations

import tempfile
import threading
import time
from pathlib import Path
from typing import Any

#: Operations of the small history that warms the session: enough to run every check and wire check once
#: (what warms is the code each runs, not the rows).
WARM_UP_OPS = 60


def warm_up(spark: Any) -> None:
    """Run one small analysis of a synthetic history and its traces in `spark`."""
    from kproxy_spark.jobs import analyze

    from kproxy.workload.synthetic import generate

    with tempfile.TemporaryDirectory(prefix="kproxy-spark-warm-up-") as tmp:
        work = Path(tmp)
        generate(WARM_UP_OPS, work / "history.jsonl", traces=work / "traces", seed=1)
        analyze(str(work / "history.jsonl"), str(work / "traces"), str(work / "report"), spark=spark)


class WarmingSession:
    """A local Spark session, started and warmed in the background from `start()` on.

    `session()` waits for it and returns it; a start that failed raises its
    error there, where the caller would have started Spark itself. The quick
    JIT tier, as for any small input (kproxy_spark.jobs.QUICK_START_BYTES).
    """

    def __init__(self, master: str = "local[*]") -> None:
        self.master = master
        self.seconds = 0.0  # how long starting and warming took
        self._spark: Any = None
        self._error: BaseException | None = None
        self._launched = threading.Event()  # the JVM is up (it has said what it says when it starts)
        self._thread = threading.Thread(target=self._run, name="kproxy-spark-warm-up", daemon=True)

    def start(self) -> WarmingSession:
        self._thread.start()
        return self

    def _run(self) -> None:
        from kproxy_spark.session import get_session

        begun = time.monotonic()
        try:
            self._spark = get_session(self.master, quick_start=True)
            self._launched.set()
            warm_up(self._spark)
        except BaseException as exc:  # noqa: BLE001 - raised again in the caller's thread, by session()
            self._error = exc
        finally:
            self._launched.set()
        self.seconds = time.monotonic() - begun

    def wait_launched(self, timeout: float | None = None) -> None:
        """Wait until the JVM has started: the lines Java and Spark print on their start then come before
        the caller's own output (a progress bar), not in the middle of it."""
        self._launched.wait(timeout)

    def session(self) -> Any:
        self._thread.join()
        if self._error is not None:
            raise self._error
        return self._spark
