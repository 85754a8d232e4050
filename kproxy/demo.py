"""The scenario runner behind `kproxy demo`: broker, proxy with a scenario's
rules, workload, analysis.

Each scenario runs the transactional queue workload through the proxy with
the scenario's rule file, tracing at level `records`, then analyses the
history against the traces. Workload settings per scenario are below: they
are the ones that make that scenario's fault observable in a short run.

The broker is either one kproxy starts (`broker=KIND`, stopped at the end)
or one it did not (`bootstrap="host:port"`: the user's cluster, or a broker
shared by several runs). A secured cluster is reached as `kproxy run` reaches
it: TLS towards the brokers with `upstream_tls` (the proxy's options, and the
demo's own identification of the broker), SASL passed through from the
clients, whose settings (`client_config`) reach every client of the
workload. Either way a run creates only its own topics, named
with a prefix fresh per run, and its own groups and transactional ids under
the same prefix; it deletes and alters nothing.
"""

from __future__ import annotations

import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from kproxy.brokers import check_broker, start_broker
from kproxy.brokers.identify import BrokerIdentity, identify, nodes_text
from kproxy.engine.client import status as engine_status
from kproxy.engine.warm_up import WarmingSession
from kproxy.obs.trace_files import refuse_earlier_traces
from kproxy.prereqs import check_spark_prerequisites
from kproxy.proxy_process import UpstreamTlsFiles, start_proxy
from kproxy.resources import shipped
from kproxy.workload.clients.go_build import check_client

DEFAULT_SCENARIO = "torn-transaction"
DEFAULT_BROKER = "noida"  # chosen by measurement: docs/brokers.md
#: Workloads at least this long warm Spark while they run. A cold JVM's start and warm-up analysis take
#: 15-20 s beside a workload; a shorter run would wait for the warm-up to end before its own analysis
#: (a `kproxy test` of a 2 s command took 38 s warmed against 32 s cold).
WARMING_PAYS_S = 15.0


def rules_dir() -> Path:
    """The shipped scenarios: the package's copy of rules/, or rules/ of a source checkout."""
    return shipped("rules")


def scenarios(directory: Path | None = None) -> dict[str, Path]:
    return {p.stem: p for p in sorted((directory or rules_dir()).glob("*.yaml"))}


@dataclass(frozen=True)
class WorkloadProfile:
    txn: bool = True
    abort_probability: float = 0.3
    concurrency: int = 3
    duration: float = 20.0
    crash_probability: float = 0.0
    max_txn_length: int = 4
    key_count: int = 4


def profile_for(scenario: str) -> WorkloadProfile:
    """The workload a scenario runs with (PROFILES, else the default)."""
    return PROFILES.get(scenario, WorkloadProfile())


# Scenarios whose faults need something other than the default profile.
PROFILES: dict[str, WorkloadProfile] = {
    # Longer transactions give the stale commit records on both sides of it.
    "torn-transaction": WorkloadProfile(abort_probability=0.6, max_txn_length=8),
    "lost-produce-ack": WorkloadProfile(txn=False, abort_probability=0.0),
    "ambiguous-not-leader": WorkloadProfile(txn=False, abort_probability=0.0),
    "spurious-zero-offset": WorkloadProfile(txn=False, abort_probability=0.0),
    "chaos-latency": WorkloadProfile(txn=False, abort_probability=0.0),
}


def fresh_topic_prefix() -> str:
    """Topics, group and transactional ids of one run; unique so that runs can share a broker."""
    return f"kproxy-demo-{uuid.uuid4().hex[:10]}"


def broker_section(identity: BrokerIdentity, kind: str | None, binary_version: str | None, prefix: str) -> dict[str, Any]:
    """report.json's `broker`: what the wire said the broker is, and whether this run started it."""
    section = identity.to_json()
    section["started_by_kproxy"] = kind is not None
    if kind is not None:
        # The binary's own answer is exact where the wire can only match a table.
        section["kind"] = kind
        section["binary_version"] = binary_version
    section["topic_prefix"] = prefix
    return section


def broker_line(section: dict[str, Any]) -> str:
    soft = section["software"]
    version = section.get("binary_version") or section.get("version")
    how = "started by kproxy" if section["started_by_kproxy"] else "not started by kproxy"
    return (f"broker: {soft}{' ' + version if version else ''} at {section['bootstrap']}, "
            f"{nodes_text(section['nodes'])}, {how} ({section['basis']})")


@dataclass
class DemoResult:
    scenario: str
    out_dir: Path
    report: dict[str, Any]
    summary: str
    exit_code: int
    topic_prefix: str = ""


def run_demo(
    scenario: str,
    out_dir: Path,
    *,
    guard: bool = False,
    seed: int = 1,
    duration: float | None = None,
    rules_directory: Path | None = None,
    say: Callable[[str], None] = print,
    progress: bool = True,
    broker: str | None = None,
    bootstrap: str | None = None,
    rules_file: Path | None = None,
    topic_prefix: str | None = None,
    spark: Any = None,
    client: str = "confluent-kafka",
    profile: WorkloadProfile | None = None,
    upstream_tls: UpstreamTlsFiles | None = None,
    client_config: Mapping[str, str] | None = None,
    transaction_version: int | None = None,
) -> DemoResult:
    """Run one scenario end to end and return its report.

    broker: the kind of broker to start (default DEFAULT_BROKER); bootstrap:
    run against this existing broker instead. rules_file: run these rules
    under the scenario's name and workload profile (a shrunk rule file, say).
    spark: an existing SparkSession for the analysis (tests share one).
    client: the workload's client library (kproxy.workload.config.CLIENTS).
    profile: the workload instead of the scenario's (`duration` still applies).
    upstream_tls: TLS towards the `bootstrap` cluster (`kproxy run --upstream-tls ...`).
    client_config: settings of every workload client (SASL for a SASL cluster; the
    clients reach the proxy's plaintext loopback listener, so SASL_PLAINTEXT).
    transaction_version: the transaction.version feature of a Kafka 4.x broker the demo
    starts (broker="kafka"; default 2, KIP-890 part 2).
    """
    from kproxy.workload.config import WorkloadConfig
    from kproxy.workload.runner import run_workload

    if broker is not None and bootstrap is not None:
        raise ValueError("give a broker kind to start or a bootstrap address, not both")
    if upstream_tls is not None and bootstrap is None:
        raise ValueError("TLS towards the broker needs a bootstrap address: the embedded brokers speak plaintext")
    if transaction_version is not None and broker != "kafka":
        raise ValueError("a transaction version is set on the Kafka broker the demo starts (broker kafka)")
    if rules_file is None:
        available = scenarios(rules_directory)
        if scenario not in available:
            raise ValueError(f"unknown scenario {scenario!r}; choose one of: {', '.join(available)}")
        rules = available[scenario]
    else:
        from kproxy.faults.loader import load_rule_file

        load_rule_file(rules_file)  # a bad file fails here with file and line, before anything starts
        rules = rules_file
    refuse_earlier_traces(out_dir)
    if spark is None:
        check_spark_prerequisites("demo")  # a missing extra or Java fails now, not after the workload
    check_client(client)  # a Go client without Go fails now too
    kind = None if bootstrap is not None else (broker or DEFAULT_BROKER)
    identity: BrokerIdentity | None = None
    binary_version = None
    if kind is not None:
        binary_version = check_broker(kind)  # a binary that cannot run here fails now, before anything starts
    else:
        assert bootstrap is not None
        # An unreachable or unreadable broker (a TLS handshake that fails) fails now too.
        identity = identify(bootstrap, tls=upstream_tls.settings() if upstream_tls is not None else None)
    prefix = topic_prefix or fresh_topic_prefix()
    profile = profile or profile_for(scenario)
    if duration is not None:
        profile = replace(profile, duration=duration)
    out_dir.mkdir(parents=True, exist_ok=True)
    history = out_dir / "history.jsonl"
    traces = out_dir / "traces"
    started = time.monotonic()
    warming = None
    if spark is None and profile.duration >= WARMING_PAYS_S and engine_status() is None:
        # Spark starts, and warms with one small analysis, while the broker and the workload run (they
        # leave a core idle): the analysis then meets a warm JVM instead of paying a cold one's start.
        warming = WarmingSession().start()

    stop_broker: Callable[[], None] = lambda: None  # noqa: E731
    if kind is not None:
        say(f"[1/4] starting the embedded {kind} broker (logs in {out_dir})")
        options = {"transaction_version": transaction_version} if transaction_version is not None else {}
        embedded = start_broker(kind=kind, log_path=out_dir / "broker.log", **options)
        upstream = embedded.bootstrap
        stop_broker = embedded.stop
    else:
        assert bootstrap is not None and identity is not None
        over = " over TLS" if upstream_tls is not None else ""
        say(f"[1/4] using the broker at {bootstrap}{over}: {identity.describe()}; this run's topics are {prefix}-*")
        upstream = bootstrap
    try:
        if identity is None:
            identity = identify(upstream)
        shown = f"rules/{rules.name}" if rules_file is None else str(rules)
        say(f"[2/4] starting kproxy with {shown}{' in guard mode' if guard else ''}")
        args = ["--rules", str(rules), "--seed", str(seed), "--traces", str(traces), "--trace-level", "records"]
        if guard:
            args.append("--guard")
        if upstream_tls is not None:
            args += upstream_tls.run_args()
        proxy = start_proxy(upstream, *args, log_path=out_dir / "kproxy.log")
        try:
            if warming is not None:
                warming.wait_launched(timeout=60)
            say(
                f"[3/4] running the queue workload through the proxy for {profile.duration:.0f}s "
                f"({'transactional' if profile.txn else 'plain'}, {profile.concurrency} {client} processes, seed {seed})"
            )
            config = WorkloadConfig(
                bootstrap=proxy.bootstrap,
                client=client,
                concurrency=profile.concurrency,
                duration=profile.duration,
                seed=seed,
                txn=profile.txn,
                abort_probability=profile.abort_probability,
                crash_probability=profile.crash_probability,
                max_txn_length=profile.max_txn_length,
                key_count=profile.key_count,
                topic_prefix=prefix,
                client_config=dict(client_config or {}),
            )
            run_workload(config, history, progress=progress)
        finally:
            proxy.stop()  # SIGTERM: the trace writer flushes every accepted event
    finally:
        stop_broker()

    say("[4/4] analysing the history against the wire traces with Spark (local mode)")
    from kproxy_spark.jobs import analyze
    from kproxy_spark.report import exit_code, format_summary

    report = None
    # The report says which broker the run met; the analysis writes it with the rest, once.
    broker = broker_section(identity, kind, binary_version, prefix)
    if spark is None and warming is None:
        from kproxy.engine.client import analyze_if_running

        # A warm engine (kproxy engine start) saves Spark's start and a cold JVM.
        report = analyze_if_running({"history": str(history), "traces": str(traces), "out": str(out_dir),
                                     "broker": broker}, say, phases=False)
    if report is None:
        if warming is not None:
            spark = warming.session()
        report = analyze(str(history), str(traces), str(out_dir), spark=spark, broker=broker)
    summary = broker_line(report["broker"]) + "\n" + format_summary(report, str(out_dir))
    say(summary)
    say(f"done in {time.monotonic() - started:.0f}s: {out_dir / 'report.html'} and {out_dir / 'report.json'}")
    return DemoResult(scenario, out_dir, report, summary, exit_code(report), prefix)
