"""Run a proxy with its companions until a signal.

Companions: the trace writer, the admin HTTP server, and rule reloads (when
the file changes, and on SIGHUP). A reload can fail, the proxy cannot: a
refused file, or any error while reading it, keeps the running rules.
On SIGINT/SIGTERM the listeners and connections close first, then the trace
writer writes every event it accepted.
"""

from __future__ import annotations

import gc
import logging
import signal
from pathlib import Path

import trio

from kproxy.faults.engine import CompiledRuleFile, FaultEngine, compile_rule_file
from kproxy.faults.errors import Problem, RuleFileError
from kproxy.faults.loader import load_rule_file
from kproxy.faults.model import RuleFile
from kproxy.io.config import ProxyConfig
from kproxy.io.proxy import Proxy
from kproxy.obs import metrics

log = logging.getLogger("kproxy.serve")

RULE_POLL_SECONDS = 1.0
RELOAD_TIMEOUT_SECONDS = 30.0


def _make_trace_writer(config: ProxyConfig):  # noqa: ANN202
    if config.traces_dir is None:
        return None
    from kproxy.obs.trace import TraceWriter

    config.traces_dir.mkdir(parents=True, exist_ok=True)
    return TraceWriter(
        config.traces_dir,
        level=config.trace_level,  # type: ignore[arg-type]
        fmt=config.trace_format,  # type: ignore[arg-type]
        rotate_bytes=config.trace_rotate_bytes,
        rotate_seconds=config.trace_rotate_seconds,
        on_full=config.trace_on_full,  # type: ignore[arg-type]
        queue_size=config.trace_queue_events,
        fold_idle_fetches=config.trace_fold_idle_fetches,
        proxy_id=config.proxy_id,
    )


class RuleReloader:
    """Reloads the rule file; a bad file is refused and the running rules stay."""

    def __init__(self, proxy: Proxy, path: Path | None) -> None:
        self.proxy = proxy
        self.path = path
        self.mtime = self._mtime()
        # One reload at a time, so a slow read never installs over a newer one.
        self._lock = trio.Lock()

    def _mtime(self) -> float | None:
        try:
            return self.path.stat().st_mtime if self.path else None
        except OSError:
            return None

    async def reload(self) -> None:
        """Re-read the file (file watch, admin API and SIGHUP); RuleFileError when refused."""
        if self.path is None:
            raise RuleFileError([Problem("--rules", None, (), "the proxy was started without --rules: there is no file to reload")])
        async with self._lock:
            self.mtime = self._mtime()
            try:
                # Reading, validating and compiling take up to a second for the largest
                # file accepted: off the loop, so traffic and /healthz never wait for it.
                # A read that never ends (a FIFO is refused before reading, but a file
                # on a hung mount is not) would hold the lock and wedge every later
                # reload: give up on it after a bound far above the largest file's second.
                with trio.fail_after(RELOAD_TIMEOUT_SECONDS):
                    compiled = await trio.to_thread.run_sync(_read_and_compile, self.path, abandon_on_cancel=True)
                self.proxy.set_rules(compiled)
            except trio.TooSlowError:
                metrics.rule_reloads.labels("refused").inc()
                problem = Problem(str(self.path), None, (),
                                  f"reading the rule file took longer than {RELOAD_TIMEOUT_SECONDS:.0f} s: refused")
                log.error("refused to reload %s; the running rules stay:\n%s", self.path, problem)
                raise RuleFileError([problem]) from None
            except RuleFileError as exc:
                metrics.rule_reloads.labels("refused").inc()
                log.error("refused to reload %s; the running rules stay:\n%s", self.path, exc)
                raise
            except Exception as exc:  # a reload may fail in ways nobody foresaw; the proxy must not
                metrics.rule_reloads.labels("error").inc()
                log.exception("reloading %s failed; the running rules stay", self.path)
                problem = Problem(str(self.path), None, (), f"reloading failed: {type(exc).__name__}: {exc}")
                raise RuleFileError([problem]) from exc
        metrics.rule_reloads.labels("accepted").inc()
        log.info("reloaded %s: %d rules", self.path, len(compiled.rules))

    async def reload_quietly(self) -> None:
        """Reload, with a refusal only logged and counted (the file watch and SIGHUP)."""
        try:
            await self.reload()
        except RuleFileError:
            pass

    async def watch(self) -> None:
        while True:
            await trio.sleep(RULE_POLL_SECONDS)
            mtime = self._mtime()
            if mtime is not None and mtime != self.mtime:
                await self.reload_quietly()


def _read_and_compile(path: Path) -> CompiledRuleFile:
    return compile_rule_file(load_rule_file(path))


def load_initial_rules(config: ProxyConfig) -> FaultEngine:
    rule_file = load_rule_file(config.rules_path) if config.rules_path else RuleFile(version=1)
    return FaultEngine(rule_file, seed=config.seed)


def _freeze_startup_objects() -> None:
    """Keep the collector off what start-up built (modules, schemas, metrics).

    A full collection otherwise walks every one of those objects again and
    pauses the data path for about 10 ms, which shows in the tail latency of
    every connection; frozen objects are never scanned.
    """
    gc.collect()
    gc.freeze()


async def serve(config: ProxyConfig, *, task_status: trio.TaskStatus[Proxy] = trio.TASK_STATUS_IGNORED) -> None:
    engine = load_initial_rules(config)
    trace = _make_trace_writer(config)
    proxy = Proxy(config, engine=engine, trace=trace)
    proxy.rules_changed()
    reloader = RuleReloader(proxy, config.rules_path)
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM, signal.SIGHUP) as signals:
        async with trio.open_nursery() as outer:
            if trace is not None:
                await outer.start(trace.run)
            async with trio.open_nursery() as nursery:
                await nursery.start(proxy.run)
                if config.admin is not None:
                    from kproxy.io.admin import serve_admin

                    await nursery.start(serve_admin, proxy, reloader.reload)
                if config.rules_path is not None:
                    nursery.start_soon(reloader.watch)
                _freeze_startup_objects()
                task_status.started(proxy)
                async for signum in signals:
                    if signum == signal.SIGHUP:
                        log.info("SIGHUP: reloading %s", config.rules_path)
                        # In its own task, so a SIGTERM right after is not kept waiting.
                        nursery.start_soon(reloader.reload_quietly)
                        continue
                    log.info("received %s: shutting down", signal.Signals(signum).name)
                    break
                proxy.shutdown()
                nursery.cancel_scope.cancel()
            if trace is not None:
                await trace.aclose()
                log.info("trace: %d events written to %s", trace.written, config.traces_dir)
            outer.cancel_scope.cancel()
    log.info("proxy stopped")
