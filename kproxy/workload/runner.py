"""`run_workload`: the queue workload from start to final reads, as the CLI, demo and tests call it."""

from __future__ import annotations

import logging
import threading
import time
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from kproxy.brokers.process import unreachable
from kproxy.workload.clients import client_factory
from kproxy.workload.clients.base import ClientFactory
from kproxy.workload.config import WorkloadConfig
from kproxy.workload.final_reads import final_reads
from kproxy.workload.history import HistoryFormatError, HistoryWriter, validate_history
from kproxy.workload.keys import KeyLayout, KeySpace
from kproxy.workload.plan import OpBudget
from kproxy.workload.worker import OffsetTracker, Worker

log = logging.getLogger(__name__)


class WorkloadError(RuntimeError):
    """The workload could not run (bad client settings, a worker hit a bug)."""


@dataclass(frozen=True)
class WorkloadSummary:
    history_path: Path
    client: str
    invocations: int  # worker operations started (final reads not counted)
    completions: dict[str, int]  # ok / fail / info counts over the whole history, final reads included
    processes: int  # logical processes in the history, the final reader included
    keys: int
    final_reads_caught_up: bool
    lagging_keys: tuple[int, ...]
    elapsed: float  # seconds


def run_workload(config: WorkloadConfig, history_path: str | Path, progress: bool = True) -> WorkloadSummary:
    """Run the workload against config.bootstrap and write its history to history_path."""
    started = time.monotonic()
    history_path = Path(history_path)
    try:
        factory = client_factory(config.client, config.bootstrap, {**config.client_config, **config.producer_config},
                                 {**config.client_config, **config.consumer_config}, config.client_config)
    except ValueError as exc:  # a client that checks its settings up front (aiokafka) refused one
        raise WorkloadError(f"the workload could not start: {exc}") from exc
    try:
        # Checked once the client settings are (a client that cannot run here says so first), before any
        # client connects: against a dead broker each worker's clients retried until their first call
        # timed out, and the run stopped with an empty TimeoutError and a traceback per worker.
        why = unreachable(config.bootstrap, timeout=min(config.op_timeout, 5.0))
        if why is not None:
            raise WorkloadError(f"cannot reach the broker at {config.bootstrap} ({why}); is it running?")
        result = _run(config, factory, history_path, progress)
    finally:
        close = getattr(factory, "close", None)  # a client with a helper process (java) ends it
        if close is not None:
            close()
    try:
        stats = validate_history(history_path)  # a run must never leave a history the analysis rejects
    except HistoryFormatError as exc:
        # Empty when no process could open its clients (a broker refusing them): the warnings logged say why.
        raise WorkloadError(f"the workload wrote no usable history: {exc}") from exc
    if not result.caught_up:
        log.warning("final reads did not catch up on keys %s", list(result.lagging))
    return WorkloadSummary(
        history_path=history_path,
        client=config.client,
        invocations=result.invocations,
        completions={t: n for t, n in stats.by_type.items() if t != "invoke"},
        processes=stats.processes,
        keys=len(result.keys),
        final_reads_caught_up=result.caught_up,
        lagging_keys=result.lagging,
        elapsed=time.monotonic() - started,
    )


@dataclass(frozen=True)
class _Ran:
    invocations: int
    keys: tuple[int, ...]
    caught_up: bool
    lagging: tuple[int, ...]


def _run(config: WorkloadConfig, factory: ClientFactory, history_path: Path, progress: bool) -> _Ran:
    offsets = OffsetTracker()
    with HistoryWriter(history_path) as history:
        keys = KeySpace(
            KeyLayout(config.topic_prefix, config.partitions_per_topic),
            config.key_count,
            config.max_writes_per_key,
            create_topic=lambda topic, partitions: factory.create_topics([(topic, partitions)], config.op_timeout),
            record_create=lambda process, key, topic, partition: history.append(
                process, "ok", "create", [key, topic, partition]),
        )
        # Opening a worker's clients may take up to two blocking calls (init_transactions, a group join).
        budget = OpBudget(config.ops, config.duration, time.monotonic, open_grace=2 * config.op_timeout)
        bar = tqdm(total=config.ops, desc="workload", unit="op", disable=not progress, leave=False)
        bar_lock = threading.Lock()
        started_ops = Counter[str]()

        def on_op() -> None:
            with bar_lock:
                started_ops["ops"] += 1
                bar.update(1)

        workers = [Worker(i, config, factory, keys, history, budget, offsets, on_op) for i in range(config.concurrency)]
        threads = [threading.Thread(target=w.run, name=f"workload-{i}", daemon=True) for i, w in enumerate(workers)]
        try:
            for t in threads:
                t.start()
            for t in threads:
                while t.is_alive():
                    t.join(0.2)
        except KeyboardInterrupt:
            budget.stop()  # let in-flight operations complete so their outcome is recorded
            for t in threads:
                t.join()
            raise
        finally:
            bar.close()
        failed = next((w.error for w in workers if w.error is not None), None)
        if failed is not None:
            raise WorkloadError(f"the workload stopped: {str(failed) or type(failed).__name__}") from failed
        used = [p for w in workers for p in w.processes_used]
        result = final_reads(config, factory, keys, dict(offsets.highest), history, max(used) + 1)
    return _Ran(started_ops["ops"], result.keys, result.caught_up, result.lagging)
