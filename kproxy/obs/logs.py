"""Logging set-up: plain text for people, JSON lines for machines."""

from __future__ import annotations

import logging
import sys
import time
from collections.abc import Callable, Hashable

import orjson


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "time": record.created,
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        if record.exc_info:
            entry["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(entry).decode()


def setup_logging(level: str = "info", fmt: str = "text") -> None:
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)-7s %(name)s: %(message)s"))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    # hypercorn logs every admin request at info; keep it for debugging only.
    logging.getLogger("hypercorn.access").setLevel(logging.WARNING)
    # At descriptor exhaustion trio's accept loop (the admin API's) logs an error
    # with a traceback every 0.1 s: one line per interval, with a count, says as much.
    logging.getLogger("trio.serve_listeners").addFilter(OncePerInterval())


# How often one cause of a repeated warning or error may log a line.
REPORT_INTERVAL_SECONDS = 10.0


class LogEvery:
    """One line per cause per interval, carrying the count of the lines it stands for.

    A cause is any hashable key (a broker, a message template). Callers ask
    `due(key)`: None means "counted, stay quiet"; a number means "log now",
    and is how many occurrences were kept quiet since the last line.
    Keys are causes, not clients, so the table stays small.
    """

    def __init__(self, interval: float = REPORT_INTERVAL_SECONDS, clock: Callable[[], float] = time.monotonic) -> None:
        self.interval = interval
        self.clock = clock
        self._causes: dict[Hashable, list[float | int]] = {}  # key -> [logged at, kept quiet since]

    def due(self, key: Hashable) -> int | None:
        now = self.clock()
        cause = self._causes.get(key)
        if cause is None or now - cause[0] >= self.interval:
            quiet = 0 if cause is None else int(cause[1])
            self._causes[key] = [now, 0]
            return quiet
        cause[1] += 1
        return None

    def suffix(self, quiet: int) -> str:
        return f" ({quiet} more since the last report; at most one a {self.interval:g} s)" if quiet else ""


class OncePerInterval(logging.Filter):
    """A logging filter that lets one record per logger and message template through per
    interval, with the count of the others, and drops the traceback: for libraries that
    log the same error in a loop (trio's accept loop at descriptor exhaustion logs one
    with a traceback every 0.1 s)."""

    def __init__(self, every: LogEvery | None = None) -> None:
        super().__init__()
        self.every = every or LogEvery()

    def filter(self, record: logging.LogRecord) -> bool:
        quiet = self.every.due((record.name, record.msg))
        if quiet is None:
            return False
        if record.exc_info and record.exc_info[1] is not None:
            detail = f"{type(record.exc_info[1]).__name__}: {record.exc_info[1]}".replace("%", "%%")
            record.msg = f"{record.msg}: {detail}"
        record.exc_info, record.exc_text = None, None
        record.msg = f"{record.msg}{self.every.suffix(quiet)}"
        return True
