"""The broker and the tracing proxy of one test run, for `kproxy test` and the pytest plugin.

A broker is either one kproxy starts (a kind of kproxy.brokers, stopped at
the end) or the user's (`bootstrap`, left alone). The proxy in front of it
is `kproxy run` as a child process (kproxy.proxy_process), tracing at level
`records`: the analysis derives the clients' history from the records the
trace carries, so no level below that can be judged.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from kproxy.brokers import (
    KINDS,
    BrokerError,
    EmbeddedBroker,
    check_broker,
    start_broker,
)
from kproxy.proxy_process import ProxyProcess, start_proxy

if TYPE_CHECKING:
    from kproxy.brokers.identify import BrokerIdentity

#: Tansu rather than the demo's noida-db: noida-db answers an idle Fetch at
#: once, so a consumer that waits spins and a records-level trace grows
#: about 500 times larger (docs/brokers.md), which the analysis then reads.
DEFAULT_KIND = "tansu"
#: The one kind whose `transaction.version` feature can be set (Kafka 4.x).
TRANSACTION_VERSION_KINDS = ("kafka",)

Say = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


class SetupError(ValueError):
    """Options that cannot go together; refused before anything starts."""


@dataclass
class Upstream:
    """The cluster behind the proxy: one kproxy started (`kind`), or the user's (`kind` None)."""

    bootstrap: str
    kind: str | None
    version: str | None = None
    broker: EmbeddedBroker | None = None
    identity: BrokerIdentity | None = field(default=None, repr=False)

    def alive(self) -> bool:
        return self.broker is None or self.broker.alive()

    def stop(self) -> None:
        """Stop the broker kproxy started (once); the user's is left alone."""
        broker, self.broker = self.broker, None
        if broker is not None:
            broker.stop()

    def describe(self) -> str:
        if self.kind is None:
            return f"the broker at {self.bootstrap}" + (f" ({self.identity.software})" if self.identity else "")
        return f"the embedded {self.kind}{' ' + self.version if self.version else ''} broker at {self.bootstrap}"

    def report_section(self) -> dict[str, Any] | None:
        """report.json's `broker`, as `kproxy demo` writes it (docs/brokers.md), when the broker was identified."""
        if self.identity is None:
            return None
        from kproxy.demo import broker_section

        section = broker_section(self.identity, self.kind, self.version, "")
        section.pop("topic_prefix", None)  # the application names its own topics
        return section


def check_upstream(kind: str | None, bootstrap: str | None, transaction_version: int | None) -> str | None:
    """Refuse what cannot work before anything starts; the version of the broker binary to start, if any.

    SetupError for options that do not go together, BrokerError for a broker
    binary that does not run here."""
    if kind is not None and bootstrap is not None:
        raise SetupError("--broker starts a broker and --bootstrap names one: give one of them")
    if kind is not None and kind not in KINDS:
        raise SetupError(f"unknown broker kind {kind!r}; choose one of: {', '.join(KINDS)}")
    if transaction_version is not None:
        if bootstrap is not None:
            raise SetupError("--transaction-version is set on a broker kproxy starts (--broker kafka), "
                             "not on the broker at --bootstrap")
        if (kind or DEFAULT_KIND) not in TRANSACTION_VERSION_KINDS:
            raise SetupError(f"--transaction-version: the {kind or DEFAULT_KIND} broker has no transaction.version "
                             f"feature; it is Apache Kafka's (--broker kafka)")
    if bootstrap is not None:
        return None
    return check_broker(kind or DEFAULT_KIND)


def start_upstream(kind: str | None = None, bootstrap: str | None = None, *, transaction_version: int | None = None,
                   log_path: Path | None = None, say: Say = _quiet) -> Upstream:
    """Start a broker of `kind` (default DEFAULT_KIND), or check that the one at `bootstrap` answers.

    BrokerError when it does not start or does not answer."""
    from kproxy.brokers.identify import identify

    if bootstrap is not None:
        return Upstream(bootstrap, None, identity=identify(bootstrap))
    kind = kind or DEFAULT_KIND
    options: dict[str, Any] = {"log_path": log_path}
    if kind == "kafka":
        options["say"] = say  # jar downloads and formatting take a while: say so
        if transaction_version is not None:
            options["transaction_version"] = transaction_version
    broker = start_broker(kind=kind, **options)
    upstream = Upstream(broker.bootstrap, kind, broker.version, broker)
    try:
        upstream.identity = identify(broker.bootstrap)
    except BrokerError:
        pass  # only the report's broker section misses it
    except BaseException:
        upstream.stop()
        raise
    return upstream


def proxy_arguments(traces: Path, *, rules: Path | None = None, guard: bool = False,
                    seed: int | None = None) -> list[str]:
    """`kproxy run`'s options for a proxy whose trace the analysis can judge on its own."""
    args = ["--traces", str(Path(traces).absolute()), "--trace-level", "records"]
    if rules is not None:
        args += ["--rules", str(Path(rules).absolute())]
    if guard:
        args.append("--guard")
    if seed is not None:
        args += ["--seed", str(seed)]
    return args


def start_tracing_proxy(upstream: str, traces: Path, *, rules: Path | None = None, guard: bool = False,
                        seed: int | None = None, log_path: Path | None = None) -> ProxyProcess:
    """`kproxy run` in front of `upstream`, tracing at level records into `traces`; RuntimeError if it does not start."""
    Path(traces).mkdir(parents=True, exist_ok=True)
    return start_proxy(upstream, *proxy_arguments(traces, rules=rules, guard=guard, seed=seed), log_path=log_path)


def client_requests(proxy: ProxyProcess, timeout: float = 5.0) -> int | None:
    """How many requests clients sent through the proxy so far (its /metrics); None when it cannot say."""
    import httpx
    from prometheus_client.parser import text_string_to_metric_families

    try:
        text = httpx.get(f"{proxy.admin_url}/metrics", timeout=timeout).text
    except httpx.HTTPError:
        return None
    total = 0.0
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            if (sample.name == "kproxy_frames_total" and sample.labels.get("direction") == "request"
                    and sample.labels.get("source") == "client"):
                total += sample.value
    return int(total)
