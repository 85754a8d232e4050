"""IBM/sarama (`--client sarama`), a Go client without transaction version 2 (its EndTxn stops at v3).

A small Go program (go_bridge/sarama/, built once per machine by
kproxy.workload.clients.go_build) serves a run's clients over the bridge
protocol of kproxy.workload.clients.bridge. Settings use the Java client's
dotted names; the program maps each to sarama's Config field and refuses any
it has none for (docs/workload.md, "The Go clients").
"""

from __future__ import annotations

from types import MappingProxyType

from kproxy.workload.clients.bridge import PRODUCER_DEFAULTS
from kproxy.workload.clients.go_build import GoBridgeFactory


class SaramaFactory(GoBridgeFactory):
    name = "sarama"
    # Sarama has no delivery timeout and its transactional calls take none.
    producer_defaults = MappingProxyType({k: v for k, v in PRODUCER_DEFAULTS.items()
                                          if k not in ("delivery.timeout.ms", "max.block.ms")})
