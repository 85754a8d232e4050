"""The final reads: after the workers stop, read every key from offset 0.

A fresh consumer (new process number, a group of its own so no committed
offset applies) assigns every key's partition at offset 0 and polls until its
position has passed the highest offset known to hold a readable record
(acknowledged sends and records polled during the run), then keeps polling
until a poll comes back empty, so records written by sends of unknown outcome
are read too. It gives up after the configured timeout; keys not caught up
are reported in the summary. Records sent in transactions that were aborted
are not waited for: a correct read_committed consumer never returns them.
"""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass

from kproxy.workload.clients.base import ClientFactory
from kproxy.workload.config import WorkloadConfig
from kproxy.workload.errors import ClientFailure
from kproxy.workload.history import HistoryWriter
from kproxy.workload.keys import KeySpace
from kproxy.workload.worker import poll_map

log = logging.getLogger(__name__)

FINAL_POLL_TIMEOUT = 0.5  # seconds; longer than a workload poll, the reader has nothing else to do


@dataclass(frozen=True)
class FinalReadsResult:
    process: int
    keys: tuple[int, ...]
    caught_up: bool
    lagging: tuple[int, ...]  # keys whose known records were not all read back in time


def final_reads(
    config: WorkloadConfig,
    factory: ClientFactory,
    keys: KeySpace,
    highest: dict[int, int],
    history: HistoryWriter,
    process: int,
) -> FinalReadsResult:
    known = keys.known_keys()
    all_keys = sorted(known)
    if not all_keys:
        return FinalReadsResult(process, (), True, ())
    targets = {known[k]: highest[k] + 1 for k in all_keys if k in highest}
    consumer = factory.consumer(f"{config.topic_prefix}-final-p{process}", f"{config.consumer_group}-final-{process}")
    deadline = time.monotonic() + config.final_reads_timeout
    try:
        history.append(process, "invoke", "assign", all_keys)
        try:
            consumer.assign([known[k] for k in all_keys], {known[k]: 0 for k in all_keys})
        except ClientFailure as exc:
            history.append(process, "fail", "assign", all_keys, exc.name)
            return FinalReadsResult(process, tuple(all_keys), False, tuple(sorted(highest)))
        history.append(process, "ok", "assign", all_keys)
        reached: dict[tuple[str, int], int] = {}
        while time.monotonic() < deadline:
            history.append(process, "invoke", "poll", [["poll"]])
            try:
                records = consumer.poll(config.max_poll_records, FINAL_POLL_TIMEOUT)
            except ClientFailure as exc:
                history.append(process, "fail", "poll", [["poll"]], exc.name)
                continue
            history.append(process, "ok", "poll", [["poll", poll_map(records, keys)]])
            for rec in records:
                tp = (rec.topic, rec.partition)
                reached[tp] = max(reached.get(tp, 0), rec.offset + 1)
            caught_up = all(reached.get(tp, 0) >= target for tp, target in targets.items())
            if caught_up and not records:
                break
        lagging = tuple(k for k in all_keys if known[k] in targets and reached.get(known[k], 0) < targets[known[k]])
        return FinalReadsResult(process, tuple(all_keys), not lagging, lagging)
    finally:
        consumer.close(True, config.op_timeout)
