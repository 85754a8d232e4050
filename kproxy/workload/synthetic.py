"""Write a large, clean, Jepsen-style queue history (and its traces) for
measuring `kproxy analyze` at scale.

    scripts/synthetic-history.py --ops 1000000 --out h.jsonl --traces traces/

It lives in the package (the script only calls `main`) because `kproxy bench
analysis` generates its inputs with it, and scripts/ is not installed.

A real workload on this machine runs a few hundred operations a second, so a
1M-operation history would take an hour to record; this generator writes one
in a minute or two. The history is *correct by construction*: one in-memory
log per key is the single source of truth, every operation takes effect at
its completion, and reads honour read_committed. A clean run of the analysis
on it must therefore report `valid: true`; anything else is a false positive
in the analysis (or a bug here).

Shape (docs/performance-analysis.md has the details):

- `--processes` workers run concurrently: each line either invokes a new
  operation on an idle worker or completes an open one, so several
  operations overlap in time, as in a real run.
- operations: `send` (1-4 records, non-transactional idempotent producer),
  `poll` (one poll of the assigned keys), `txn` (sends and polls in one
  transaction, about 10 % aborted: `fail` with error `aborted`), `assign`
  (a new set of keys), `crash` (rare) and `info` sends (rare: the Produce
  timed out and the record did not land). After `info` or a crash the worker
  continues as a new process (`process + processes`), as in Jepsen.
- keys: `--keys` keys in play at once, picked with skewed frequency; a key is
  retired after `--writes-per-key` sends and a new one (with its `create` op,
  topic `synth-<key>`, partition 0) takes its slot.
- polls return contiguous runs of committed records from the consumer's
  position; an aborted transaction rewinds its reads (the consumer seeks back
  to its last committed position).
- final reads: a fresh process assigns every key and polls everything from
  offset 0, so every acknowledged write is seen.

`--ops N` counts the workers' completed operations (send, poll, txn, assign,
crash); the `create` notes and the final reads come on top (the summary on
stderr gives every count).

With `--traces DIR` the matching proxy trace at level `records` is written
too, as the proxy writes it (segment files, the records' batches in side
files: kproxy.workload.synthetic_segments; `--trace-format jsonl` for one
JSON object per event with the records inline): per send or txn a Produce
request and response (records, base offsets, errors), per poll micro-op a
Fetch request and response (the records read plus the transaction markers
passed over), per txn an EndTxn request and response with its synthetic
transaction numbers. Every event carries every field of
kproxy.obs.trace_schema.EVENT.
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import deque
from collections.abc import Callable
from pathlib import Path

import orjson

from kproxy.obs.trace_schema import EVENT, PARTITION, RECORD, SCHEMA_VERSION
from kproxy.protocol.apis import API_KEYS
from kproxy.workload.synthetic_segments import SegmentOutput

TOPIC_PREFIX = "synth"
PROXY_ID = "synth"
# The trace clock is another process's monotonic clock: offset it from the
# history clock so the analysis has a real offset to estimate.
TRACE_CLOCK_OFFSET_NS = 7_000_000_000_000
WALL_CLOCK_BASE_S = 1_800_000_000.0
ROTATE_BYTES = 256 * 1024 * 1024  # as the proxy's trace writer
#: How the trace is written: segments (the proxy's default) or jsonl.
TRACE_FORMATS = ("segments", "jsonl")
MAX_POLL_RECORDS = 16  # per key per poll micro-op
FINAL_POLL_RECORDS = 500  # per final poll operation
REQUEST_TIMED_OUT = 7
PROGRESS_EVERY = 10_000  # completed operations between two progress calls

#: Called with the number of operations completed since the last call.
Progress = Callable[[int], None]

# The version each API's synthetic exchanges claim, as a client of today sends them.
SYNTHETIC_VERSIONS = {"produce": 9, "fetch": 12, "end_txn": 3}

# Control record bytes (version 0, type 0 = abort, 1 = commit) as the trace
# writer encodes bytes that are not UTF-8 text.
CONTROL_KEY = {"abort": "b64:AAAAAA==", "commit": "b64:AAAAAQ=="}
CONTROL_VALUE = "b64:AAAAAAAA"

# Log entries are small lists, mutated in place when a transaction ends.
KIND, VALUE, PID, EPOCH, SEQ, STATE, TXN = range(7)
DATA, CONTROL = "d", "c"
PENDING, COMMITTED, ABORTED = "pending", "committed", "aborted"


def blank(fields) -> dict:  # noqa: ANN001
    return dict.fromkeys((f.name for f in fields), None)


EVENT_TEMPLATE = blank(EVENT)
PARTITION_TEMPLATE = blank(PARTITION)
RECORD_TEMPLATE = blank(RECORD)


class Output:
    """Buffered JSON Lines output (optionally rotated) with orjson."""

    def __init__(self, path: Path, rotate: bool = False) -> None:
        self._base = path
        self._rotate = rotate
        self._seq = 0
        self._buffer: list[bytes] = []
        self._buffered = 0
        self._written = 0
        self.lines = 0
        self._file = open(self._name(), "wb")  # noqa: SIM115 - closed in close()

    def _name(self) -> Path:
        if not self._rotate:
            return self._base
        return self._base / f"trace-{PROXY_ID}-19700101T000000-{self._seq:06d}.jsonl"

    def write(self, obj: dict) -> None:
        line = orjson.dumps(obj) + b"\n"
        self._buffer.append(line)
        self._buffered += len(line)
        self.lines += 1
        if self._buffered >= 1 << 20:
            self.flush()

    def flush(self) -> None:
        self._file.write(b"".join(self._buffer))
        self._written += self._buffered
        self._buffer.clear()
        self._buffered = 0
        if self._rotate and self._written >= ROTATE_BYTES:
            self._file.close()
            self._seq += 1
            self._written = 0
            self._file = open(self._name(), "wb")  # noqa: SIM115

    def close(self) -> None:
        self.flush()
        self._file.close()


class Trace:
    """Builds trace events that agree with the log model."""

    def __init__(self, out: Output | None) -> None:
        self.out = out
        self._correlation: dict[int, int] = {}
        self._next_conn = 0

    def new_conn(self) -> int:
        self._next_conn += 1
        return self._next_conn

    def exchange(self, conn: int, process: int, api: str, start_ns: int, span_ns: int,
                 request: dict, response: dict) -> None:
        """One request and its response within [start_ns, start_ns + span_ns)."""
        if self.out is None:
            return
        corr = self._correlation.get(conn, 0)
        self._correlation[conn] = corr + 1
        api_key, api_version = API_KEYS[api], SYNTHETIC_VERSIONS[api]
        mono = start_ns + TRACE_CLOCK_OFFSET_NS
        # The broker takes most of the exchange; the proxy's own hops the rest.
        latency_ns = max(span_ns * 6 // 10, 2)
        upstream_ns = latency_ns * 9 // 10
        common = {
            "schema_version": SCHEMA_VERSION,
            "proxy_id": PROXY_ID,
            "conn_id": conn,
            "client_addr": f"127.0.0.1:{30000 + conn % 30000}",
            "broker_id": 1,
            "api": api,
            "api_key": api_key,
            "api_version": api_version,
            "correlation_id": corr,
            "client_id": f"synth-p{process}",
            "outcome": "delivered",
            "copy": 0,
        }
        req = {**EVENT_TEMPLATE, **common, **request, "direction": "request",
               "mono_ns": mono, "wall_time": WALL_CLOCK_BASE_S + mono / 1e9}
        req["size"] = 64 + 40 * len(req["partitions"] or ())
        self.out.write(req)
        mono += latency_ns
        resp = {**EVENT_TEMPLATE, **common, **response, "direction": "response",
                "mono_ns": mono, "wall_time": WALL_CLOCK_BASE_S + mono / 1e9,
                "latency_ms": latency_ns / 1e6, "upstream_latency_ms": upstream_ns / 1e6}
        resp["size"] = 48 + 40 * len(resp["partitions"] or ())
        resp.setdefault("error_code", 0)
        if resp["error_code"] is None:
            resp["error_code"] = 0
        resp["error_codes"] = [resp["error_code"]] if resp["error_code"] else []
        for field in ("transactional_id", "producer_id", "producer_epoch", "txn_client", "txn_broker"):
            resp[field] = req[field]
        self.out.write(resp)


def record(offset, key, entry, txn_flag) -> dict:  # noqa: ANN001
    if entry[KIND] == CONTROL:
        key_text, value_text, control, seq = CONTROL_KEY[entry[VALUE]], CONTROL_VALUE, entry[VALUE], -1
    else:
        key_text, value_text, control, seq = str(key), str(entry[VALUE]), None, entry[SEQ]
    return {**RECORD_TEMPLATE, "offset": offset, "key": key_text, "value": value_text, "control": control,
            "producer_id": entry[PID], "producer_epoch": entry[EPOCH], "sequence": seq,
            "transactional": txn_flag}


def topic_of(key: int) -> str:
    return f"{TOPIC_PREFIX}-{key}"


class KeySpace:
    """Keys in play with skewed frequency, retired after a number of writes."""

    def __init__(self, rng: random.Random, slots: int, writes_per_key: int) -> None:
        self.rng = rng
        self.slots = list(range(slots))
        self.next_key = slots
        self.writes_per_key = writes_per_key
        self.writes: dict[int, int] = {}
        self.next_value: dict[int, int] = {}
        self.created: set[int] = set()
        # Hot keys first: slot i is picked 1/(i+1) as often as slot 0.
        weights = [1.0 / (i + 1) for i in range(slots)]
        total = sum(weights)
        self.cum = []
        acc = 0.0
        for w in weights:
            acc += w / total
            self.cum.append(acc)

    def pick_for_write(self, on_create) -> tuple[int, int]:  # noqa: ANN001
        slot = self.rng.choices(range(len(self.slots)), cum_weights=self.cum)[0]
        key = self.slots[slot]
        if key not in self.created:
            self.created.add(key)
            on_create(key)
        value = self.next_value.get(key, 0)
        self.next_value[key] = value + 1
        self.writes[key] = self.writes.get(key, 0) + 1
        if self.writes[key] >= self.writes_per_key:
            self.slots[slot] = self.next_key
            self.next_key += 1
        return key, value

    def pick_assignment(self) -> list[int]:
        # As the workload: a random non-empty subset of the keys in play.
        n = self.rng.randint(1, len(self.slots))
        return sorted(self.rng.sample(self.slots, n))


class Worker:
    def __init__(self, slot: int, process: int) -> None:
        self.slot = slot
        self.process = process
        self.open: dict | None = None
        self.assigned: list[int] = []
        self.positions: dict[int, int] = {}
        self.needs_assign = True


class Generator:
    def __init__(self, args: argparse.Namespace, history: Output, trace: Trace) -> None:
        self.rng = random.Random(args.seed)
        self.args = args
        self.history = history
        self.trace = trace
        self.keys = KeySpace(self.rng, args.keys, args.writes_per_key)
        self.logs: dict[int, list[list]] = {}
        self.index = 0
        self.time = 1_000_000
        self.next_pid = 1000
        self.producers: dict[int, dict] = {}  # process -> its producers and connections
        self.sequences: dict[tuple[int, int], int] = {}
        self.counts = {"completed": 0, "invoked": 0, "create": 0, "final_reads": 0, "info": 0, "aborted": 0}
        self.max_process = args.processes - 1

    # --- history lines ----------------------------------------------------

    def line(self, process: int, type_: str, f: str, value, error: str | None = None) -> int:  # noqa: ANN001
        self.time += self.rng.randint(20_000, 400_000)
        op = {"index": self.index, "time": self.time, "process": process, "type": type_, "f": f, "value": value}
        if error is not None:
            op["error"] = error
        self.history.write(op)
        self.index += 1
        return self.time

    def create(self, process: int, key: int) -> None:
        self.logs[key] = []
        self.line(process, "ok", "create", [key, topic_of(key), 0])
        self.counts["create"] += 1

    def client(self, process: int) -> dict:
        c = self.producers.get(process)
        if c is None:
            pids = (self.next_pid, self.next_pid + 1)
            self.next_pid += 2
            c = {
                "plain_pid": pids[0], "txn_pid": pids[1], "txn_number": 0,
                "txn_id": f"{TOPIC_PREFIX}-txn-{process % self.args.processes}",
                # A new process is a new producer: same transactional id, next epoch.
                "epoch": process // self.args.processes,
                "produce_conn": self.trace.new_conn(), "txn_conn": self.trace.new_conn(),
                "coordinator_conn": self.trace.new_conn(), "fetch_conn": self.trace.new_conn(),
            }
            self.producers[process] = c
        return c

    # --- invocations --------------------------------------------------------

    def invoke(self, w: Worker) -> None:
        r = self.rng.random()
        if w.needs_assign or r < 0.08:
            kind = "assign"
            value = self.keys.pick_assignment()
        elif r < 0.083:
            kind, value = "crash", None
        else:
            r = self.rng.random()
            kind = "send" if r < 0.42 else "poll" if r < 0.8 else "txn"
            if kind == "poll":
                value = [["poll"]]
            else:
                value = []
                for _ in range(self.rng.randint(1, 4)):
                    if kind == "txn" and self.rng.random() < 0.4:
                        value.append(["poll"])
                    else:
                        key, v = self.keys.pick_for_write(lambda k: self.create(w.process, k))
                        value.append(["send", key, v])
        start = self.line(w.process, "invoke", kind, value)
        w.open = {"f": kind, "value": value, "start": start}
        self.counts["invoked"] += 1

    # --- completions ----------------------------------------------------------

    def complete(self, w: Worker) -> None:
        op = w.open
        w.open = None
        f = op["f"]
        # The completion's time is known once the line is written; the wire
        # events are laid out inside [invoke, completion) afterwards.
        if f == "assign":
            # A newly assigned key starts at the process's committed position
            # (where it last read it), else at the earliest offset.
            for k in op["value"]:
                w.positions.setdefault(k, 0)
            w.assigned = op["value"]
            w.needs_assign = False
            self.line(w.process, "ok", "assign", op["value"])
        elif f == "crash":
            self.line(w.process, "info", "crash", None)
            self.retire(w)
        elif f == "poll":
            records, scans = self.poll(w, w.assigned)
            end = self.line(w.process, "ok", "poll", [["poll", records]])
            self.fetch_exchanges(w.process, [scans], op["start"], end)
        elif f == "send":
            self.complete_send(w, op)
        else:
            self.complete_txn(w, op)
        self.counts["completed"] += 1

    def retire(self, w: Worker) -> None:
        w.process += self.args.processes
        self.max_process = max(self.max_process, w.process)
        w.needs_assign = True
        # The new process's consumer joins the same group and resumes from its
        # committed positions, so a crash does not mean re-reading every key.
        w.assigned = []
        self.counts["info"] += 1

    def append(self, key: int, value: int, pid: int, epoch: int, state: str, txn: bool) -> int:
        log = self.logs[key]
        seq_key = (pid, key)
        seq = self.sequences.get(seq_key, 0)
        self.sequences[seq_key] = seq + 1
        log.append([DATA, value, pid, epoch, seq, state, txn])
        return len(log) - 1

    def complete_send(self, w: Worker, op: dict) -> None:
        c = self.client(w.process)
        sends = [(m[1], m[2]) for m in op["value"]]
        if self.rng.random() < 0.01:
            # The Produce timed out and nothing landed: the outcome is unknown to the client.
            end = self.line(w.process, "info", "send", op["value"], "REQUEST_TIMED_OUT")
            self.produce_exchange(w.process, c["produce_conn"], c["plain_pid"], 0, None, sends, None,
                                  op["start"], end - op["start"], error=REQUEST_TIMED_OUT)
            self.retire(w)
            return
        offsets = [self.append(k, v, c["plain_pid"], 0, COMMITTED, False) for k, v in sends]
        end = self.line(w.process, "ok", "send", [["send", k, [o, v]] for (k, v), o in zip(sends, offsets)])
        self.produce_exchange(w.process, c["produce_conn"], c["plain_pid"], 0, None, sends, offsets,
                              op["start"], end - op["start"])

    def complete_txn(self, w: Worker, op: dict) -> None:
        c = self.client(w.process)
        c["txn_number"] += 1
        # Only the assigned keys' positions can move in a transaction (its polls read those): copying
        # every key the worker ever held made generation quadratic (10M operations slowed to 6k/s).
        before = {key: w.positions.get(key) for key in w.assigned}
        completed, sends, offsets, scans_per_poll, written = [], [], [], [], []
        for mop in op["value"]:
            if mop[0] == "poll":
                records, scans = self.poll(w, w.assigned)
                completed.append(["poll", records])
                scans_per_poll.append(scans)
            else:
                key, value = mop[1], mop[2]
                offset = self.append(key, value, c["txn_pid"], c["epoch"], PENDING, True)
                written.append(self.logs[key][offset])
                sends.append((key, value))
                offsets.append(offset)
                completed.append(["send", key, [offset, value]])
        commit = self.rng.random() >= 0.1
        state = COMMITTED if commit else ABORTED
        for entry in written:
            entry[STATE] = state
        for key in sorted({k for k, _ in sends}):
            self.logs[key].append([CONTROL, "commit" if commit else "abort", c["txn_pid"], c["epoch"], -1, state, True])
        if commit:
            end = self.line(w.process, "ok", "txn", completed)
        else:
            # The consumer seeks back to its last committed position.
            for key, position in before.items():
                if position is None:
                    w.positions.pop(key, None)
                else:
                    w.positions[key] = position
            end = self.line(w.process, "fail", "txn", completed, "aborted")
            self.counts["aborted"] += 1
        # Wire order inside the transaction: its Produce, its Fetches, its EndTxn.
        exchanges = (1 if sends else 0) + len(scans_per_poll) + 1
        span = (end - op["start"]) // exchanges
        at = op["start"]
        txn_fields = {"transactional_id": c["txn_id"], "txn_client": c["txn_number"], "txn_broker": c["txn_number"]}
        if sends:
            self.produce_exchange(w.process, c["txn_conn"], c["txn_pid"], c["epoch"], txn_fields, sends, offsets, at, span)
            at += span
        for scans in scans_per_poll:
            self.fetch_exchanges(w.process, [scans], at, at + span)
            at += span
        ids = {"producer_id": c["txn_pid"], "producer_epoch": c["epoch"], **txn_fields}
        self.trace.exchange(c["coordinator_conn"], w.process, "end_txn", at, span,
                            {**ids, "end_txn_commit": commit}, {})

    # --- reads ----------------------------------------------------------------

    def poll(self, w: Worker, keys: list[int], limit: int | None = None) -> tuple[dict, list]:
        """Read committed records from the worker's positions; return the poll
        map and, per key, the scanned log range (for the Fetch response)."""
        records: dict[str, list] = {}
        scans = []
        for key in keys:
            log = self.logs.get(key)
            if not log:
                continue
            start = pos = w.positions.get(key, 0)
            want = limit or self.rng.randint(1, MAX_POLL_RECORDS)
            got = []
            while pos < len(log) and len(got) < want:
                entry = log[pos]
                if entry[STATE] == PENDING:
                    break  # the last stable offset: nothing beyond an open transaction
                if entry[KIND] == DATA and entry[STATE] == COMMITTED:
                    got.append([pos, entry[VALUE]])
                pos += 1
            w.positions[key] = pos
            if got:
                records[str(key)] = got
            if pos > start:
                scans.append((key, start, pos))
        return records, scans

    def fetch_exchanges(self, process: int, polls: list[list], start: int, end: int) -> None:
        if self.trace.out is None:
            return
        conn = self.client(process)["fetch_conn"]
        span = max((end - start) // max(len(polls), 1), 2)
        for i, scans in enumerate(polls):
            partitions = []
            for key, lo, hi in scans:
                log = self.logs[key]
                stable = next((p for p in range(hi, len(log)) if log[p][STATE] == PENDING), len(log))
                recs = [
                    record(p, key, log[p], log[p][TXN])
                    for p in range(lo, hi)
                    # A read_committed consumer is handed committed data and markers only.
                    if log[p][KIND] == CONTROL or log[p][STATE] == COMMITTED
                ]
                partitions.append({
                    **PARTITION_TEMPLATE, "topic": topic_of(key), "partition": 0, "error_code": 0,
                    "high_watermark": len(log), "last_stable_offset": stable, "log_start_offset": 0,
                    "aborted_transactions": [], "compression": "none", "records": recs,
                })
            self.trace.exchange(conn, process, "fetch", start + i * span, span, {}, {"partitions": partitions})

    # --- writes on the wire -----------------------------------------------------

    def produce_exchange(self, process, conn, pid, epoch, txn_fields, sends, offsets, start, span,  # noqa: ANN001
                         error: int = 0) -> None:
        if self.trace.out is None:
            return
        by_key: dict[int, list[int]] = {}
        for i, (key, _) in enumerate(sends):
            by_key.setdefault(key, []).append(i)
        request_parts, response_parts = [], []
        transactional = txn_fields is not None
        for key, positions in by_key.items():
            entries = [[DATA, sends[i][1], pid, epoch, -1, None, transactional] for i in positions]
            if offsets is not None:
                entries = [self.logs[key][offsets[i]] for i in positions]
            base = offsets[positions[0]] if offsets is not None else -1
            request_parts.append({
                **PARTITION_TEMPLATE, "topic": topic_of(key), "partition": 0, "compression": "none",
                "records": [record(None, key, e, transactional) for e in entries],
            })
            response_parts.append({
                **PARTITION_TEMPLATE, "topic": topic_of(key), "partition": 0, "error_code": error,
                "base_offset": base, "log_start_offset": 0, "compression": "none",
                "records": [record(base + j if offsets is not None else None, key, e, transactional)
                            for j, e in enumerate(entries)],
            })
        ids = {"producer_id": pid, "producer_epoch": epoch, **(txn_fields or {})}
        self.trace.exchange(conn, process, "produce", start, span, {**ids, "partitions": request_parts},
                            {"partitions": response_parts, "error_code": error})

    # --- the run ------------------------------------------------------------------

    def run(self, progress: Progress | None = None) -> None:
        workers = [Worker(i, i) for i in range(self.args.processes)]
        target = self.args.ops
        while self.counts["completed"] < target:
            w = workers[self.rng.randrange(len(workers))]
            if w.open is not None:
                self.complete(w)
                if progress is not None and self.counts["completed"] % PROGRESS_EVERY == 0:
                    progress(PROGRESS_EVERY)
            elif self.counts["invoked"] < target:
                self.invoke(w)
        if progress is not None:
            progress(self.counts["completed"] % PROGRESS_EVERY)
        self.final_reads()

    def final_reads(self) -> None:
        """A fresh process reads every key from offset 0, a few hundred records per poll."""
        reader = Worker(-1, self.max_process + 1)
        keys = sorted(self.logs)
        self.line(reader.process, "invoke", "assign", keys)
        self.line(reader.process, "ok", "assign", keys)
        reader.assigned = keys
        reader.positions = dict.fromkeys(keys, 0)
        remaining = {k: sum(1 for e in self.logs[k] if e[KIND] == DATA and e[STATE] == COMMITTED) for k in keys}
        queue = deque(k for k in keys if remaining[k])
        while queue:
            batch, planned = [], 0
            while queue and planned < FINAL_POLL_RECORDS:
                key = queue.popleft()
                batch.append(key)
                planned += min(remaining[key], FINAL_POLL_RECORDS)
            start = self.line(reader.process, "invoke", "poll", [["poll"]])
            records, scans = self.poll(reader, batch, limit=FINAL_POLL_RECORDS)
            end = self.line(reader.process, "ok", "poll", [["poll", records]])
            self.fetch_exchanges(reader.process, [scans], start, end)
            self.counts["final_reads"] += 1
            for key in reversed(batch):
                remaining[key] -= len(records.get(str(key), ()))
                if remaining[key] > 0:
                    queue.appendleft(key)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="synthetic-history.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--ops", type=int, required=True, help="completed worker operations to write")
    parser.add_argument("--out", type=Path, required=True, help="history file (JSON Lines)")
    parser.add_argument("--traces", type=Path, default=None, help="also write matching traces (level records) here")
    parser.add_argument("--trace-format", choices=TRACE_FORMATS, default="segments",
                        help="segments (the proxy's default: segment files, record batches in side files) or jsonl "
                             "(one JSON object per event, records inline)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--processes", type=int, default=8, help="concurrent workers")
    parser.add_argument("--keys", type=int, default=8, help="keys in play at once")
    parser.add_argument("--writes-per-key", type=int, default=256, help="sends after which a key is retired")
    args = parser.parse_args(argv)
    if args.ops < 1 or args.processes < 1 or args.keys < 1 or args.writes_per_key < 1:
        parser.error("--ops, --processes, --keys and --writes-per-key must be at least 1")
    return args


def generate(ops: int, out: Path, traces: Path | None = None, seed: int = 0, processes: int = 8, keys: int = 8,
             writes_per_key: int = 256, progress: Progress | None = None,
             trace_format: str = "segments") -> dict[str, int]:
    """Write the history (and the traces when a directory is given, in
    `trace_format`: TRACE_FORMATS); return the counts: history and trace
    lines, completed, aborted, info, create, final_reads."""
    args = argparse.Namespace(ops=ops, out=Path(out), traces=None if traces is None else Path(traces), seed=seed,
                              processes=processes, keys=keys, writes_per_key=writes_per_key)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    history = Output(args.out)
    if trace_format not in TRACE_FORMATS:
        raise ValueError(f"trace_format must be one of {', '.join(TRACE_FORMATS)}, not {trace_format!r}")
    trace_out: Output | SegmentOutput | None = None
    if args.traces is not None:
        args.traces.mkdir(parents=True, exist_ok=True)
        for old in args.traces.glob(f"trace-{PROXY_ID}-*"):
            old.unlink()  # a rerun must not mix two generations of the same trace
        if trace_format == "segments":
            trace_out = SegmentOutput(args.traces, PROXY_ID, ROTATE_BYTES)
        else:
            trace_out = Output(args.traces, rotate=True)
    generator = Generator(args, history, Trace(trace_out))
    generator.run(progress)
    history.close()
    if trace_out is not None:
        trace_out.close()
    return {**generator.counts, "history_lines": history.lines, "trace_events": trace_out.lines if trace_out else 0}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    started = time.monotonic()
    counts = generate(args.ops, args.out, args.traces, args.seed, args.processes, args.keys, args.writes_per_key,
                      trace_format=args.trace_format)
    print(
        f"{args.out}: {counts['history_lines']} lines, {counts['completed']} worker ops completed "
        f"({counts['aborted']} aborted txns, {counts['info']} info/crash), {counts['create']} keys created, "
        f"{counts['final_reads']} final polls"
        + (f"; {counts['trace_events']} trace events in {args.traces}" if args.traces else "")
        + f"; {time.monotonic() - started:.1f}s",
        file=sys.stderr,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
