"""Stage: synthetic transaction numbers, on arrival, on delivery and from the answer.

On arrival a transactional request gets its client-side number (a batched
AddPartitionsToTxn carries several producers, each with its own number). On
delivery it gets the broker-side one; a request whose two numbers differ is a
hazard, which guard mode refuses to deliver. The broker's answer tells the
tracker what it learnt (a new producer id, a fence). The numbering rules
themselves live in kproxy.txn.
"""

from __future__ import annotations

import logging
from typing import Any

from kproxy.obs import metrics
from kproxy.pipeline.exchange import Exchange
from kproxy.protocol import apis
from kproxy.txn.events import Hazard
from kproxy.txn.extract import response_update, txn_requests
from kproxy.txn.tracker import TxnTracker

log = logging.getLogger("kproxy.pipeline")

# Hazards guard mode refuses: the request would commit, abort or write into the wrong transaction.
REFUSED_HAZARDS = ("stale_end_txn", "late_produce")
# How often (seconds) the transactions-opened counters move: the stats walk every producer.
STATS_INTERVAL = 0.25


class Numbering:
    def __init__(self, tracker: TxnTracker) -> None:
        self.tracker = tracker
        self._opened_seen = (0, 0)
        self._stats_at = float("-inf")

    def on_arrival(self, ex: Exchange, body: Any) -> None:
        ex.txn = txn_requests(ex.api_key, body)
        ex.txn_numbers = tuple(self.tracker.on_request(txn) for txn in ex.txn)
        if ex.txn_numbers:
            ex.txn_client = ex.txn_numbers[0]

    def refusal(self, ex: Exchange) -> Hazard | None:
        """The hazard guard mode refuses this delivery for, if any."""
        tracker = self.tracker
        for txn, number in zip(ex.txn, ex.txn_numbers):
            hazard = tracker.check_delivery(txn, number)
            if hazard is not None and hazard.kind in REFUSED_HAZARDS:
                return hazard
        return None

    def refused(self, ex: Exchange, hazard: Hazard) -> None:
        metrics.guard_refusals.labels(hazard.kind).inc()
        ex.outcome = "refused"
        ex.hazard = hazard
        log.warning(
            "guard refused %s for %s: client txn %d would land in broker txn %d",
            apis.api_name(ex.api_key), ex.txn[0].transactional_id, hazard.client_number, hazard.broker_number,
        )

    def on_delivery(self, ex: Exchange, now: float) -> None:
        tracker = self.tracker
        for txn, number in zip(ex.txn, ex.txn_numbers):
            delivery = tracker.on_delivery(txn, number)
            if ex.txn_broker is None:
                ex.txn_broker = delivery.broker_number
            if delivery.hazard is not None and ex.hazard is None:
                ex.hazard = delivery.hazard
                metrics.txn_hazards.labels(delivery.hazard.kind).inc()
                log.warning(
                    "hazard %s: %s %s (client txn %d delivered into broker txn %d)%s",
                    delivery.hazard.kind, apis.api_name(ex.api_key), txn.transactional_id,
                    delivery.hazard.client_number, delivery.hazard.broker_number,
                    f" under rule {ex.decision.rule_id!r}" if ex.decision is not None else "",
                )
            if txn.kind == "end_txn":
                metrics.txn_ended.labels("commit" if txn.committed else "abort").inc()
        if ex.txn:
            self.publish_stats(now)

    def on_answer(self, ex: Exchange, decoded: Any, now: float) -> None:
        if not ex.txn:
            return
        for txn in ex.txn:
            update = response_update(ex.api_key, txn, decoded)
            if update is not None:
                self.tracker.on_response(txn, update)
        self.publish_stats(now)

    def publish_stats(self, now: float) -> None:
        """Move the transactions-opened counters, at most every STATS_INTERVAL."""
        if now - self._stats_at < STATS_INTERVAL:
            return
        self._stats_at = now
        self.flush_stats()

    def flush_stats(self) -> None:
        stats = self.tracker.stats()
        client, broker = self._opened_seen
        metrics.txn_started.labels("client").inc(stats.opened_client - client)
        metrics.txn_started.labels("broker").inc(stats.opened_broker - broker)
        self._opened_seen = (stats.opened_client, stats.opened_broker)
