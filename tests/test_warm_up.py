"""WarmingSession: Spark started and warmed in the background (kproxy demo's analysis meets a warm JVM).
Its working path runs in every `kproxy demo` the suite starts (tests/test_install.py, the image check)."""

from __future__ import annotations

import pytest

from kproxy.engine.warm_up import WarmingSession


@pytest.mark.spark
@pytest.mark.timeout(120)
def test_a_session_that_cannot_start_raises_where_the_caller_asks_for_it() -> None:
    warming = WarmingSession(master="no-such-master://here").start()
    warming.wait_launched(timeout=90)  # a failed start does not leave the caller waiting
    with pytest.raises(Exception, match="JAVA_GATEWAY_EXITED|no-such-master"):  # as Spark says it
        warming.session()
