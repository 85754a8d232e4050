"""The trace writer: takes trace events from the proxy and writes them to rotating files.

Threading model. The proxy builds each event as a row in schema order
(kproxy.obs.trace_events) or, for frames its fast path forwards untouched,
hands over a `PendingRow` that the writer builds later (so the data path
does not pay for it), with `offer()`:
a length check and a `deque.append`, well under a microsecond, never the disk.

The writer composes on the proxy's own event loop, in its idle time. A
trio task sleeps until the oldest queued event's batch is due (the first
event of a batch moves the sleep's deadline; it is not woken per event, which
cost the data path a scheduler pass each time), then takes them whenever the loop has nothing
else to do, and works in steps of at most `_STEP_SECONDS` between which the
data path runs: it builds
the rows, scans a `records` frame's batches and lays out their side bytes
(kproxy.obs.trace_records), and encodes a batch (one fixed-layout segment,
kproxy.obs.trace_segments; or JSON lines serialised with orjson; or a
pyarrow row group) once its oldest event is three quarters of
`flush_interval` old, again in idle time. A thread of its own
(kproxy.obs.trace_io) then makes the system calls, in order.

Why not a thread for the Python work: the proxy and such a thread share one
interpreter lock. A flush at level `records` is 1-2 ms of Python every 100 ms
at 500 records/s, and a request that arrived meanwhile waited for the lock at
every step of its way through the proxy: the tracing proxy's p99 was
1.1-1.4 ms above the plain proxy's, however short the switch interval.
Composing in the loop's idle time costs the same CPU with no lock handed back
and forth, and a request waits at most one step (docs/performance.md).
When the loop is never idle (a saturated proxy), the writer takes its steps
anyway once its oldest event is `flush_interval` old, its queue half full, or
a producer waits for room: every event is written within about
`flush_interval` of its offer unless the proxy is saturated.

Durability. Every batch reaches the kernel with one unbuffered `write()` per
segment or line run, side bytes first, so a SIGKILL of the proxy leaves each
segment file readable up to its last complete segment and each JSONL file up
to the last written line (readers skip a torn tail; see
kproxy.obs.trace_files). Nothing is fsynced for durability: surviving a
machine crash is not a goal, surviving a killed proxy is.

Bounds. At most `queue_size` events (and, at `records`, `queue_bytes` of their
frames) wait to be composed, and at most `queue_bytes` of encoded batches and
side bytes wait for the file thread. When the queue is full, `on_full`
decides: "block" (the default) makes `offer()` return False and the caller
awaits `put()`, so the proxy slows down rather than lose evidence; "drop"
counts the event in kproxy_trace_events_total{outcome="dropped"} and lets
traffic go on at full speed (production taps).
"""

from __future__ import annotations

import ctypes
import logging
import re
import time
from collections import deque
from pathlib import Path
from typing import Any, Literal

import trio
from trio.testing import wait_all_tasks_blocked

from kproxy.obs import metrics
from kproxy.obs.loop_idle import LoopIdleProbe
from kproxy.obs.trace_events import PendingRow
from kproxy.obs.trace_fold import IdleFetchFolder
from kproxy.obs.trace_io import FileOps
from kproxy.obs.trace_records import RawLedger, RawPartitions
from kproxy.obs.trace_schema import FIELD_NAMES, SCHEMA_VERSION
from kproxy.obs.trace_segments import run_steps
from kproxy.obs.trace_sinks import SINKS, Format, Sink, trace_file_name

log = logging.getLogger(__name__)

__all__ = ["TraceWriter", "TraceWriterError", "trace_file_name"]

Level = Literal["headers", "records"]
OnFull = Literal["block", "drop"]

MiB = 1024 * 1024

# Names that are safe in a file name on every platform we care about.
_PROXY_ID = re.compile(r"^[A-Za-z0-9._]+(?:-[A-Za-z0-9._]+)*$")

# Upper bound on events per batch (one segment): bounds the memory of one
# batch independently of queue_size.
_MAX_BATCH = 512

# The longest the writer works between two chances for the data path to run.
# A request that arrives during a step waits for its end: 50 µs keeps that
# well inside the added-latency target (docs/performance.md).
_STEP_SECONDS = 0.00005

# How often a waiting writer looks for a failed file operation while the file thread has work.
_POLL_SECONDS = 0.02

# A look at the sockets between two idle steps that took longer than this
# means another task ran: the writer then waits for the loop to be idle again.
_ANOTHER_TASK_RAN = 0.00002

# Encoded batches waiting for the file thread, at most: past this the writer
# stops taking events, so a stalled disk fills the queue (and on_full decides).
_MAX_OPS_BACKLOG = 8
# Writes up to this size go to the kernel from the loop itself when it is
# idle and the file thread has nothing queued (see FileOps.on_loop_max_bytes).
_ON_LOOP_WRITE_BYTES = 64 * 1024
# How often a writer waiting for the file thread looks again.
_BACKLOG_POLL = 0.002

_VERSION = FIELD_NAMES.index("schema_version")
_PROXY = FIELD_NAMES.index("proxy_id")
_PARTITIONS = FIELD_NAMES.index("partitions")
_UPSTREAM = FIELD_NAMES.index("upstream_partitions")
_REPEATS = FIELD_NAMES.index("repeats")


def _keep_freed_frame_memory(queue_bytes: int) -> None:
    """Level `records`: freed frames' memory stays in the process for the next frames.

    At this level every Produce request and Fetch response (up to MiBs each)
    is kept whole and waits in the writer's queue until the writer has
    copied its batches and frees it. glibc serves blocks that large with mmap,
    and trims the heap's free top once it passes twice the largest block seen,
    so the next frames landed on fresh pages: a page fault per 4 KiB traced,
    each far dearer than the copy into it on this project's VMs (see
    trace_sinks.Sink._io_recycle_side_pages). Fixed thresholds keep up to twice the
    writer's byte bound of freed memory for reuse; the cost is resident
    memory that stays at the level's high-water mark. Only glibc has mallopt;
    elsewhere this does nothing.
    """
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return
    m_trim_threshold, m_mmap_threshold = -1, -3
    mallopt(m_mmap_threshold, 32 * MiB)  # glibc's largest: frames up to it come from the heap
    mallopt(m_trim_threshold, max(queue_bytes * 2, 64 * MiB))


class TraceWriterError(RuntimeError):
    """The writer failed (e.g. the disk is full); no more events are accepted."""


class TraceWriter:
    """Bounded trace writer that composes in the loop's idle time. See the module docstring.

    Life cycle: construct; `await nursery.start(writer.run)`; call `offer()`
    (and `await put()` when it returns False) from the trio thread; on
    shutdown `await writer.aclose()`. Events offered before `run()` starts
    wait in the queue. A dict handed over belongs to the writer from then on.
    """

    def __init__(
        self,
        directory: Path,
        *,
        level: Level = "headers",
        fmt: Format = "segments",
        rotate_bytes: int = 256 * MiB,
        rotate_seconds: float = 3600,
        queue_size: int = 16384,
        queue_bytes: int = 128 * MiB,
        on_full: OnFull = "block",
        proxy_id: str,
        flush_interval: float = 0.1,
        close_timeout: float = 30.0,
        fold_idle_fetches: bool = True,
    ) -> None:
        if level not in ("headers", "records"):
            raise ValueError(f"trace level must be 'headers' or 'records', not {level!r}")
        if fmt not in ("segments", "jsonl", "parquet"):
            raise ValueError(f"trace format must be 'segments', 'jsonl' or 'parquet', not {fmt!r}")
        if on_full not in ("block", "drop"):
            raise ValueError(f"on_full must be 'block' or 'drop', not {on_full!r}")
        if not _PROXY_ID.match(proxy_id):
            raise ValueError(f"proxy id {proxy_id!r} must be letters, digits, '.', '_' or inner '-'")
        if queue_size < 1 or queue_bytes < 1 or rotate_bytes < 1 or rotate_seconds <= 0:
            raise ValueError("queue_size, queue_bytes, rotate_bytes and rotate_seconds must be positive")
        if not 0 < flush_interval <= 0.2:
            raise ValueError("flush_interval must be in (0, 0.2] seconds: files are flushed at least every 200 ms")

        self.directory = Path(directory)
        self.level: Level = level
        self.fmt: Format = fmt
        self.on_full: OnFull = on_full
        self.proxy_id = proxy_id
        self.queue_size = queue_size
        # Level `records` hands over frames: the queue is bounded in their bytes too.
        self.queue_bytes = queue_bytes
        self.raw_ledger = RawLedger()
        if level == "records":
            _keep_freed_frame_memory(queue_bytes)
        self.flush_interval = flush_interval
        self.close_timeout = close_timeout
        # Level `records` only: there a Fetch response's partitions show that it carried no record.
        self._folder = IdleFetchFolder() if fold_idle_fetches and level == "records" else None

        self.directory.mkdir(parents=True, exist_ok=True)
        self._ops = FileOps(f"trace-files-{proxy_id}")
        self._sink: Sink = SINKS[fmt](self.directory, proxy_id, fmt, rotate_bytes, rotate_seconds, self._ops)

        self._queue: deque[dict | list | PendingRow] = deque()
        # Past this depth the writer stops waiting for the loop to be idle.
        self._wake_at = max(1, queue_size // 2)
        self._batch: list = []  # composed events waiting for their segment
        self._batch_folded = 0  # events the batch's folded ones stand for besides themselves
        # Trio times for the oldest unwritten event: from `_due` its batch is
        # written as soon as the loop is idle; from `_deadline` the writer no
        # longer waits for idle (its steps then alternate with the data path's).
        self._due: float | None = None
        self._deadline: float | None = None
        # How often a writer waiting for events looks for a failed file operation.
        self._poll = min(_POLL_SECONDS, flush_interval / 4)
        # The writer's wait for events: offer() moves its deadline to the first
        # event's due time, _hurry() cancels it.
        self._work: trio.CancelScope | None = None
        self._first_at: float | None = None  # when the oldest queued event of a new batch arrived
        self._idle_scope: trio.CancelScope | None = None  # the writer's wait for an idle loop
        self._in_idle_run = False  # the loop was idle at the writer's last turn
        self._idle_probe: LoopIdleProbe | None = None  # made by run(), inside trio
        self._closing = False  # no more events accepted
        self._stopping = False  # the writer writes everything accepted and stops
        self._started = False
        self._finished = trio.Event()
        self._failure: BaseException | None = None
        self._room_wanted = False
        self._room: trio.Event | None = None

        self.accepted = 0
        self.dropped = 0
        self.written = 0  # events in the kernel's hands (counted by the file thread)
        self.unwritable = 0  # events that did not serialise (also counted as dropped)
        # Events written as part of another: an idle Fetch exchange's, folded (kproxy.obs.trace_fold).
        self.folded = 0

        metrics.trace_queue_depth.set_function(lambda: len(self._queue))

    @property
    def records(self) -> bool:
        """Whether events should carry per-partition records (level 'records')."""
        return self.level == "records"

    @property
    def files(self) -> list[Path]:
        """Files this writer has opened, in order."""
        return list(self._sink.files)

    # ---- the data path's side ------------------------------------------------

    def offer(self, event: dict | list | PendingRow) -> bool:
        """Hand an event over without blocking.

        Returns False only when the caller must `await put(event)`: in block
        mode with a full queue. In drop mode a full queue drops and counts the
        event and the call returns True (nothing for the caller to do).
        """
        queue = self._queue
        queued = len(queue)
        if queued < self._wake_at and not self._closing and self.raw_ledger.held < self.queue_bytes // 2:
            queue.append(event)
            self.accepted += 1
            if not queued and self._due is None:
                # The first event of a batch: the waiting writer is to wake
                # when the batch is due, and no sooner (a wake costs the loop
                # about 0.3 ms of CPU here, and a wake per event cost the data
                # path a scheduler pass each time). Moving a deadline wakes no one.
                self._first_at = now = trio.current_time()
                if self._work is not None:
                    self._work.deadline = min(self._work.deadline, now + self.flush_interval * 3 / 4)
            return True
        return self._offer_slow(event)

    def _has_room(self) -> bool:
        # An empty queue takes any event, however large its frame: it cannot wait for itself.
        queue = self._queue
        return len(queue) < self.queue_size and (not queue or self.raw_ledger.held < self.queue_bytes)

    def _hurry(self) -> None:
        """The queue is filling or a producer waits: the writer stops waiting for an idle loop."""
        if self._work is not None:
            self._work.cancel()
            self._work = None
        if self._idle_scope is not None:
            self._idle_scope.cancel()

    def _offer_slow(self, event: dict | list | PendingRow) -> bool:
        self._check_usable()
        if self._closing:
            self._count_drop(event)
            return True
        self._hurry()
        if self._has_room():
            self._queue.append(event)
            self.accepted += 1
            return True
        if self.on_full == "drop":
            self._count_drop(event)
            return True
        return False

    async def put(self, event: dict | list | PendingRow) -> None:
        """Wait for room in the queue, then hand the event over (block mode's slow path)."""
        started = trio.current_time()
        try:
            while True:
                self._check_usable()
                if self._closing:
                    self._count_drop(event)
                    return
                if self._has_room():
                    self._queue.append(event)
                    self.accepted += 1
                    return
                if self.on_full == "drop":
                    self._count_drop(event)
                    return
                if self._room is None:
                    self._room = trio.Event()
                self._room_wanted = True
                self._hurry()
                # The writer normally wakes us; the deadline only covers a writer that stopped.
                with trio.move_on_after(self.flush_interval):
                    await self._room.wait()
        finally:
            metrics.trace_wait.inc(trio.current_time() - started)

    def _count_drop(self, event: dict | list | PendingRow) -> None:
        self.dropped += 1
        metrics.trace_events.labels("dropped").inc()
        if type(event) is PendingRow:
            raw = event.raw
        elif type(event) is dict:
            raw = event.get("partitions")
        else:
            raw = event[_PARTITIONS]
        if isinstance(raw, RawPartitions):
            raw.drop()

    def _check_usable(self) -> None:
        failure = self._failure or self._ops.failure
        if failure is not None:
            raise TraceWriterError(f"trace writer failed: {failure!r}") from failure

    def _room_available(self) -> None:
        if self._room is not None:
            self._room.set()
            self._room = None

    # ---- life cycle ----------------------------------------------------------

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Compose until `aclose()`; then, or on cancellation, write everything accepted and close the files."""
        if self._started or self._stopping:
            raise RuntimeError("TraceWriter.run() can only be started once")
        self._started = True
        self._idle_probe = LoopIdleProbe()
        self._ops.start()
        task_status.started()
        try:
            await self._compose_until_stopped()
        except Exception as exc:  # noqa: BLE001 - reported to the data path as TraceWriterError
            log.exception("trace writer failed")
            self._failure = exc
        finally:
            # Shielded: a cancelled nursery must still get its accepted events on disk.
            with trio.CancelScope(shield=True):
                await self._finish()
        self._check_usable()

    async def aclose(self) -> None:
        """Stop accepting, write every accepted event, close the files. Idempotent."""
        self._closing = True
        if not self._started:
            if not self._stopping:
                # Never started: compose and write what was offered on a thread of our own.
                self._stopping = True
                with trio.CancelScope(shield=True):
                    await trio.to_thread.run_sync(self._drain_and_close)
            self._check_usable()
            return
        self._stopping = True
        self._hurry()
        with trio.CancelScope(shield=True):
            await self._finished.wait()
        self._check_usable()

    async def _finish(self) -> None:
        self._closing = True
        self._stopping = True
        try:
            if self._failure is None:
                self._compose_all()
            self._sink.close()
        except Exception as exc:  # noqa: BLE001
            log.exception("closing the trace failed")
            self._failure = self._failure or exc
        self._ops.close()
        with trio.move_on_after(self.close_timeout) as scope:
            await trio.to_thread.run_sync(self._ops.join)
        if scope.cancelled_caught:
            log.error("trace files not closed within %.1fs; %d writes pending", self.close_timeout, self._ops.pending)
        self._finished.set()
        self._room_available()

    def _drain_and_close(self) -> None:
        try:
            self._compose_all()
        except BaseException as exc:  # noqa: BLE001
            self._failure = exc
        finally:
            self._sink.close()

    # ---- composing -------------------------------------------------------------

    def _unwritten(self) -> bool:
        """Composed events wait for their batch: in it, or held back by the folder."""
        return bool(self._batch) or (self._folder is not None and self._folder.pending)

    async def _compose_until_stopped(self) -> None:
        queue = self._queue
        while True:
            self._check_usable()  # a failed file thread stops the writer, and the data path hears of it
            if not queue:
                if self._unwritten() and (self._stopping or trio.current_time() >= self._due):
                    await self._write_batch()
                    continue
                if self._stopping:
                    return
                if not self._unwritten():  # composed events point into this file's side file
                    self._sink.rotate_if_old()
                # Wait for the next batch's due time (offer() sets it when its
                # first event comes), the pending batch's, or the file's
                # rotation; not on a poll: on these machines every wake of the
                # loop costs about 0.3 ms of CPU, and a writer polling every
                # 20 ms made an idle tracing proxy spend 15 ms of CPU a second
                # (docs/performance.md).
                deadline = trio.current_time() + self._sink.seconds_to_rotation()
                if self._ops.busy:
                    # A file operation may yet fail: look again soon, so the data path hears of it.
                    deadline = min(deadline, trio.current_time() + self._poll)
                if self._unwritten():
                    deadline = min(deadline, self._due)
                self._in_idle_run = False
                with trio.move_on_at(deadline) as scope:
                    self._work = scope
                    try:
                        await trio.sleep_forever()
                    finally:
                        self._work = None
                continue
            if self._due is None:
                # Counted from the batch's first event (offer() noted when it came).
                first = self._first_at if self._first_at is not None else trio.current_time()
                self._first_at = None
                self._deadline = first + self.flush_interval
                self._due = self._deadline - self.flush_interval / 4
            await self._take_turn()
            self._compose_step()
            # A full batch, or the queue drained after the oldest event's deadline;
            # while events are late the writer keeps composing (it stays urgent).
            if len(self._batch) >= _MAX_BATCH or (self._unwritten() and not queue and trio.current_time() >= self._due):
                await self._write_batch()

    def _urgent(self) -> bool:
        return (
            self._stopping
            or self._room_wanted
            or len(self._queue) >= self._wake_at
            or self.raw_ledger.held >= self.queue_bytes // 2
            or (self._deadline is not None and trio.current_time() >= self._deadline)
        )

    async def _take_turn(self) -> None:
        """Let the data path run first: wait until the batch is due, then for an idle loop; only yield once when urgent.

        Until the oldest event's batch is due the writer sleeps on a timer: one
        wake-up per batch. (It used to wait for the loop to have been idle for
        a cushion of 0.5 ms; a task waiting so caps every I/O wait of the loop
        at the cushion, and with events queued, which under traffic is nearly
        always, the loop woke about every millisecond: that, not the events,
        was most of tracing's CPU per record.) From then on it takes a step
        whenever the loop has nothing to run and no socket is ready, and goes
        on step after step for as long as nothing else wants to run in between
        (each step ends with a look at trio's run queue, deadlines and sockets,
        kproxy.obs.loop_idle, without a pass of its scheduler); after the data
        path ran, or after any other wait of the writer's, it waits for the
        loop to be idle again: the look is only sound while the writer has not
        yielded since trio last found the loop idle.
        """
        if self._urgent():
            self._in_idle_run = False
            await trio.lowlevel.checkpoint()
            return
        if self._in_idle_run:
            probe = self._idle_probe
            if probe is not None and probe.available:
                if probe.idle():
                    return  # the next step at once: trio would find nothing to run
            else:
                started = time.perf_counter()
                await wait_all_tasks_blocked(0)
                if time.perf_counter() - started < _ANOTHER_TASK_RAN:
                    return
        self._in_idle_run = False
        now = trio.current_time()
        deadline = self._deadline if self._deadline is not None else now + self.flush_interval
        due = self._due
        with trio.move_on_at(deadline) as scope:
            self._idle_scope = scope
            try:
                if due is not None and now < due:
                    await trio.sleep_until(due)
                await wait_all_tasks_blocked(0)
            finally:
                self._idle_scope = None
        if scope.cancelled_caught:
            await trio.lowlevel.checkpoint()
        else:
            self._in_idle_run = True

    def _compose_step(self) -> None:
        """Compose queued events into the batch for at most _STEP_SECONDS (at least one event)."""
        queue = self._queue
        batch = self._batch
        end = time.perf_counter() + _STEP_SECONDS
        while queue and len(batch) < _MAX_BATCH:
            self._add(queue.popleft())
            if time.perf_counter() >= end:
                break
        if self._room_wanted and self._has_room():
            self._room_wanted = False
            self._room_available()

    async def _write_batch(self) -> None:
        """Encode the batch in steps, wait for room at the file thread, hand it over."""
        # A batch written because the queue ran dry holds every event offered
        # before now: those offered while it is written start the next batch,
        # due a flush interval from now. (Keeping the written batch's due time
        # made every later batch due at once: while traffic went on, the writer
        # wrote a segment each time the queue ran dry, of about 20 events on
        # 100 B produce instead of 100, each paying a whole segment's
        # per-column cost.)
        drained_at = trio.current_time() if not self._queue else None
        self._flush_folds()
        batch, self._batch = self._batch, []
        folded, self._batch_folded = self._batch_folded, 0
        steps = self._sink.encode_steps(batch)
        while True:
            end = time.perf_counter() + _STEP_SECONDS
            try:
                while time.perf_counter() < end:
                    next(steps)
            except StopIteration as done:
                payload, kept = done.value
                break
            await self._take_turn()
        ops = self._ops
        while (ops.backlog_ops >= _MAX_OPS_BACKLOG or ops.backlog_bytes >= self.queue_bytes) and ops.failure is None:
            self._in_idle_run = False
            await trio.sleep(_BACKLOG_POLL)
        if not self._urgent():
            ops.on_loop_max_bytes = _ON_LOOP_WRITE_BYTES
        try:
            self._commit(batch, payload, kept, folded)
        finally:
            ops.on_loop_max_bytes = 0
        if not self._queue and not self._batch:
            self._due = self._deadline = None
        elif drained_at is not None and not self._batch:
            self._deadline = drained_at + self.flush_interval
            self._due = self._deadline - self.flush_interval / 4

    def _compose_all(self) -> None:
        """Compose and write everything queued at once (shutdown)."""
        queue = self._queue
        while queue or self._unwritten():
            while queue and len(self._batch) < _MAX_BATCH:
                self._add(queue.popleft())
            if not queue:
                self._flush_folds()
            batch, self._batch = self._batch, []
            folded, self._batch_folded = self._batch_folded, 0
            payload, kept = run_steps(self._sink.encode_steps(batch))
            self._commit(batch, payload, kept, folded)
        self._due = self._deadline = None
        if self._room_wanted:
            self._room_wanted = False
            self._room_available()

    def _commit(self, batch: list, payload: Any, kept: int, folded: int = 0) -> None:
        if kept:
            self._sink.commit(payload)
            # Counted once the file thread has written them (operations run in order).
            self._ops.submit(self._count_written, kept, folded)
        if kept < len(batch):
            self.unwritable += len(batch) - kept
            metrics.trace_events.labels("dropped").inc(len(batch) - kept)

    def _count_written(self, n: int, folded: int = 0) -> None:
        # A file operation: operations run one at a time, in order (on the file
        # thread, or on the idle loop when that thread has nothing queued), so
        # `written` never has two writers at once.
        self.written += n
        metrics.trace_events.labels("written").inc(n)
        if folded:
            self.folded += folded
            metrics.trace_events.labels("folded").inc(folded)

    def _add(self, queued: dict | list | PendingRow) -> None:
        """Compose one queued event into the batch, through the folder when it folds."""
        event = self._compose(queued)
        if event is None:
            return
        folder = self._folder
        if folder is None:
            self._batch.append(event)
            return
        if type(event) is list:
            rows = folder.take(event)
        else:  # a dict for a sink of dicts: never folded, but it follows what its connection holds back
            rows = folder.passing(event.get("conn_id"), event.get("direction"))
            rows.append(event)
        self._extend_batch(rows)

    def _flush_folds(self) -> None:
        """What the folder holds back goes into the batch: a batch written is everything composed so far."""
        if self._folder is not None and self._folder.pending:
            self._extend_batch(self._folder.flush())

    def _extend_batch(self, rows: list) -> None:
        for row in rows:
            if type(row) is list and row[_REPEATS] is not None:
                self._batch_folded += row[_REPEATS] - 1  # the events it stands for besides itself
        if self._sink.rows:
            self._batch.extend(rows)
        else:
            self._batch.extend(row if type(row) is dict else dict(zip(FIELD_NAMES, row)) for row in rows)

    def _compose(self, event: dict | list | PendingRow) -> list | dict | None:
        """One queued event as the sink takes it: built, stamped, its records resolved or stripped."""
        if type(event) is PendingRow:
            event = self._build(event)
            if event is None:
                return None
        # A row stays a row for the folder, which hands it to a sink of dicts as a dict (_extend_batch).
        as_rows = self._sink.rows or (self._folder is not None and type(event) is not dict)
        if type(event) is dict:
            if as_rows:
                event = [event.get(name) for name in FIELD_NAMES]
        elif not as_rows:
            event = dict(zip(FIELD_NAMES, event))
        if as_rows:
            if event[_VERSION] is None:
                event[_VERSION] = SCHEMA_VERSION
            if event[_PROXY] is None:
                event[_PROXY] = self.proxy_id
            partitions = event[_PARTITIONS]
            if partitions is not None:
                if self.level == "headers":
                    event[_PARTITIONS] = None
                    event[_UPSTREAM] = None
                elif isinstance(partitions, RawPartitions):
                    event[_PARTITIONS] = self._resolve(partitions)
        else:
            if event.get("schema_version") is None:
                event["schema_version"] = SCHEMA_VERSION
            if event.get("proxy_id") is None:
                event["proxy_id"] = self.proxy_id
            partitions = event.get("partitions")
            if partitions is not None:
                if self.level == "headers":
                    event["partitions"] = None
                    event["upstream_partitions"] = None
                elif isinstance(partitions, RawPartitions):
                    event["partitions"] = self._resolve(partitions)
        return event

    def _resolve(self, partitions: RawPartitions) -> list[dict] | None:
        """Scan a frame's batches in place and queue its raw batches for the side file."""
        try:
            return partitions.resolve(self._sink)
        except Exception:  # noqa: BLE001 - one bad frame must not stop the writer
            log.exception("records of a trace event not traced: scanning them failed")
            return None
        finally:
            pooled = getattr(partitions, "pooled", None)
            if pooled is not None:
                partitions.pooled = None  # type: ignore[attr-defined]
                self._sink.give_back_after_write(pooled)

    def _build(self, deferred: PendingRow) -> list | None:
        """Build an event the data path handed over unbuilt."""
        try:
            return deferred.build()
        except Exception:  # noqa: BLE001 - one bad event must not stop the writer
            log.exception("trace event dropped: building it failed")
            raw = deferred.raw
            if isinstance(raw, RawPartitions):
                raw._scanned()  # noqa: SLF001 - its bytes are gone with the event
            self.unwritable += 1
            metrics.trace_events.labels("dropped").inc()
            return None
