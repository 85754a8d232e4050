"""The soak: load and rotating faults through a real `kproxy run`, every request accounted for.

The short run (default suite) goes through every fault action in a few
seconds with a handful of clients; the full run (marked slow) is the one in
docs/reliability.md: 10 minutes, about 100 client connections, a new action
every 30 s.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from kproxy.faults import load_rule_text
from kproxy.soak import PHASES, rule_file_text, run_soak


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


@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_the_ten_minute_soak(tmp_path: Path) -> None:
    result = run_soak(tmp_path, duration_s=600, connections=100, rotate_s=30, sample_s=10)
    assert result.proxy_exit == 0 and result.proxy_errors == []
    assert result.without_outcome == [], result.without_outcome[:5]
    assert result.rotations == 20
