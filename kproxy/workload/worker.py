"""One worker thread: a sequence of logical processes, each with its own real clients.

As in Jepsen, a process whose operation ended `info` (or that crashed) is
never used again: the worker tears its clients down and carries on as process
p + concurrency with fresh clients. So a process has at most one operation
in flight and every indefinite outcome is final for that process.
"""

from __future__ import annotations

import logging
import random
import threading
import time
from collections.abc import Callable
from typing import Any

from kproxy.workload.clients.base import ClientFactory, ConsumerClient, Delivery, ProducerClient, Record
from kproxy.workload.clients.guard import guarded
from kproxy.workload.config import WorkloadConfig
from kproxy.workload.errors import (
    ClientFailure,
    Outcome,
    classify_commit,
    classify_in_txn,
    classify_produce,
    classify_read,
)
from kproxy.workload.history import HistoryWriter
from kproxy.workload.keys import KeySpace
from kproxy.workload.plan import OpBudget, OpPlan, plan_op

log = logging.getLogger(__name__)


class OffsetTracker:
    """The highest offset each key is known to hold a readable record at (for the final reads)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.highest: dict[int, int] = {}

    def saw(self, key: int, offset: int) -> None:
        with self._lock:
            if offset > self.highest.get(key, -1):
                self.highest[key] = offset


def poll_map(records: list[Record], keys: KeySpace) -> dict[str, list[list[int]]]:
    """Records as the history's poll map: decimal key -> [[offset, value], ...] in read order."""
    out: dict[str, list[list[int]]] = {}
    for rec in records:
        key = keys.key_of(rec.topic, rec.partition)
        if key is None or rec.value is None:
            continue
        try:
            value = int(rec.value)
        except ValueError:
            log.warning("skipping a record that is not a workload value: %s/%d@%d", rec.topic, rec.partition, rec.offset)
            continue
        out.setdefault(str(key), []).append([rec.offset, value])
    return out


class Worker:
    def __init__(
        self,
        index: int,
        config: WorkloadConfig,
        factory: ClientFactory,
        keys: KeySpace,
        history: HistoryWriter,
        budget: OpBudget,
        offsets: OffsetTracker,
        on_op: Callable[[], None] = lambda: None,
    ) -> None:
        self.index = index
        self.config = config
        self.factory = factory
        self.keys = keys
        self.history = history
        self.budget = budget
        self.offsets = offsets
        self.on_op = on_op
        self.rng = random.Random(f"{config.seed}:{index}")
        self.process = index
        self.producer: ProducerClient | None = None
        self.consumer: ConsumerClient | None = None
        self.processes_used = [index]
        self.error: BaseException | None = None
        self._needs_read_set = True  # a new process starts by choosing what it reads
        # Set when the client library raised an error its adapter does not
        # know: this process's clients are not used for another operation.
        self._library_broke = False

    # --- lifecycle -------------------------------------------------------------

    def run(self) -> None:
        try:
            self._run()
        except BaseException as exc:  # a bug or a bad client setting: stop the run and report it
            self.error = exc
            self.budget.stop()
            log.exception("worker %d stopped", self.index)

    def _run(self) -> None:
        try:
            while self.budget.take():
                if self.consumer is None and not self._open():
                    time.sleep(0.2)  # the broker refused new clients; try again while the budget lasts
                    continue
                self.on_op()
                plan = OpPlan("assign") if self._needs_read_set else plan_op(self.rng, self.config)
                self._needs_read_set = False
                self._run_op(plan)
                if self._library_broke and self.producer is not None:
                    # The operation finished (an offset commit after a poll,
                    # a rewind after an abort broke): still start afresh.
                    self._retire()
        finally:
            self._teardown(clean=True)

    def _open(self) -> bool:
        cid = f"{self.config.topic_prefix}-p{self.process}"
        txn_id = self.config.transactional_id(self.index) if self.config.txn else None
        self._library_broke = False
        try:
            # Building a client is not guarded: a setting the library refuses stops the run.
            self.producer = guarded(self.factory.producer(cid, txn_id), self._broke)
            if self.config.txn:
                self.producer.init_transactions(self.config.op_timeout)
            self.consumer = guarded(self.factory.consumer(cid, self.config.consumer_group), self._broke)
        except ClientFailure as exc:
            log.warning("process %d could not open its clients: %s", self.process, exc)
            self._teardown(clean=False)
            return False
        self.budget.opened()
        self._needs_read_set = True
        return True

    def _broke(self) -> None:
        self._library_broke = True

    def _teardown(self, clean: bool) -> None:
        timeout = self.config.op_timeout if clean else 0.0
        for client in (self.producer, self.consumer):
            if client is not None:
                try:
                    client.close(clean, timeout)
                except ClientFailure as exc:
                    log.debug("close of process %d failed: %s", self.process, exc)
        self.producer = self.consumer = None

    def _retire(self) -> None:
        """This process is done for (crashed or left an unknown outcome): the next one takes over."""
        self._teardown(clean=False)
        self.process += self.config.concurrency
        self.processes_used.append(self.process)

    def _complete(self, outcome_type: str, f: str, value: Any, error: str | None = None) -> None:
        self.history.append(self.process, outcome_type, f, value, error)
        if outcome_type == "info":
            self._retire()

    # --- operations ------------------------------------------------------------

    def _run_op(self, plan: OpPlan) -> None:
        if plan.kind == "crash":
            self.history.append(self.process, "invoke", "crash", None)
            self._complete("info", "crash", None)
        elif plan.kind == "assign":
            self._assign()
        elif plan.kind == "send":
            self._send(len(plan.micro_ops))
        elif plan.kind == "poll":
            self._poll()
        else:
            self._txn(plan)

    def _assign(self) -> None:
        f = "subscribe" if self.config.subscribe else "assign"
        read_keys = self.keys.read_set(self.rng, self.process)
        self.history.append(self.process, "invoke", f, read_keys)
        assert self.consumer is not None
        try:
            if self.config.subscribe:
                topics = sorted({self.keys.topic_partition(k)[0] for k in read_keys})
                self.consumer.subscribe(topics)
            else:
                self.consumer.assign([self.keys.topic_partition(k) for k in read_keys])
        except ClientFailure as exc:
            outcome = classify_read(exc)
            self._complete(outcome.type, f, read_keys, outcome.error)
            return
        self._complete("ok", f, read_keys)

    def _new_sends(self, count: int) -> list[tuple[int, int]]:
        return [self.keys.next_send(self.rng, self.process) for _ in range(count)]

    def _produce(self, key: int, value: int) -> Delivery:
        assert self.producer is not None
        topic, partition = self.keys.topic_partition(key)
        return self.producer.send(topic, partition, str(key).encode(), str(value).encode())

    def _send(self, count: int) -> None:
        sends = self._new_sends(count)
        self.history.append(self.process, "invoke", "send", [["send", k, v] for k, v in sends])
        assert self.producer is not None
        deliveries: list[Delivery | ClientFailure] = []
        for k, v in sends:
            try:
                deliveries.append(self._produce(k, v))
            except ClientFailure as exc:
                deliveries.append(exc)
        try:
            self.producer.flush(self.config.op_timeout)
        except ClientFailure as exc:
            # The library broke while waiting for delivery reports: whatever
            # they said, this client's word on these sends is worthless.
            value = [["send", k, v] for k, v in sends]
            self._complete("info", "send", value, classify_produce(exc).error)
            return
        outcomes: list[Outcome | None] = []  # None: ok
        value = []
        for (k, v), d in zip(sends, deliveries):
            if isinstance(d, ClientFailure):
                outcomes.append(classify_produce(d))
            elif not d.done:
                outcomes.append(Outcome("info", "timeout"))
            elif d.failure is not None:
                outcomes.append(classify_produce(d.failure))
            else:
                outcomes.append(None)
            offset = d.offset if isinstance(d, Delivery) and d.done and d.failure is None else None
            if offset is not None:
                value.append(["send", k, [offset, v]])
                self.offsets.saw(k, offset)
            else:
                value.append(["send", k, v])
        failures = [o for o in outcomes if o is not None]
        if not failures:
            self._complete("ok", "send", value)
        elif len(failures) == len(outcomes) and all(o.type == "fail" for o in failures):
            self._complete("fail", "send", value, failures[0].error)
        else:  # some sends may have landed: the operation as a whole is unknown
            error = next((o.error for o in failures if o.type == "info"), failures[0].error)
            self._complete("info", "send", value, error)

    def _poll_once(self) -> dict[str, list[list[int]]]:
        assert self.consumer is not None
        records = self.consumer.poll(self.config.max_poll_records, self.config.poll_timeout)
        polled = poll_map(records, self.keys)
        for key, pairs in polled.items():
            for offset, _ in pairs:
                self.offsets.saw(int(key), offset)
        return polled

    def _poll(self) -> None:
        self.history.append(self.process, "invoke", "poll", [["poll"]])
        assert self.consumer is not None
        try:
            polled = self._poll_once()
        except ClientFailure as exc:
            outcome = classify_read(exc)
            self._complete(outcome.type, "poll", [["poll"]], outcome.error)
            return
        self._complete("ok", "poll", [["poll", polled]])
        # Manual commit of what was read; its failure does not change what the poll saw.
        try:
            self.consumer.commit(self.consumer.positions(), self.config.op_timeout)
        except ClientFailure as exc:
            log.info("process %d: offset commit after poll failed: %s", self.process, exc)

    def _txn(self, plan: OpPlan) -> None:
        invoke_value: list[list[Any]] = []
        for mop in plan.micro_ops:
            if mop == "send":
                k, v = self.keys.next_send(self.rng, self.process)
                invoke_value.append(["send", k, v])
            else:
                invoke_value.append(["poll"])
        self.history.append(self.process, "invoke", "txn", invoke_value)
        producer, consumer = self.producer, self.consumer
        assert producer is not None and consumer is not None
        timeout = self.config.op_timeout
        results: list[Delivery | dict[str, list[list[int]]] | None] = [None] * len(invoke_value)
        polled_any = False

        def completion_value() -> list[list[Any]]:
            out: list[list[Any]] = []
            for mop, result in zip(invoke_value, results):
                if mop[0] == "send":
                    d = result
                    if isinstance(d, Delivery) and d.done and d.failure is None and d.offset is not None:
                        out.append(["send", mop[1], [d.offset, mop[2]]])
                    else:
                        out.append(list(mop))
                else:
                    out.append(["poll", result] if isinstance(result, dict) else ["poll"])
            return out

        def abort() -> bool:
            try:
                producer.abort_transaction(timeout)
            except ClientFailure as exc:
                log.info("process %d: abort failed: %s", self.process, exc)
                return False
            if self.config.rewind_on_abort:
                self._rewind_to_committed()
            return True

        try:
            producer.begin_transaction()
            for i, mop in enumerate(invoke_value):
                if mop[0] == "send":
                    results[i] = self._produce(mop[1], mop[2])
                else:
                    results[i] = self._poll_once()
                    polled_any = True
            if polled_any:
                positions = consumer.positions()
                if positions:
                    producer.send_offsets_to_transaction(positions, consumer, timeout)
        except ClientFailure as exc:
            aborted = abort()
            outcome = classify_in_txn(exc, aborted)
            self._complete(outcome.type, "txn", completion_value(), outcome.error)
            return

        if plan.abort:
            try:
                producer.flush(timeout)  # learn the offsets of records that are about to be aborted
            except ClientFailure as exc:
                aborted = abort()
                outcome = classify_in_txn(exc, aborted)
                self._complete(outcome.type, "txn", completion_value(), outcome.error)
                return
            if abort():
                self._complete("fail", "txn", completion_value(), "aborted")
            else:
                self._complete("info", "txn", completion_value(), "abort-failed")
            return

        deadline = time.monotonic() + timeout
        while True:
            try:
                producer.commit_transaction(max(0.1, deadline - time.monotonic()))
                break
            except ClientFailure as exc:
                if exc.retriable and not exc.txn_requires_abort and not exc.fatal and time.monotonic() < deadline:
                    continue  # librdkafka resumes an interrupted commit when called again
                aborted = abort() if exc.txn_requires_abort else False
                outcome = classify_commit(exc, aborted)
                self._complete(outcome.type, "txn", completion_value(), outcome.error)
                return
        value = completion_value()
        for mop in value:
            if mop[0] == "send" and isinstance(mop[2], list):
                self.offsets.saw(mop[1], mop[2][0])
        self._complete("ok", "txn", value)

    def _rewind_to_committed(self) -> None:
        """Seek back to the group's committed offsets (the position the aborted txn did not commit)."""
        assert self.consumer is not None
        try:
            assigned = self.consumer.assignment()
            if not assigned:
                return
            committed = self.consumer.committed(assigned, self.config.op_timeout)
            start = {tp: (off if off is not None else 0) for tp, off in committed.items()}
            if self.config.subscribe:
                for tp, off in start.items():
                    self.consumer.seek(tp, off)
            else:
                self.consumer.assign(assigned, start)
        except ClientFailure as exc:
            log.info("process %d: rewind after abort failed: %s", self.process, exc)
