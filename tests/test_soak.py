"""The soak: load and rotating faults through a real `kproxy run`, every request accounted for.

The short run (default suite) goes through every fault action in a few
seconds with a handful of clients; the full run (marked slow) is the one in
docs/reliability.md: 30 minutes in front of Apache Kafka, about 100 client
connections, a new action every 30 s, and the proxy's RSS flat over the last
15 minutes.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kproxy.faults import load_rule_text
from kproxy.soak import PHASES, Sample, rss_slope_mib_per_min, rule_file_text, run_soak


def test_every_phase_is_a_valid_rule_file_and_every_action_takes_a_turn() -> None:
    names = []
    for phase in range(len(PHASES)):
        text, name = rule_file_text(phase)
        load_rule_text(text, f"phase-{phase}.yaml")
        names.append(name)
    actions = {"delay", "duplicate", "drop", "drop_response", "respond", "replace_error", "disconnect", "hold", "rewrite"}
    assert actions <= set(names)


@pytest.mark.timeout(120)
def test_a_short_soak_leaves_no_request_without_outcome(tmp_path: Path, broker) -> None:
    result = run_soak(tmp_path, bootstrap=broker.bootstrap, duration_s=12, connections=6, rotate_s=0.8, sample_s=1)
    summary = result.summary()
    assert result.proxy_exit == 0 and result.proxy_errors == [], summary
    assert result.without_outcome == [], (result.without_outcome[:5], summary)
    assert set(result.actions) >= {name for name, _ in PHASES}, summary
    assert result.accounting["requests"] > 50 and result.delivered > 0, summary
    assert len(result.samples) >= 3 and all(s.rss_kib > 0 and s.fds > 0 for s in result.samples), summary
    # The proxy's own account of its memory and of the requests it holds (admin API /debug/memory).
    assert all(s.glibc_used_kib > 0 and s.exchanges >= 0 and s.in_flight_max >= 0 for s in result.samples), result.samples


def test_the_rss_slope_is_fitted_over_the_samples_asked_for() -> None:
    flat_then_rising = [Sample(t, 100 * 1024, 10, 4) for t in range(0, 600, 10)]
    flat_then_rising += [Sample(600 + t, 100 * 1024 + t * 1024 // 60, 10, 4) for t in range(0, 600, 10)]
    assert 0.3 < rss_slope_mib_per_min(flat_then_rising, 0) < 0.7  # the flat half pulls the fit down
    assert abs(rss_slope_mib_per_min(flat_then_rising, 600) - 1.0) < 0.02  # 1 MiB a minute
    assert abs(rss_slope_mib_per_min(flat_then_rising[:60], 0)) < 1e-9
    assert rss_slope_mib_per_min(flat_then_rising, 10_000) is None


@pytest.mark.slow
@pytest.mark.timeout(2700)
def test_the_thirty_minute_soak_keeps_memory_flat(tmp_path: Path) -> None:
    # Against Apache Kafka, which keeps pace as its log grows: the proxy's memory follows the
    # requests it holds, and Tansu's backlog grows through a run (docs/reliability.md).
    result = run_soak(tmp_path, broker_kind="kafka", duration_s=1800, connections=100, rotate_s=30, sample_s=10)
    summary = result.summary()
    assert result.proxy_exit == 0 and result.proxy_errors == [], summary
    assert result.without_outcome == [], result.without_outcome[:5]
    assert result.rotations == 60, summary
    # After warm-up the proxy's memory is flat: at most 0.1 MiB a minute over the last 15 minutes.
    assert summary["rss_mib_per_min_second_half"] is not None and summary["rss_mib_per_min_second_half"] <= 0.1, summary


def test_the_proxy_memory_figures_name_both_allocators() -> None:
    from kproxy.obs.memory import memory_figures

    figures = memory_figures()
    pymalloc = figures["pymalloc"]
    # pymalloc's own count (sys._debugmallocstats), read without its stderr.
    assert pymalloc["arenas_allocated_current"] >= 1 and pymalloc["bytes_in_allocated_blocks"] > 0, figures
    assert figures["glibc"]["in_use_bytes"] > 0 and figures["glibc_heaps"][0]["nr"] == 0, figures
    assert figures["gc"]["collections"][0] >= 0


def test_rss_is_told_apart_by_mapping() -> None:
    import os
    import threading

    from kproxy.soak import rss_by_mapping

    # A thread that allocates gets a glibc arena of its own: 64 MiB reserved at a 64 MiB boundary.
    threading.Thread(target=lambda: [bytes(2000) for _ in range(100)]).start()
    kinds = rss_by_mapping(os.getpid())
    assert kinds["heap"] > 0 and kinds["anon"] > 0 and kinds["file"] > 0, kinds
    assert kinds["thread_heaps"] >= 0
