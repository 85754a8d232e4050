"""IBM/sarama (`--client sarama`), a Go client without transaction version 2 (its EndTxn stops at v3).

A small Go program (go_bridge/sarama/, built once per machine by
kproxy.workload.clients.go_build) serves a run's clients over the bridge
protocol of kproxy.workload.clients.bridge. Settings use the Java client's
dotted names; the program maps each to sarama's Config field and refuses any
it has none for (docs/workload.md, "The Go clients").
"""

from __future__ import annotations

from kproxy.workload.clients.go_build import GoBridgeFactory

PRODUCER_DEFAULTS: dict[str, object] = {
    "acks": "all",
    "enable.idempotence": True,
    "request.timeout.ms": 5000,
    "transaction.timeout.ms": 15000,
}
CONSUMER_DEFAULTS: dict[str, object] = {
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
}


class SaramaFactory(GoBridgeFactory):
    name = "sarama"
    producer_defaults = PRODUCER_DEFAULTS
    consumer_defaults = CONSUMER_DEFAULTS
