"""pytest plugin: Kafka tests through kproxy, judged from the wire (docs/testing.md).

Installed with kproxy (entry point `pytest11: kproxy`); `-p no:kproxy` turns it off.

    def test_orders(kproxy):
        producer = Producer({"bootstrap.servers": kproxy.bootstrap, ...})
        with kproxy.admin.rule({"id": "slow-commit", "match": {"api": "EndTxn"}, "action": {"type": "delay", "ms": 200}}):
            ...
        kproxy.verdict().assert_valid()

Fixtures:
  kproxy           a proxy for this test (kproxy.testing.proxy.TracingProxy): .bootstrap, .admin, .traces,
                   .verdict(), .fresh_name(); settings by marker: @pytest.mark.kproxy(rules=..., guard=..., seed=...)
  kproxy_upstream  the broker behind it for the whole session: one kproxy starts (--kproxy-broker, default
                   tansu) or yours (--kproxy-bootstrap HOST:PORT)

Loading it costs a few small imports: the brokers, the proxy, Spark and the
Kafka clients are imported by the fixtures, and only when a test asks for one.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from kproxy.testing.harness import Upstream
    from kproxy.testing.proxy import TracingProxy

#: The broker kinds of kproxy.brokers.KINDS, named here so that loading the plugin imports none of them.
BROKER_KINDS = ("tansu", "noida", "kafka")
SETTINGS = {
    "bootstrap": "Put the proxies in front of this broker (HOST:PORT) instead of starting one.",
    "broker": f"Embedded broker kproxy starts for the session: {', '.join(BROKER_KINDS)} [default: tansu].",
    "master": "Spark master URL of kproxy.verdict() [default: local[*]].",
}


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("kproxy", "kproxy: Kafka traffic through a tracing, fault-injecting proxy")
    group.addoption("--kproxy-bootstrap", metavar="HOST:PORT", default=None, help=SETTINGS["bootstrap"])
    group.addoption("--kproxy-broker", choices=BROKER_KINDS, default=None, help=SETTINGS["broker"])
    group.addoption("--kproxy-master", metavar="URL", default=None, help=SETTINGS["master"])
    for name, help_ in SETTINGS.items():
        parser.addini(f"kproxy_{name}", help_ + f" (--kproxy-{name} overrides it)", default=None)


def pytest_configure(config: pytest.Config) -> None:
    # Refused before any test runs; whether the broker starts or answers is the fixture's to find out.
    kind = _setting(config, "broker")
    if kind is not None and kind not in BROKER_KINDS:
        raise pytest.UsageError(f"kproxy_broker = {kind}: choose one of {', '.join(BROKER_KINDS)}")
    if kind is not None and _setting(config, "bootstrap") is not None:
        raise pytest.UsageError("--kproxy-broker starts a broker and --kproxy-bootstrap names one: give one of them")
    config.addinivalue_line(
        "markers",
        "kproxy(rules=None, guard=False, seed=None): the `kproxy` fixture's proxy for this test: a rule file "
        "(relative to the rootdir), guard mode, the rules' seed",
    )


def _setting(config: pytest.Config, name: str) -> str | None:
    value = config.getoption(f"--kproxy-{name}") or config.getini(f"kproxy_{name}")
    return (str(value).strip() or None) if value else None


@pytest.fixture(scope="session")
def kproxy_upstream(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Upstream]:
    """The broker behind every `kproxy` proxy of the session: started (and stopped) by kproxy, or yours."""
    from kproxy.brokers import BrokerError
    from kproxy.testing.harness import SetupError, check_upstream, start_upstream

    bootstrap, kind = _setting(request.config, "bootstrap"), _setting(request.config, "broker")
    problem = None
    try:
        check_upstream(kind, bootstrap, None)
        upstream = start_upstream(kind, bootstrap, log_path=tmp_path_factory.mktemp("kproxy-broker") / "broker.log")
    except (SetupError, BrokerError) as exc:
        problem = str(exc)
    if problem is not None:
        pytest.fail(f"kproxy: no broker: {problem}", pytrace=False)
    yield upstream
    upstream.stop()


@pytest.fixture
def kproxy(request: pytest.FixtureRequest, kproxy_upstream: Upstream, tmp_path: Path) -> Iterator[TracingProxy]:
    """A proxy in front of the session's broker for this test, tracing records into tmp_path/kproxy/traces.

    .bootstrap: the address clients use; .admin: its rules (kproxy.testing.admin.AdminClient);
    .traces: the trace directory; .verdict(): stop it and judge the trace (kproxy.testing.verdict.Verdict)."""
    from kproxy.testing.proxy import TracingProxy

    marker = request.node.get_closest_marker("kproxy")
    options = dict(marker.kwargs) if marker is not None else {}
    unknown = set(options) - {"rules", "guard", "seed"}
    if unknown:
        pytest.fail(f"@pytest.mark.kproxy: unknown setting(s) {', '.join(sorted(unknown))}; it takes rules, guard "
                    "and seed", pytrace=False)
    rules = options.get("rules")
    if rules is not None:
        from kproxy.faults.errors import RuleFileError
        from kproxy.faults.loader import load_rule_file

        rules = request.config.rootpath / rules  # an absolute path stays as it is
        problem = None
        try:
            load_rule_file(rules)
        except (RuleFileError, OSError) as exc:
            problem = str(exc)
        if problem is not None:
            pytest.fail(f"@pytest.mark.kproxy(rules=...): {problem}", pytrace=False)
    proxy = TracingProxy(kproxy_upstream.bootstrap, tmp_path / "kproxy", rules=rules,
                         guard=bool(options.get("guard", False)), seed=options.get("seed"),
                         master=_setting(request.config, "master") or "local[*]")
    try:
        yield proxy
    finally:
        proxy.stop()
