"""The one shape of a wire check, and of a wire statistic.

A check reads the shared views (kproxy_spark.wire.views.WireViews) and
returns its cases as a DataFrame, one row per case; the driver renders each
case's sentence from the case's own fields (``explain``) after the one
collect. kproxy_spark.wire.registry lists every entry; the lists other
modules need (order, informational classes, attribution tables) are derived
from it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from pyspark.sql import DataFrame

    from kproxy_spark.wire.views import WireViews

#: Severities: an error case makes the history invalid; an informational
#: one explains (a cause on the wire, or behaviour Kafka allows).
ERROR, INFO = "error", "info"

#: A check whose cases name their cause in their own ``rules`` (the stale
#: EndTxn, the late or erroring Produce a rule acted on). Any other `cause`
#: is a broker diagnosis (kproxy_spark.wire.diagnoses): the broker's own
#: doing unless the case's ``rules`` name a rule whose rewrite made it so.
BY_RULES = "rules"

#: How a table's rows are ordered in the report: (field, nulls last?) pairs.
Order = tuple[tuple[str, bool], ...]


@dataclass(frozen=True)
class WireCheck:
    """One wire anomaly class.

    name: the anomaly's name in the report; severity: ERROR or INFO;
    order: how its cases are listed; cases: views -> one row per case;
    cause: BY_RULES or the broker diagnosis its cases are;
    explain: a case (a dict of its row) -> its sentence, on the driver;
    needs: the request APIs without which it can have no case (see `built`).
    The registry's order is the order the report tells the checks in.
    """

    name: str
    severity: str
    order: Order
    cases: Callable[[WireViews], DataFrame]
    cause: str
    explain: Callable[[dict[str, Any]], str]
    needs: tuple[str, ...] = ()

    #: Where a case's sentence goes.
    text_field = "explanation"

    def frame(self, views: WireViews) -> DataFrame | None:
        return self.cases(views) if built(self.needs, views) else None


@dataclass(frozen=True)
class WireTable:
    """A statistic, or rows the driver reads to attribute cases (names
    starting with ``~``), computed in the same job as the checks.

    explain, when given, renders `text_field` of each row on the driver;
    stat, when given, is the report.json stats key the report moves the
    table to (kproxy_spark.report.STATS_TABLES).
    """

    name: str
    order: Order
    rows: Callable[[WireViews], DataFrame]
    explain: Callable[[dict[str, Any]], Any] | None = None
    text_field: str = "explanation"
    stat: str | None = None
    needs: tuple[str, ...] = ()

    def frame(self, views: WireViews) -> DataFrame | None:
        return self.rows(views) if built(self.needs, views) else None


def built(needs: tuple[str, ...], views: WireViews) -> bool:
    """Whether an entry that reads requests of the APIs `needs` is built for
    these traces: one whose trace holds none of them has nothing to find, and
    planning its joins over nothing still costs the driver a second or more
    (the exactly-once check's twenty-odd joins and windows on a trace
    without a TxnOffsetCommit)."""
    return not needs or not views.request_apis.isdisjoint(needs)
