"""Hot reload of the rule file: on change, on SIGHUP and through the API; a bad file is refused."""

from __future__ import annotations

import os
import shutil
import signal
import time
from pathlib import Path

import httpx

from tests.fixtures.proxy import metric_value

RULES = Path(__file__).resolve().parent.parent / "rules"


def rule_ids(proxy) -> list[str]:  # noqa: ANN001
    return [r["id"] for r in httpx.get(f"{proxy.admin_url}/rules", timeout=5).json()["rules"]]


def wait_for(condition, timeout: float = 10.0) -> bool:  # noqa: ANN001
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.1)
    return False


def test_reload_on_change_refuses_a_bad_file_and_reloads_on_sighup(proxy_factory, tmp_path: Path) -> None:
    rules = tmp_path / "rules.yaml"
    shutil.copy(RULES / "torn-transaction.yaml", rules)
    proxy = proxy_factory("--rules", str(rules))
    assert rule_ids(proxy) == ["stale-commit-into-next-txn"]

    # A valid change is picked up without a restart.
    rules.write_text(
        "version: 1\nrules:\n  - id: slow-produce\n    match: {api: produce}\n    action: {type: delay, ms: 5}\n"
    )
    assert wait_for(lambda: rule_ids(proxy) == ["slow-produce"])
    assert metric_value(proxy, "kproxy_rule_reloads_total", result="accepted") >= 1

    # A broken file is refused with file and line; the running rules stay.
    rules.write_text("version: 1\nrules:\n  - id: broken\n    match: {api: produce}\n    action: {type: delay, msec: 5}\n")
    assert wait_for(lambda: metric_value(proxy, "kproxy_rule_reloads_total", result="refused") >= 1)
    assert rule_ids(proxy) == ["slow-produce"]
    assert wait_for(lambda: f"{rules}:5" in proxy.log_text()), proxy.log_text()[-2000:]

    # The API reload reports the same refusal.
    answer = httpx.post(f"{proxy.admin_url}/rules/reload", timeout=5)
    assert answer.status_code == 400 and f"{rules}:5" in answer.json()["error"]

    # SIGHUP reloads a repaired file (its mtime kept, so only the signal can tell).
    seen_mtime = rules.stat().st_mtime
    rules.write_text("version: 1\nrules:\n  - id: drop-acks\n    match: {api: produce}\n    action: {type: drop_response}\n")
    os.utime(rules, (seen_mtime, seen_mtime))
    time.sleep(1.5)  # longer than the file poll: nothing reloads by itself
    assert rule_ids(proxy) == ["slow-produce"]
    proxy.process.send_signal(signal.SIGHUP)
    assert wait_for(lambda: rule_ids(proxy) == ["drop-acks"])
    assert proxy.alive()
