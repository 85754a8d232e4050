"""franz-go (`--client franz-go`), the Go client that speaks transaction version 2 (KIP-890 part 2).

A small Go program (go_bridge/franzgo/, built once per machine by
kproxy.workload.clients.go_build) serves a run's clients over the bridge
protocol of kproxy.workload.clients.bridge, with the bridges' defaults.
Settings use the Java client's dotted names; the program maps each to
franz-go's option and refuses any it has none for (docs/workload.md, "The Go
clients"); `max.block.ms` bounds the calls that take a context.
"""

from __future__ import annotations

from kproxy.workload.clients.go_build import GoBridgeFactory


class FranzGoFactory(GoBridgeFactory):
    name = "franz-go"
