"""Folding an idle consumer's repeated empty Fetch exchanges into one traced exchange with a count.

A broker that answers an empty Fetch at once (noida-db, docs/brokers.md)
makes an idle consumer poll it thousands of times a second, and every one
of those exchanges is traced the same but for its correlation id and times.
The writer keeps the first as it is and folds the identical ones that follow
on its connection into a count; the fold is written as one request event and
one response event that carry `repeats` (how many exchanges they stand for),
the first folded exchange's times and correlation id, and every folded
exchange's latencies (docs/traces.md, "Idle Fetch exchanges, folded").

Sans-IO: rows in, rows out (lists in trace_schema.EVENT order, their
partitions resolved). `take(row)` returns the rows to write now, in order;
`flush()` everything held back. What it holds back is bounded by the
writer's flush interval: the writer flushes before every batch it writes.
"""

from __future__ import annotations

from typing import Any

from kproxy.obs.trace_schema import FIELD_NAMES

_I = {name: FIELD_NAMES.index(name) for name in FIELD_NAMES}
_WALL, _MONO, _CONN, _DIRECTION, _API = _I["wall_time"], _I["mono_ns"], _I["conn_id"], _I["direction"], _I["api"]
_CORRELATION, _PARTITIONS = _I["correlation_id"], _I["partitions"]
_LATENCY, _UPSTREAM_LATENCY = _I["latency_ms"], _I["upstream_latency_ms"]
_REPEATS, _FIRST_WALL, _FIRST_MONO, _FIRST_CORRELATION = (
    _I["repeats"], _I["first_wall_time"], _I["first_mono_ns"], _I["first_correlation_id"])
_LATENCIES, _UPSTREAM_LATENCIES = _I["repeat_latencies_ms"], _I["repeat_upstream_latencies_ms"]

# What may differ between two exchanges folded together (partitions: their order; see _canonical).
_REQUEST_FREE = (_WALL, _MONO, _CORRELATION)
_RESPONSE_FREE = (*_REQUEST_FREE, _LATENCY, _UPSTREAM_LATENCY)
# A fault rule, a hazard, a copy or a rewrite touched the exchange: such a one is never folded.
_UNTOUCHED = ((_I["rule"], None), (_I["action"], None), (_I["hazard"], None), (_I["outcome"], "delivered"),
              (_I["copy"], 0), (_I["upstream_partitions"], None))
_INT32_MAX = 2**31 - 1


def _untouched(row: list) -> bool:
    return all(row[i] == value for i, value in _UNTOUCHED) and row[_CONN] is not None and row[_CONN] >= 0


def _record_free(partitions: list[dict[str, Any]]) -> bool:
    return all(not p.get("batches") and not p.get("records") and p.get("records_file") is None for p in partitions)


def _canonical(row: list, free: tuple[int, ...]) -> list:
    """The row as compared: the fields that may differ blanked, the partitions in (topic, partition) order.

    A client may list the same partitions in another order each time
    (librdkafka rotates where its Fetch starts, for fairness); the analysis
    reads partitions as a set, so the order is not a difference worth an event.
    """
    key = list(row)
    for i in free:
        key[i] = None
    key[_PARTITIONS] = sorted(row[_PARTITIONS], key=lambda p: (p.get("topic") or "", p.get("partition") or 0))
    return key


class _Fold:
    """Exchanges folded so far: the first's and last's rows and every one's latencies."""

    __slots__ = ("first_request", "first_response", "last_request", "last_response", "latencies", "upstream")

    def __init__(self, request: list, response: list) -> None:
        self.first_request = self.last_request = request
        self.first_response = self.last_response = response
        self.latencies = [response[_LATENCY]]
        self.upstream = [response[_UPSTREAM_LATENCY]]

    def add(self, request: list, response: list) -> None:
        self.last_request, self.last_response = request, response
        self.latencies.append(response[_LATENCY])
        self.upstream.append(response[_UPSTREAM_LATENCY])

    def rows(self) -> list[list]:
        """One exchange as itself; more as the last one's pair, stamped with the count and the first's times."""
        if len(self.latencies) == 1:
            return [self.last_request, self.last_response]
        request, response = list(self.last_request), list(self.last_response)
        for row, first in ((request, self.first_request), (response, self.first_response)):
            row[_REPEATS] = len(self.latencies)
            row[_FIRST_WALL], row[_FIRST_MONO], row[_FIRST_CORRELATION] = first[_WALL], first[_MONO], first[_CORRELATION]
        response[_LATENCIES] = self.latencies
        # A request forwarded on arrival has its upstream latency equal to its latency: not written twice.
        response[_UPSTREAM_LATENCIES] = None if self.upstream == self.latencies else self.upstream
        return [request, response]


class _Connection:
    """One connection's Fetch exchanges as the folder sees them."""

    __slots__ = ("request_key", "response_key", "last_correlation", "answering", "held", "fold")

    def __init__(self) -> None:
        self.request_key: list | None = None  # the connection's last Fetch request, compared
        # Its answer, compared, once it answered a request like request_key untouched and
        # record-free: from then on, identical exchanges fold.
        self.response_key: list | None = None
        self.last_correlation: int | None = None  # of the last Fetch request seen
        self.answering: int | None = None  # the Fetch request written as itself whose answer may become the base
        self.held: list | None = None  # a request like the base's, waiting for its answer to fold with it
        self.fold: _Fold | None = None


class IdleFetchFolder:
    """Folds consecutive identical record-free Fetch exchanges of a connection (see the module docstring)."""

    def __init__(self) -> None:
        self._connections: dict[int, _Connection] = {}
        self._holding: set[_Connection] = set()  # connections that hold rows back

    @property
    def pending(self) -> bool:
        """Whether rows are held back (a fold, or a request waiting for its answer)."""
        return bool(self._holding)

    def take(self, row: list) -> list[list]:
        """The rows to write now for `row`, in order: none while it is being folded."""
        conn_id = row[_CONN]
        if conn_id is None:
            return [row]
        connection = self._connections.get(conn_id)
        direction = row[_DIRECTION]
        if row[_API] != "fetch" or direction not in ("request", "response"):
            out = self.passing(conn_id, direction)
            out.append(row)
            return out
        if connection is None:
            connection = self._connections[conn_id] = _Connection()
        if direction == "request":
            return self._request(connection, row)
        return self._response(connection, row)

    def passing(self, conn_id: int | None, direction: str | None) -> list[list]:
        """An event that is no Fetch passes on `conn_id`: the rows it must follow (a close ends the connection)."""
        connection = self._connections.pop(conn_id, None) if direction == "close" else self._connections.get(conn_id)
        return self._release(connection, [])

    def flush(self) -> list[list]:
        """Every row held back, in the order they happened per connection (the writer flushes before each batch)."""
        out: list[list] = []
        for connection in list(self._holding):
            out += self._release(connection, [])
        return out

    def _request(self, c: _Connection, row: list) -> list[list]:
        clean = _untouched(row) and isinstance(row[_PARTITIONS], list)
        correlation = row[_CORRELATION]
        follows = (c.last_correlation is not None and correlation == c.last_correlation + 1
                   and correlation <= _INT32_MAX)
        c.last_correlation = correlation
        key = _canonical(row, _REQUEST_FREE) if clean else None
        if clean and follows and c.held is None and c.response_key is not None and key == c.request_key:
            c.held = row
            self._holding.add(c)
            return []
        out = self._release(c, [])
        out.append(row)
        c.request_key, c.response_key = key, None
        c.answering = correlation if clean else None
        return out

    def _response(self, c: _Connection, row: list) -> list[list]:
        partitions = row[_PARTITIONS]
        clean = _untouched(row) and isinstance(partitions, list) and _record_free(partitions)
        key = _canonical(row, _RESPONSE_FREE) if clean else None
        held = c.held
        if held is not None and clean and row[_CORRELATION] == held[_CORRELATION] and key == c.response_key:
            c.held = None
            if c.fold is None:
                c.fold = _Fold(held, row)
            else:
                c.fold.add(held, row)
            return []
        out = self._release(c, [])
        out.append(row)
        answers_base = clean and c.request_key is not None and row[_CORRELATION] == c.answering
        c.response_key = key if answers_base else None
        c.answering = None
        return out

    def _release(self, c: _Connection | None, out: list[list]) -> list[list]:
        """Write out what the connection holds back, before `out`'s rows (which follow it on the connection)."""
        if c is None or c not in self._holding:
            return out
        self._holding.discard(c)
        rows: list[list] = []
        if c.fold is not None:
            rows += c.fold.rows()
            c.fold = None
        if c.held is not None:
            rows.append(c.held)
            c.answering = c.held[_CORRELATION]
            c.held = None
        rows += out
        out[:] = rows
        return out
