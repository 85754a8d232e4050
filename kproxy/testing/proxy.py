"""A tracing proxy for one test: its address, its admin API, its trace, the verdict on it.

The pytest fixture `kproxy` is one of these per test; outside pytest:

    with TracingProxy("127.0.0.1:9092", Path("run")) as proxy:
        ...  # clients connect to proxy.bootstrap
        proxy.verdict().assert_valid()
"""

from __future__ import annotations

import logging
import uuid
from pathlib import Path
from typing import Any, Self

from kproxy.testing.admin import AdminClient
from kproxy.testing.final_read import final_read, user_topics
from kproxy.testing.harness import start_tracing_proxy
from kproxy.testing.verdict import SMALL_TRACE_CONF, Verdict, judge

log = logging.getLogger("kproxy.testing")


class TracingProxy:
    """`kproxy run` in front of `upstream`, tracing records into `directory`/traces.

    `verdict()` stops it (which flushes its trace) and judges the trace; it
    is meant for the end of a test, once the test's clients are closed.
    """

    def __init__(self, upstream: str, directory: Path, *, rules: Path | None = None, guard: bool = False,
                 seed: int | None = None, master: str = "local[*]") -> None:
        self.upstream = upstream
        self.directory = Path(directory)
        self.traces = self.directory / "traces"
        self.report_dir = self.directory / "report"
        self.master = master
        self.directory.mkdir(parents=True, exist_ok=True)
        # The topics the test makes are read back before the verdict (kproxy.testing.final_read).
        self._topics_before = user_topics(upstream)
        self._process = start_tracing_proxy(upstream, self.traces, rules=rules, guard=guard, seed=seed,
                                            log_path=self.directory / "kproxy.log")
        self.bootstrap = self._process.bootstrap
        self.admin_address = f"{self._process.host}:{self._process.admin_port}"
        self.admin = AdminClient(self.admin_address)
        self._verdict: Verdict | None = None

    def __repr__(self) -> str:
        return f"TracingProxy({self.bootstrap} -> {self.upstream}, traces {self.traces})"

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    @property
    def log_path(self) -> Path:
        return self.directory / "kproxy.log"

    def alive(self) -> bool:
        return self._process.alive()

    def stop(self) -> None:
        """Stop the proxy (SIGTERM: every trace event it accepted is written). Idempotent."""
        self.admin.close()
        if self._process.alive():
            status = self._process.stop()
            if status not in (0, None):
                log.warning("kproxy exited with status %s (see %s)", status, self.log_path)

    def fresh_name(self, base: str = "topic") -> str:
        """`base` with a random suffix: a topic (or group, transactional id) of this test alone.

        The broker outlives the test, and the verdict judges only this
        test's trace: records an earlier test left in a shared topic would
        read as values nobody wrote."""
        return f"{base}-{uuid.uuid4().hex[:10]}"

    def verdict(self, *, isolation: str = "auto", spark: Any = None) -> Verdict:
        """Read back the topics the test made (the final read), stop the proxy and judge what crossed it:
        the analysis of the trace with no client history.

        Runs once; later calls return the same verdict. `spark`: a SparkSession
        to use (default: the process's, started on first use and kept)."""
        if self._verdict is None:
            if self._process.alive():
                made = user_topics(self.upstream) - self._topics_before
                if made:
                    done = final_read(self.bootstrap, made)
                    log.info("final read: %d record(s) of %d partition(s)%s", done.records, done.partitions,
                             "" if done.caught_up else f"; not read to the end: {', '.join(done.lagging)}")
            self.stop()
            report = judge(self.traces, self.report_dir, master=self.master, isolation=isolation, spark=spark,
                           spark_conf=SMALL_TRACE_CONF, progress=lambda message: log.info("analysis: %s", message))
            self._verdict = Verdict(report, self.report_dir)
            log.info("verdict %r; report in %s", self._verdict, self.report_dir)
        return self._verdict
