"""The engine process (`kproxy engine start` runs `python -m kproxy.engine.server`).

It holds one Spark session, warms it with one small analysis (the first
analysis in a fresh JVM takes two to three times as long as the next), and
then answers requests on its socket one at a time: `analyze` (the arguments
of kproxy_spark.jobs.analyze; progress lines stream back, then the report or
the error), `status` and `stop`. Analyses run one after another because a
session's shuffle settings are sized per input (kproxy_spark.session).
After `--idle-stop` minutes without a request it stops by itself.
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import threading
import time
from multiprocessing.connection import Client, Connection, Listener
from pathlib import Path
from typing import Any

from kproxy.engine.place import Place, default_place
from kproxy.engine.warm_up import warm_up

log = logging.getLogger("kproxy.engine")


class Engine:
    """`spark`: a session to serve instead of one of its own (a test session's, which it neither warms
    nor stops); `kproxy engine start` gives none."""

    def __init__(self, place: Place, master: str, idle_stop_s: float, conf: dict[str, str], spark: Any = None) -> None:
        self.place = place
        self.master = master
        self.idle_stop_s = idle_stop_s
        self.conf = conf
        self.spark: Any = spark
        self.owns_spark = spark is None
        self.started = time.time()
        self.analyses = 0
        self.last_request = time.monotonic()
        self.busy = False
        self.stopping = False
        self.state: dict[str, Any] = {}

    def publish(self, **changes: Any) -> None:
        self.state.update(changes)
        self.place.write_state(self.state)

    def warm(self) -> float:
        """Start Spark and run one small analysis of a synthetic history and its traces; seconds taken."""
        from kproxy_spark.session import get_session

        begun = time.monotonic()
        if not self.owns_spark:
            return 0.0
        # The optimising JIT: an engine is for loops. Eight analyses of the recorded Tansu run through it took
        # 8.6 s falling to 5.6 s; on the quick tier 7.2-8.2 s each, no faster by the eighth
        # (docs/performance-analysis.md, "The fixed cost of a small analysis").
        self.spark = get_session(self.master, conf=self.conf, quick_start=False)
        warm_up(self.spark)
        return time.monotonic() - begun

    def status(self) -> dict[str, Any]:
        """What `kproxy engine status` shows; asking does not count as use."""
        return {**self.state, "busy": self.busy, "analyses": self.analyses,
                "idle_s": round(time.monotonic() - self.last_request, 1)}

    def answer(self, conn: Connection) -> None:
        request = conn.recv()
        op = request.get("op") if isinstance(request, dict) else None
        if op == "status":
            conn.send(self.status())
        elif op == "stop":
            self.stopping = True
            conn.send({"stopping": True})
        elif op == "analyze":
            self.analyse(conn, request.get("args") or {})
        else:
            conn.send({"error": {"kind": "usage", "message": f"unknown request {op!r}"}})

    def analyse(self, conn: Connection, args: dict[str, Any]) -> None:
        from kproxy_spark.cluster import ClusterSetupError
        from kproxy_spark.jobs import InputError, analyze

        gone = False

        def progress(message: str) -> None:
            nonlocal gone
            if not gone:
                try:
                    conn.send({"progress": message})
                except OSError:
                    gone = True  # the client went away; the analysis still writes its report

        self.busy = True
        self.last_request = time.monotonic()
        try:
            report = analyze(args.get("history"), args.get("traces"), args["out"], isolation=args.get("isolation", "auto"),
                             ww_deps=args.get("ww_deps", True), progress=progress, spark=self.spark,
                             broker=args.get("broker"))
            reply: dict[str, Any] = {"report": report}
        except (InputError, FileNotFoundError, ClusterSetupError) as exc:
            reply = {"error": {"kind": "input", "message": str(exc)}}
        except Exception as exc:  # the engine outlives a failed analysis and says why
            log.exception("analysis failed")
            reply = {"error": {"kind": "internal", "message": f"{type(exc).__name__}: {exc}"}}
        finally:
            self.busy = False
            self.analyses += 1
            self.last_request = time.monotonic()  # idle counts from the end of the last analysis
        if not gone:
            try:
                conn.send(reply)
            except OSError:
                pass

    def watch_idle(self, key: bytes) -> None:
        """Once idle for idle_stop_s, ask itself to stop, as `kproxy engine stop` would: a thread cannot
        wake another's blocking accept, a connection can."""
        while not self.stopping:
            time.sleep(1.0)
            if self.idle_stop_s and not self.busy and time.monotonic() - self.last_request > self.idle_stop_s:
                log.info("idle for %.0f s: stopping", self.idle_stop_s)
                with Client(str(self.place.socket), family="AF_UNIX", authkey=key) as conn:
                    conn.send({"op": "stop"})
                    conn.recv()
                return

    def serve(self) -> None:
        key = self.place.new_key()
        self.place.socket.unlink(missing_ok=True)
        listener = Listener(str(self.place.socket), family="AF_UNIX", authkey=key)
        os.chmod(self.place.socket, 0o600)
        self.publish(pid=os.getpid(), master=self.master, started=self.started, ready=False,
                     idle_stop_s=self.idle_stop_s, log=str(self.place.log_file), python=sys.executable)
        try:
            took = self.warm()
            log.info("warm after %.1f s", took)
            self.publish(ready=True, warm_up_s=round(took, 1))
            self.last_request = time.monotonic()  # idle counts from ready
            threading.Thread(target=self.watch_idle, args=(key,), daemon=True, name="idle").start()
            while not self.stopping:
                try:
                    conn = listener.accept()
                except Exception as exc:  # noqa: BLE001 - a client without the key: refused, keep serving
                    log.warning("refused a connection: %s", exc)
                    continue
                with conn:
                    try:
                        self.answer(conn)
                    except (EOFError, OSError) as exc:
                        log.info("client went away: %s", exc)
        finally:
            listener.close()
            self.place.clear()
            if self.spark is not None and self.owns_spark:
                self.spark.stop()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m kproxy.engine.server", description=__doc__.splitlines()[0])
    parser.add_argument("--master", default="local[*]")
    parser.add_argument("--idle-stop", type=float, default=30.0, help="minutes without a request before it stops")
    parser.add_argument("--conf", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--dir", default=None, help="where the socket, key and state live (default: engine_dir())")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    conf = dict(setting.split("=", 1) for setting in args.conf)
    place = Place(Path(args.dir)) if args.dir else default_place()
    Engine(place, args.master, args.idle_stop * 60.0, conf).serve()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
