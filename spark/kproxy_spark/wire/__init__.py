"""Wire correlation: set what crossed the proxy beside what the clients believed.

Every wire check has one shape (kproxy_spark.wire.check.WireCheck): it
reads the shared views (kproxy_spark.wire.views) and returns its cases, one
row each, and the driver renders each case's sentence from its fields.
kproxy_spark.wire.registry lists them all, with the statistics computed
beside them; `wire_frame` unions every check's cases and every table into
one frame, collected in one job and read back by `read_wire_rows`
(kproxy_spark.wire.frame).

Modules: views (the shared frames), check (the shapes), registry (the
lists), transactions / produce / fetch (the checks by family), diagnoses
(the broker diagnoses, one row each), facts (per value, for
kproxy_spark.attribution), stats (latency, rule touches, clock offset,
...), phrases (the sentences' pieces), frame (one frame, one collect).
Every case carries `rules`: the fault rules its explanation points at.
docs/analysis.md describes each anomaly.
"""

from __future__ import annotations

from kproxy_spark.wire.check import WireCheck, WireTable
from kproxy_spark.wire.frame import read_wire_rows, wire_frame
from kproxy_spark.wire.registry import (
           INFORMATIONAL,
           TELLING_ORDER,
           WIRE_CHECKS,
           WIRE_ORDER,
           WIRE_TABLES,
)
from kproxy_spark.wire.views import WireViews, history_sends, wire_views

__all__ = ["INFORMATIONAL", "TELLING_ORDER", "WIRE_CHECKS", "WIRE_ORDER", "WIRE_TABLES", "WireCheck", "WireTable",
           "WireViews", "history_sends", "read_wire_rows", "wire_frame", "wire_views"]
