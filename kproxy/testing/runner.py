"""`kproxy test`'s run: broker, tracing proxy, the user's command, stop, verdict.

Everything it starts is stopped before it returns, in order (the command's
process group, then the proxy, which flushes its trace, then the broker),
whether the command exits, runs out its --duration, or kproxy is
interrupted. The exit status says which of kproxy, the command and the
verdict failed (EXIT_* below; docs/testing.md has the table and why).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kproxy.brokers import BrokerError
from kproxy.proxy_process import ProxyProcess
from kproxy.testing.command import (
    BOOTSTRAP_VARIABLE,
    CommandOutcome,
    command_text,
    deferred_interrupt,
    run_command,
    substitute,
)
from kproxy.testing.final_read import final_read, user_topics
from kproxy.testing.harness import (
    Upstream,
    client_requests,
    start_tracing_proxy,
    start_upstream,
)

# The analysis's own codes where they mean the same (kproxy analyze, kproxy_spark.report).
EXIT_VALID = 0  # the command succeeded and the verdict is valid
EXIT_INVALID = 1  # the verdict found error-level anomalies
EXIT_USAGE = 2  # bad options or input; nothing was started
EXIT_KPROXY = 3  # kproxy itself failed: a broker or proxy that would not start or died, an analysis error
EXIT_UNKNOWN = 4  # the analysis could not judge what the command did
EXIT_COMMAND = 5  # the command failed: not found, a non-zero exit, or no request through the proxy at all
EXIT_INTERRUPTED = 130  # Ctrl-C or SIGTERM: everything was stopped, nothing analysed

#: The variable that tells the command the proxy's admin API (as `kproxy rules` reads it).
ADMIN_VARIABLE = "KPROXY_ADMIN"

Say = Callable[[str], None]


@dataclass(frozen=True)
class RunSettings:
    command: tuple[str, ...]
    out: Path
    broker: str | None = None
    bootstrap: str | None = None
    rules: Path | None = None
    guard: bool = False
    seed: int | None = None
    transaction_version: int | None = None
    duration: float | None = None
    master: str = "local[*]"
    analyze: bool = True
    final_read: bool = True
    final_read_timeout: float = 30.0


@dataclass
class RunResult:
    exit_code: int
    command: CommandOutcome | None = None
    client_requests: int | None = None
    verdict: str = "not analysed"  # valid, invalid, unknown, not analysed
    report: dict[str, Any] | None = None
    problems: list[str] = field(default_factory=list)  # kproxy's own failures
    reason: str = ""

    def to_json(self, settings: RunSettings) -> dict[str, Any]:
        return {
            "exit_code": self.exit_code, "reason": self.reason, "verdict": self.verdict,
            "command": self.command.to_json() if self.command else {"argv": list(settings.command)},
            "client_requests": self.client_requests, "kproxy_problems": self.problems,
            "report": str(settings.out / "report" / "report.json") if self.report is not None else None,
        }


def exit_status(*, kproxy_failed: bool, verdict_code: int | None, command_failed: bool) -> int:
    """One status for three outcomes. kproxy's failure first (nothing it says can be trusted), then an
    invalid verdict (what kproxy is run to find; often why the command failed), then the command's failure,
    then a verdict that could not be reached."""
    if kproxy_failed:
        return EXIT_KPROXY
    if verdict_code == EXIT_INVALID:
        return EXIT_INVALID
    if command_failed:
        return EXIT_COMMAND
    if verdict_code == EXIT_UNKNOWN:
        return EXIT_UNKNOWN
    return EXIT_VALID


def _watch(proxy: ProxyProcess, upstream: Upstream) -> str | None:
    if not proxy.alive():
        return f"kproxy exited with status {proxy.process.returncode} while the command ran (see {proxy.log_path})"
    if not upstream.alive():
        return "the broker exited while the command ran (see its log beside the report)"
    return None


def run_test(settings: RunSettings, *, say: Say, echo: Say) -> RunResult:
    """Run one `kproxy test`; `say` takes progress lines, `echo` the summary. KeyboardInterrupt
    propagates once everything is stopped."""
    out = settings.out
    out.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    result = RunResult(EXIT_VALID)
    upstream: Upstream | None = None
    proxy: ProxyProcess | None = None
    try:
        where = settings.bootstrap or f"the embedded {settings.broker} broker"
        say(f"starting {where}" if settings.bootstrap is None else f"checking the broker at {where}")
        with deferred_interrupt():  # a Ctrl-C halfway would leave a broker nobody stops
            upstream = start_upstream(settings.broker, settings.bootstrap,
                                      transaction_version=settings.transaction_version,
                                      log_path=out / "broker.log", say=say)
        say(f"starting kproxy in front of {upstream.describe()}, tracing records to {out / 'traces'}"
            + (f", rules {settings.rules}" if settings.rules else "") + (", guard mode" if settings.guard else ""))
        with deferred_interrupt():
            proxy = start_tracing_proxy(upstream.bootstrap, out / "traces", rules=settings.rules,
                                        guard=settings.guard, seed=settings.seed, log_path=out / "kproxy.log")
        topics_before = user_topics(upstream.bootstrap) if settings.bootstrap is not None else set()
        argv = substitute(settings.command, proxy.bootstrap)
        env = {**os.environ, BOOTSTRAP_VARIABLE: proxy.bootstrap, ADMIN_VARIABLE: f"{proxy.host}:{proxy.admin_port}"}
        say(f"running the command with {BOOTSTRAP_VARIABLE}={proxy.bootstrap}: {command_text(argv)}")
        running = proxy, upstream
        result.command = run_command(argv, env=env, log_path=out / "command.log", duration=settings.duration,
                                     say=say, keep_running=lambda: _watch(*running))
        say(result.command.describe())
        if result.command.error is None:
            result.client_requests = client_requests(proxy)
        if settings.final_read and result.command.error is None and result.client_requests:
            _final_read(proxy.bootstrap, user_topics(upstream.bootstrap) - topics_before, settings, say)
    except (BrokerError, RuntimeError, OSError) as exc:
        result.problems.append(str(exc))
    finally:
        # Stopping is bounded; an interrupt meanwhile waits for it (and then ends the run: no analysis).
        with deferred_interrupt():
            if proxy is not None or upstream is not None:
                say("stopping kproxy (its trace is flushed)" + (" and the broker" if upstream and upstream.kind else ""))
            if proxy is not None:
                status = proxy.stop()
                if status not in (0, None) and not result.problems:
                    result.problems.append(f"kproxy exited with status {status} when stopped (see {proxy.log_path})")
            if upstream is not None:
                upstream.stop()

    command = result.command
    did_nothing = command is not None and command.error is None and result.client_requests == 0
    verdict_code = None
    if not result.problems and settings.analyze and command is not None and command.error is None and not did_nothing:
        verdict_code = _analyse(settings, upstream, result, say, echo)
    command_failed = command is None or command.failed or did_nothing
    result.exit_code = exit_status(kproxy_failed=bool(result.problems), verdict_code=verdict_code,
                                   command_failed=command_failed and not result.problems)
    result.reason = _reason(result, did_nothing)
    for problem in result.problems:
        echo(f"kproxy failed: {problem}")
    if command is not None:
        echo(f"command: {command_text(command.argv)}: {command.describe()}"
             + (f"; {result.client_requests} requests through the proxy" if result.client_requests is not None else ""))
    if did_nothing:
        echo(f"the command sent no request through the proxy: does it connect to ${BOOTSTRAP_VARIABLE} "
             f"or the {{bootstrap}} in its arguments?")
    echo(f"kproxy test: {result.reason} (exit {result.exit_code}, {time.monotonic() - started:.0f} s; "
         f"output in {out})")
    (out / "run.json").write_text(json.dumps(result.to_json(settings), indent=2) + "\n")
    return result


def _final_read(bootstrap: str, topics: set[str], settings: RunSettings, say: Say) -> None:
    """Read back, through the proxy, every topic the run made (kproxy.testing.final_read): the verdict
    can then call a write no consumer read lost, rather than unknown."""
    if not topics:
        return
    say(f"final read: reading {len(topics)} topic(s) back from offset 0 through kproxy (read_committed)")
    done = final_read(bootstrap, topics, timeout=settings.final_read_timeout)
    say(f"final read: {done.records} record(s) from {done.partitions} partition(s)"
        + ("" if done.caught_up else f"; not read to the end in {settings.final_read_timeout:.0f} s: "
                                     + ", ".join(done.lagging)))


def _analyse(settings: RunSettings, upstream: Upstream | None, result: RunResult, say: Say, echo: Say) -> int | None:
    """Judge the trace; the analysis's exit code (0 valid, 1 invalid, 4 unknown), or None when it failed."""
    from kproxy_spark.jobs import InputError
    from kproxy_spark.report import exit_code, format_summary

    from kproxy.testing.verdict import judge

    report_dir = settings.out / "report"
    say(f"analysing the trace with Spark ({settings.master}); the clients' history is derived from it")
    section = upstream.report_section() if upstream is not None else None
    try:
        report = judge(settings.out / "traces", report_dir, master=settings.master,
                       progress=lambda message: say(f"analysis: {message}"), broker=section)
    except InputError as exc:
        result.verdict = "unknown"
        echo(f"the analysis could not judge the trace: {exc}")
        return EXIT_UNKNOWN
    except Exception as exc:  # noqa: BLE001 - any other failure is kproxy's: exit 3, not a traceback
        result.problems.append(f"the analysis failed: {type(exc).__name__}: {exc}")
        return None
    lines = []
    if section is not None:
        from kproxy.demo import broker_line

        lines.append(broker_line(section))
    result.report = report
    code = exit_code(report)
    result.verdict = {0: "valid", 1: "invalid"}.get(code, "unknown")
    lines.append(format_summary(report, str(report_dir)))
    echo("\n".join(lines))
    return code


def _reason(result: RunResult, did_nothing: bool) -> str:
    code, command = result.exit_code, result.command
    if code == EXIT_KPROXY:
        return "kproxy itself failed"
    if code == EXIT_INVALID:
        failed = command is not None and command.failed
        return "the verdict found errors" + (" and the command failed" if failed else "")
    if code == EXIT_COMMAND:
        if did_nothing:
            return "the command did nothing through the proxy"
        return "the command failed" + ("" if result.verdict == "not analysed" else f"; the verdict is {result.verdict}")
    if code == EXIT_UNKNOWN:
        return "the verdict is unknown: the analysis could not judge what the command did"
    return "the command succeeded" + ("; the verdict is valid" if result.verdict == "valid" else
                                      " (not analysed: --no-analyze)")
