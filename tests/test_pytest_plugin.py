"""The pytest plugin (kproxy.testing.pytest_plugin): its fixtures, its admin client, its verdict, its cost.

The fixtures run against a real proxy in front of the session's embedded
broker, started by the plugin itself. Runs of pytest in a child process
check the command-line and ini options and that the plugin can be turned
off. The verdict's own run (Spark) is the worked example's,
tests/test_pytest_plugin_example.py.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from kproxy.testing.admin import AdminError
from kproxy.testing.verdict import Verdict

ROOT = Path(__file__).resolve().parent.parent
DELAY = {"id": "slow-produce", "match": {"api": "Produce"}, "action": {"type": "delay", "ms": 50}}

pytestmark = pytest.mark.timeout(120)


def test_the_plugin_is_installed_under_its_entry_point(request):
    from kproxy.brokers import KINDS
    from kproxy.testing import pytest_plugin

    plugin = request.config.pluginmanager.get_plugin("kproxy")
    assert plugin is pytest_plugin, "the pytest11 entry point is missing: reinstall kproxy (make install)"
    assert pytest_plugin.BROKER_KINDS == tuple(KINDS)


def test_loading_the_plugin_imports_nothing_heavy():
    code = ("import sys; import kproxy.testing.pytest_plugin; "
            "print(sorted(m for m in ('trio', 'pyspark', 'httpx', 'confluent_kafka', 'kio', 'starlette', "
            "'kproxy.brokers', 'kproxy.proxy_process', 'kproxy_spark') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=60)
    assert done.stdout.strip() == "[]"


def test_admin_client_adds_lists_and_removes_rules(kproxy):
    admin = kproxy.admin
    assert admin.rules() == []
    added = admin.add_rule(DELAY)
    assert added["id"] == "slow-produce" and added["action"]["ms"] == 50
    assert [r["id"] for r in admin.rules()] == ["slow-produce"]
    assert admin.get_rule("slow-produce")["counters"] == {"matched": 0, "applied": 0}
    assert admin.disable_rule("slow-produce")["enabled"] is False
    assert admin.enable_rule("slow-produce")["enabled"] is True
    admin.remove_rule("slow-produce")
    assert admin.rules() == []
    generated = admin.add_rule({"match": {"api": "Fetch"}, "action": {"type": "delay", "ms": 1}})
    assert generated["id"].startswith("test-rule-")
    admin.remove_rule(generated["id"])


def test_a_rule_holds_for_its_with_block_only_and_applies_to_traffic(kproxy):
    topic = kproxy.fresh_name("plugin")
    with kproxy.admin.rule({**DELAY, "match": {"api": "Metadata"}}) as rule:
        assert [r["id"] for r in kproxy.admin.rules()] == [rule["id"]]
        AdminClient({"bootstrap.servers": kproxy.bootstrap}).list_topics(topic, timeout=10)
        assert kproxy.admin.get_rule(rule["id"])["counters"]["applied"] >= 1
    assert kproxy.admin.rules() == []
    with pytest.raises(RuntimeError, match="boom"), kproxy.admin.rule(DELAY):
        raise RuntimeError("boom")
    assert kproxy.admin.rules() == []


def test_the_proxy_refuses_a_bad_rule_with_its_reason(kproxy):
    with pytest.raises(AdminError, match="ms") as refused:
        kproxy.admin.add_rule({"id": "bad", "action": {"type": "delay", "ms": -5}})
    assert refused.value.status == 400
    with pytest.raises(AdminError) as missing:
        kproxy.admin.remove_rule("no-such-rule")
    assert missing.value.status == 404


def test_the_fixture_proxies_to_the_session_broker_and_traces(kproxy, kproxy_upstream):
    assert kproxy_upstream.kind == "tansu" and kproxy_upstream.alive()
    assert kproxy.upstream == kproxy_upstream.bootstrap != kproxy.bootstrap
    metadata = AdminClient({"bootstrap.servers": kproxy.bootstrap}).list_topics(timeout=10)
    # Clients only ever learn the proxy's addresses.
    assert all(b.host == "127.0.0.1" and str(b.port) != kproxy_upstream.bootstrap.rsplit(":", 1)[1]
               for b in metadata.brokers.values())
    health = kproxy.admin.health()
    assert health["tracing"] is True and health["guard"] is False
    kproxy.stop()
    assert not kproxy.alive()
    assert any(p.suffix == ".events" for p in kproxy.traces.iterdir())


@pytest.mark.kproxy(rules="rules/torn-transaction.yaml", guard=True, seed=7)
def test_the_marker_sets_rules_guard_and_seed(kproxy):
    assert kproxy.admin.txns()["guard"] is True
    assert [r["id"] for r in kproxy.admin.rules()] == ["stale-commit-into-next-txn"]
    assert "--seed 7" in " ".join(_proxy_command(kproxy))


def _proxy_command(kproxy) -> list[str]:
    return kproxy._process.process.args


def test_verdict_reads_a_report_as_a_test_asks():
    report = {
        "valid": False, "errors": ["G1a"], "anomaly_types": ["G1a", "stale-end-txn"],
        "counts": {"G1a": 3, "stale-end-txn": 1, "lost-write": 0}, "anomalies": {"G1a": [{"explanation": "read x"}],
                                                                             "stale-end-txn": [{}]},
        "stats": {"fault_impact": [
            {"rule": "stale", "anomaly": "G1a", "cases": 3},
            {"rule": "stale", "anomaly": "rule-effect", "cases": 1, "effects": ["caused-anomalies"]},
            {"rule": "slow", "anomaly": "rule-effect", "cases": 1, "effects": ["no-visible-effect"]},
        ], "causes": {"G1a": {"rule:stale": 3}}},
    }
    verdict = Verdict(report)
    assert not verdict.valid and not verdict.unknown
    assert verdict.errors == {"G1a": 3}
    assert verdict.anomalies == {"G1a": 3, "stale-end-txn": 1}
    assert verdict.by_rule == {"stale": {"G1a": 3}, "slow": {}}
    assert verdict.rule_effects == {"stale": ["caused-anomalies"], "slow": ["no-visible-effect"]}
    assert verdict.causes == {"G1a": {"rule:stale": 3}}
    with pytest.raises(AssertionError) as failed:
        verdict.assert_valid()
    message = str(failed.value)
    assert message.startswith("the wire verdict found G1a x3") and "INVALID" in message and "read x" in message
    assert Verdict({**report, "valid": "unknown", "errors": []}).unknown
    Verdict({**report, "valid": True, "errors": []}).assert_valid()


# --- pytest in a child process: options, ini settings, -p no:kproxy -----------------------------------------

USER_TEST = """
def test_through_kproxy(kproxy, kproxy_upstream):
    assert kproxy_upstream.kind is None and kproxy_upstream.bootstrap == "{upstream}"
    with kproxy.admin.rule({{"id": "r", "match": {{"api": "Fetch"}}, "action": {{"type": "delay", "ms": 1}}}}):
        assert [r["id"] for r in kproxy.admin.rules()] == ["r"]
"""


def _child_pytest(directory: Path, *args: str) -> subprocess.CompletedProcess[str]:
    # The suite's children run without hypothesis (tests/fixtures/child_env.py); a child pytest loads its
    # plugin, so that folder is left off this one's path.
    path = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p and "without-hypothesis" not in p]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path)}
    return subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p", "no:xdist", *args],
                          cwd=directory, capture_output=True, text=True, timeout=90, env=env, check=False)


def test_a_users_pytest_run_takes_the_broker_from_an_option_or_the_ini_file(tmp_path, kproxy_upstream):
    (tmp_path / "test_user.py").write_text(USER_TEST.format(upstream=kproxy_upstream.bootstrap))
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    done = _child_pytest(tmp_path, "--kproxy-bootstrap", kproxy_upstream.bootstrap)
    assert done.returncode == 0, done.stdout + done.stderr
    (tmp_path / "pytest.ini").write_text(f"[pytest]\nkproxy_bootstrap = {kproxy_upstream.bootstrap}\n")
    done = _child_pytest(tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr


def test_a_users_pytest_run_can_turn_the_plugin_off_and_is_told_of_bad_settings(tmp_path):
    (tmp_path / "pytest.ini").write_text("[pytest]\n")
    (tmp_path / "test_user.py").write_text("def test_it(kproxy):\n    pass\n")
    done = _child_pytest(tmp_path, "-p", "no:kproxy")
    assert done.returncode == 1 and "fixture 'kproxy' not found" in done.stdout
    done = _child_pytest(tmp_path, "--kproxy-broker", "tansu", "--kproxy-bootstrap", "127.0.0.1:9")
    assert done.returncode == pytest.ExitCode.USAGE_ERROR
    assert "--kproxy-broker starts a broker and --kproxy-bootstrap names one" in done.stderr
    (tmp_path / "test_user.py").write_text(textwrap.dedent("""
        import pytest

        @pytest.mark.kproxy(rule="x.yaml")
        def test_it(kproxy):
            pass
    """))
    done = _child_pytest(tmp_path, "--kproxy-broker", "tansu")
    assert done.returncode == 1 and "unknown setting(s) rule; it takes rules, guard and seed" in done.stdout
    done = _child_pytest(tmp_path, "--kproxy-bootstrap", "127.0.0.1:9")
    assert done.returncode == 1 and "kproxy: no broker: cannot connect to the broker at 127.0.0.1:9" in done.stdout
