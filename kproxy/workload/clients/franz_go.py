"""franz-go (`--client franz-go`), the Go client that speaks transaction version 2 (KIP-890 part 2).

A small Go program (go_bridge/franzgo/, built once per machine by
kproxy.workload.clients.go_build) serves a run's clients over the bridge
protocol of kproxy.workload.clients.bridge. Settings use the Java client's
dotted names; the program maps each to franz-go's option and refuses any it
has none for (docs/workload.md, "The Go clients").
"""

from __future__ import annotations

from kproxy.workload.clients.go_build import GoBridgeFactory

PRODUCER_DEFAULTS: dict[str, object] = {
    "acks": "all",
    "enable.idempotence": True,
    "request.timeout.ms": 5000,
    "delivery.timeout.ms": 10000,
    "transaction.timeout.ms": 15000,
    # Bounds InitProducerId, EndTxn and the offsets of a transaction, as the Java client's max.block.ms.
    "max.block.ms": 5000,
}
CONSUMER_DEFAULTS: dict[str, object] = {
    "isolation.level": "read_committed",
    "auto.offset.reset": "earliest",
    "enable.auto.commit": False,
}


class FranzGoFactory(GoBridgeFactory):
    name = "franz-go"
    producer_defaults = PRODUCER_DEFAULTS
    consumer_defaults = CONSUMER_DEFAULTS
