"""The trace writer: takes trace events from the proxy and writes them to rotating files.

Threading model. The proxy builds each event as a plain dict (field names from
kproxy.obs.trace_schema) on the trio thread, or, for frames its fast path
forwards untouched, hands over a tuple `(builder, *args)` that the worker
turns into a row in schema order (so the data path does not pay for it), and hands it
over with `offer()`. Handing over is a length check and a
`deque.append` (thread-safe in CPython for one producer and one consumer), so
it costs well under a microsecond and never touches the disk. A plain
`threading.Thread` owned by the writer wakes every `flush_interval` seconds
(sooner when the queue is half full or a producer waits for room), drains the
deque and writes it: one fixed-layout segment per batch (the default,
kproxy.obs.trace_segments; the data path's tuples become rows in schema
order, never dicts), or JSON lines serialised with orjson, or a pyarrow row
group.
A dedicated thread rather than `trio.to_thread` per batch: one long-lived
worker keeps the file handle and rotation state in one place and costs no
thread hand-off per batch.

Durability. Every batch is written with one unbuffered `write()` per segment or line run,
so when the worker goes back to sleep the kernel has the whole batch: a
SIGKILL of the proxy leaves each segment file readable up to its last complete
segment and each JSONL file up to the last written line (readers skip a torn
tail; see kproxy.obs.trace_files). Nothing is
fsynced: surviving a machine crash is not a goal, surviving a killed proxy is.

The deque, not the disk, is the bound: at most `queue_size` events wait. When
it is full, `on_full` decides: "block" (the default) makes `offer()` return
False and the caller awaits `put()`, so the proxy slows down rather than lose
evidence; "drop" counts the event in kproxy_trace_events_total{outcome="dropped"}
and lets traffic go on at full speed (production taps).
"""

from __future__ import annotations

import ctypes
import logging
import os
import re
import sys
import threading
import time
from collections import deque
from pathlib import Path
from typing import Any, Literal

import orjson
import trio

from kproxy.obs import metrics
from kproxy.obs.trace_files import TRACE_NAME
from kproxy.obs.trace_records import RawLedger, RawPartitions
from kproxy.obs.trace_schema import FIELD_NAMES, SCHEMA_VERSION
from kproxy.obs.trace_segments import SUFFIX as SEGMENT_SUFFIX
from kproxy.obs.trace_segments import encode_rows_checked, file_header, json_default

log = logging.getLogger(__name__)

Level = Literal["headers", "records"]
Format = Literal["segments", "jsonl", "parquet"]
OnFull = Literal["block", "drop"]

MiB = 1024 * 1024

# Names that are safe in a file name on every platform we care about.
_PROXY_ID = re.compile(r"^[A-Za-z0-9._]+(?:-[A-Za-z0-9._]+)*$")

# Upper bound on events serialised per write: bounds the worker's memory for
# one batch independently of queue_size.
_MAX_BATCH = 512

# The worker and the proxy's event loop share one GIL. A thread that wants it
# waits until the holder releases it, or for the interpreter's switch
# interval (5 ms by default) before it asks the holder to hand it over. A
# flush at level `records` (scanning frames, storing side bytes, packing the
# segment) is about 1 ms of Python at 500 records/s, and a request that
# arrived meanwhile waited for the rest of it: the tracing proxy's p99 was
# 1.3 ms above the plain proxy's. While it has work, the worker lowers the
# switch interval to this, so the event loop waits at most about that long.
# Measured at 500 records/s (p99 above the plain proxy's, median of 5 paired
# rounds): +0.40 ms with the default, +0.22 with 0.2 ms, +0.09 with 0.05 ms,
# and CPU per record on the throughput workloads did not move between 0.2
# and 0.05 ms. It costs nothing while nobody waits; handing the GIL back and
# forth costs a thread switch each way when both want it. Writes release the
# GIL too, but the worker takes it straight back before a waiting thread has
# woken up, and a voluntary yield per slice (time.sleep(0)) cost the worker
# ~45 µs of CPU each, waiting or not.
_RECORDS_SWITCH_INTERVAL = 0.00005

# Side bytes written back and dropped from the page cache at a time (_Sink._recycle_side_pages).
_SIDE_RECYCLE_BYTES = 8 * MiB
# Buffers per writev (the kernel's IOV_MAX).
_IOV_MAX = os.sysconf("SC_IOV_MAX") if hasattr(os, "sysconf") else 1024

_VERSION = FIELD_NAMES.index("schema_version")
_PROXY = FIELD_NAMES.index("proxy_id")
_PARTITIONS = FIELD_NAMES.index("partitions")
_UPSTREAM = FIELD_NAMES.index("upstream_partitions")


def _keep_freed_frame_memory(queue_bytes: int) -> None:
    """Level `records`: freed frames' memory stays in the process for the next frames.

    At this level every Produce request and Fetch response (up to MiBs each)
    is gathered whole and waits in the writer's queue until the writer has
    copied its batches and frees it. glibc serves blocks that large with mmap,
    and trims the heap's free top once it passes twice the largest block seen,
    so the next frames landed on fresh pages: a page fault per 4 KiB traced,
    each far dearer than the copy into it on this project's VMs (see
    _Sink._recycle_side_pages). Fixed thresholds keep up to twice the
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
    """The writer's worker failed (e.g. the disk is full); no more events are accepted."""


def trace_file_name(proxy_id: str, started_wall: float, seq: int, fmt: Format) -> str:
    """`trace-<proxy_id>-<UTC yyyymmddThhmmss>-<seq>.<fmt>`; seq is zero-padded so names sort."""
    stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(started_wall))
    suffix = SEGMENT_SUFFIX if fmt == "segments" else f".{fmt}"
    return f"trace-{proxy_id}-{stamp}-{seq:06d}{suffix}"


class _Sink:
    """One output format: opens files lazily, writes batches, rotates.

    `rows`: whether `write()` takes rows (lists in trace_schema.EVENT order) rather than dicts.
    """

    rows = False

    def __init__(self, directory: Path, proxy_id: str, fmt: Format, rotate_bytes: int, rotate_seconds: float) -> None:
        self.directory = directory
        self.proxy_id = proxy_id
        self.fmt = fmt
        self.rotate_bytes = rotate_bytes
        self.rotate_seconds = rotate_seconds
        self.path: Path | None = None
        self.size = 0
        self.opened_mono = 0.0
        self.next_seq = self._first_free_seq()
        self.files: list[Path] = []
        self.side_files: list[Path] = []
        # The side file of the open trace file: raw record batches (level
        # `records`), appended and referenced by (name, offset, length) from
        # the events. Its bytes always reach the kernel before the lines that
        # reference them, so a killed writer never leaves a dangling reference.
        self._side = None
        self._side_name = ""
        self.side_size = 0
        self._side_pending: list[memoryview] = []
        self._side_pending_size = 0
        # Side bytes up to here are on disk and out of the page cache (_recycle_side_pages).
        self._side_dropped = 0
        self._side_recycle = hasattr(os, "posix_fadvise")
        # Regions already in the open side file, by (topic, partition, base offset, length, hash).
        self._side_index: dict[tuple, tuple[str, int]] = {}

    def _first_free_seq(self) -> int:
        # A restarted proxy with the same id continues the sequence, so its
        # files never collide with (or sort before) the previous run's, its
        # rotated files compressed since (`.jsonl.gz`) included.
        seqs = [int(m["seq"]) for p in self.directory.iterdir()
                if (m := TRACE_NAME.match(p.name)) and m["proxy"] == self.proxy_id]
        return max(seqs, default=-1) + 1

    def _open(self) -> None:
        name = trace_file_name(self.proxy_id, time.time(), self.next_seq, self.fmt)
        self.next_seq += 1
        self.path = self.directory / name
        self.size = 0
        self.opened_mono = time.monotonic()
        self._open_file(self.path)
        self.files.append(self.path)

    def rotate_if_old(self) -> None:
        """Time rotation, checked on every wake so an idle file still gets closed (Parquet gets its footer)."""
        if self.path is not None and time.monotonic() - self.opened_mono >= self.rotate_seconds:
            self.close()

    def ensure_open(self) -> None:
        if self.path is not None and (
            self.size + self.side_size + self._side_pending_size >= self.rotate_bytes
            or time.monotonic() - self.opened_mono >= self.rotate_seconds
        ):
            self.close()
        if self.path is None:
            self._open()

    def close(self) -> None:
        if self.path is not None:
            self.flush_side()
            if self._side is not None:
                self._side.close()
                self._side = None
            self.side_size = 0
            self._side_dropped = 0
            self._side_index = {}
            self._close_file()
            self.path = None

    def store_raw(self, data: memoryview, key: tuple | None = None) -> tuple[str, int]:
        """Queue raw record batches for the side file; returns (file name, offset) they will have.

        With a key, bytes the open side file already holds under it are not written again.
        """
        self.ensure_open()
        if key is not None:
            known = self._side_index.get(key)
            if known is not None:
                return known
        if self._side is None:
            assert self.path is not None
            side = self.path.with_suffix(".records")
            self._side = open(side, "xb", buffering=0)  # noqa: SIM115 - lives until rotation
            self._side_name = side.name
            self.side_files.append(side)
        offset = self.side_size + self._side_pending_size
        self._side_pending.append(data)
        self._side_pending_size += len(data)
        if key is not None:
            self._side_index[key] = (self._side_name, offset)
        return self._side_name, offset

    def flush_side(self) -> None:
        """Hand the queued side bytes to the kernel (before any line that references them).

        One writev of the frames' own bytes: joining them first copied every
        traced byte once more in Python, into a fresh multi-MiB buffer per flush.
        """
        pending = self._side_pending
        if not pending:
            return
        self._side_pending = []
        self._side_pending_size = 0
        fd = self._side.fileno()
        while pending:
            views = pending[:_IOV_MAX]
            n = os.writev(fd, views)
            self.side_size += n
            # A regular file takes the whole vector; a short write leaves the rest for the next call.
            done = 0
            for view in views:
                if n < len(view):
                    break
                n -= len(view)
                done += 1
            if n:
                pending[done] = pending[done][n:]
            del pending[:done]
        self._recycle_side_pages()

    def _recycle_side_pages(self) -> None:
        """Drop side bytes already on disk from the page cache, so new ones reuse its pages.

        Each side byte is written once and read only by the analysis, later.
        Left in the page cache, a run's side files take fresh pages for every
        byte, and a fresh page costs the writing thread far more than the copy
        into it: on this project's VMs 2 ms of CPU per MiB (0.5 GB/s), against
        0.2-0.3 ms per MiB through pages freed a moment ago. Writing back and
        dropping every _SIDE_RECYCLE_BYTES keeps that working set to one
        window, and the trace no longer pushes other files (a broker's log on
        the same machine) out of the cache. The write-back waits for the disk
        on this thread, never on the event loop.
        """
        if not self._side_recycle or self.side_size - self._side_dropped < _SIDE_RECYCLE_BYTES:
            return
        fd = self._side.fileno()
        try:
            os.fdatasync(fd)
            os.posix_fadvise(fd, self._side_dropped, self.side_size - self._side_dropped, os.POSIX_FADV_DONTNEED)
        except OSError as exc:  # a file system without either: keep writing, stop recycling
            log.debug("side file pages not recycled: %s", exc)
            self._side_recycle = False
        self._side_dropped = self.side_size

    # Format-specific parts.
    def _open_file(self, path: Path) -> None:
        raise NotImplementedError

    def _close_file(self) -> None:
        raise NotImplementedError

    def write(self, events: list[dict]) -> int:
        """Write and flush a batch; return how many events were written (the rest were unserialisable)."""
        raise NotImplementedError


class _JsonlSink(_Sink):
    def _open_file(self, path: Path) -> None:
        # Unbuffered: a write() hands whole lines to the kernel, so the process
        # holds no half-written line of its own when it is killed. "x": never
        # overwrite an existing trace.
        self._file = open(path, "xb", buffering=0)  # noqa: SIM115 - lives until rotation

    def _close_file(self) -> None:
        self._file.close()

    def write(self, events: list[dict]) -> int:
        written = 0
        chunk: list[bytes] = []
        chunk_size = 0
        for event in events:
            try:
                line = orjson.dumps(event, default=json_default) + b"\n"
            except TypeError as exc:
                log.error("trace event dropped, not serialisable: %s", exc)
                continue
            if not chunk:
                self.ensure_open()
            chunk.append(line)
            chunk_size += len(line)
            written += 1
            if self.size + chunk_size >= self.rotate_bytes:
                self._write_chunk(chunk, chunk_size)
                chunk, chunk_size = [], 0
        if chunk:
            self._write_chunk(chunk, chunk_size)
        return written

    def _write_chunk(self, chunk: list[bytes], size: int) -> None:
        self.flush_side()
        data = memoryview(b"".join(chunk))
        while data:  # a regular file takes it in one go; loop for the odd short write
            n = self._file.write(data)
            data = data[n:]
        self.size += size


class _SegmentSink(_Sink):
    """Fixed-layout columnar segments (kproxy/obs/trace_segments.py): one segment per flush batch."""

    rows = True

    def _open_file(self, path: Path) -> None:
        # Unbuffered, like JSONL: each segment reaches the kernel in one write().
        self._file = open(path, "xb", buffering=0)  # noqa: SIM115 - lives until rotation
        header = file_header()
        self._file.write(header)
        self.size = len(header)

    def _close_file(self) -> None:
        self._file.close()

    def write(self, events: list[list]) -> int:
        # One segment per batch (up to _MAX_BATCH events): a file may pass
        # rotate_bytes by one segment before it rotates.
        segment, kept = encode_rows_checked(events)
        if not kept:
            return 0
        self.ensure_open()
        self.flush_side()
        data = memoryview(segment)
        while data:
            n = self._file.write(data)
            data = data[n:]
        self.size += len(segment)
        return kept


class _ParquetSink(_Sink):
    def __init__(self, *args: Any) -> None:
        import pyarrow as pa
        import pyarrow.parquet as pq

        from kproxy.obs.trace_schema import arrow_schema

        self._pa, self._pq = pa, pq
        self._schema = arrow_schema()
        super().__init__(*args)

    def _open_file(self, path: Path) -> None:
        self._file = open(path, "xb")  # noqa: SIM115 - lives until rotation
        self._writer = self._pq.ParquetWriter(self._file, self._schema)

    def _close_file(self) -> None:
        self._writer.close()  # writes the footer: only now is the file readable
        self._file.close()

    def write(self, events: list[dict]) -> int:
        rows = self._to_table(events)
        if rows is None or rows.num_rows == 0:
            return 0
        self.ensure_open()
        self.flush_side()
        # One row group per flush batch.
        self._writer.write_table(rows, row_group_size=max(rows.num_rows, 1))
        self._file.flush()
        self.size = self._file.tell()
        return rows.num_rows

    def _to_table(self, events: list[dict]):  # noqa: ANN202 - pyarrow imported lazily
        try:
            return self._pa.Table.from_pylist(events, schema=self._schema)
        except (self._pa.ArrowException, TypeError, ValueError):
            # Find the culprits one by one rather than losing the whole batch.
            good = []
            for event in events:
                try:
                    self._pa.Table.from_pylist([event], schema=self._schema)
                except (self._pa.ArrowException, TypeError, ValueError) as exc:
                    log.error("trace event dropped, does not fit the schema: %s", exc)
                else:
                    good.append(event)
            return self._pa.Table.from_pylist(good, schema=self._schema) if good else None


class TraceWriter:
    """Bounded, off-loop trace writer. See the module docstring for the model and guarantees.

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
        queue_size: int = 65536,
        queue_bytes: int = 128 * MiB,
        on_full: OnFull = "block",
        proxy_id: str,
        flush_interval: float = 0.1,
        close_timeout: float = 30.0,
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

        self.directory.mkdir(parents=True, exist_ok=True)
        sink_type = {"segments": _SegmentSink, "jsonl": _JsonlSink, "parquet": _ParquetSink}[fmt]
        self._sink: _Sink = sink_type(self.directory, proxy_id, fmt, rotate_bytes, rotate_seconds)

        self._queue: deque[dict] = deque()
        # Past this depth offer() wakes the worker instead of letting it sleep out its interval.
        self._wake_at = max(1, queue_size // 2)
        self._wake = threading.Event()
        self._closing = False  # set on the trio thread: no more events accepted
        self._stopping = False  # tells the worker to drain once more and exit
        self._failure: BaseException | None = None
        self._room_wanted = False
        self._room: trio.Event | None = None
        self._token: trio.lowlevel.TrioToken | None = None
        self._thread: threading.Thread | None = None
        self._done = trio.Event()

        self.accepted = 0  # trio thread only
        self.dropped = 0  # trio thread only
        self.written = 0  # worker thread only; events whose lines are in the kernel's hands
        self.unwritable = 0  # worker thread only; events that did not serialise (also counted as dropped)

        metrics.trace_queue_depth.set_function(lambda: len(self._queue))

    @property
    def records(self) -> bool:
        """Whether events should carry per-partition records (level 'records')."""
        return self.level == "records"

    @property
    def files(self) -> list[Path]:
        """Files this writer has opened, in order."""
        return list(self._sink.files)

    # ---- trio side -------------------------------------------------------

    def offer(self, event: dict | tuple) -> bool:
        """Hand an event over without blocking.

        Returns False only when the caller must `await put(event)`: in block
        mode with a full queue. In drop mode a full queue drops and counts the
        event and the call returns True (nothing for the caller to do).
        """
        queue = self._queue
        if len(queue) < self._wake_at and not self._closing and self.raw_ledger.held < self.queue_bytes // 2:
            queue.append(event)
            self.accepted += 1
            return True
        return self._offer_slow(event)

    def _has_room(self) -> bool:
        # An empty queue takes any event, however large its frame: it cannot wait for itself.
        queue = self._queue
        return len(queue) < self.queue_size and (not queue or self.raw_ledger.held < self.queue_bytes)

    def _offer_slow(self, event: dict | tuple) -> bool:
        self._check_usable()
        if self._closing:
            self._count_drop(event)
            return True
        self._wake.set()
        if self._has_room():
            self._queue.append(event)
            self.accepted += 1
            return True
        if self.on_full == "drop":
            self._count_drop(event)
            return True
        return False

    async def put(self, event: dict | tuple) -> None:
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
                self._wake.set()
                # The worker normally wakes us; the deadline only covers the
                # race where it drained just before seeing _room_wanted.
                with trio.move_on_after(self.flush_interval):
                    await self._room.wait()
        finally:
            metrics.trace_wait.inc(trio.current_time() - started)

    def _count_drop(self, event: dict | tuple) -> None:
        self.dropped += 1
        metrics.trace_events.labels("dropped").inc()
        raw = event[5] if type(event) is tuple and len(event) > 5 else event.get("partitions") if type(event) is dict else None
        if isinstance(raw, RawPartitions):
            raw.drop()

    def _check_usable(self) -> None:
        if self._failure is not None:
            raise TraceWriterError(f"trace writer failed: {self._failure!r}") from self._failure

    def _room_available(self) -> None:
        # Runs on the trio thread (scheduled by the worker).
        if self._room is not None:
            self._room.set()
            self._room = None

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Run the worker thread until `aclose()` (or cancellation, which also writes everything accepted)."""
        if self._thread is not None or self._stopping:
            raise RuntimeError("TraceWriter.run() can only be started once")
        self._token = trio.lowlevel.current_trio_token()
        self._thread = threading.Thread(target=self._work, name=f"trace-writer-{self.proxy_id}", daemon=True)
        self._thread.start()
        task_status.started()
        try:
            await self._done.wait()
        finally:
            await self._shutdown()
        self._check_usable()

    async def aclose(self) -> None:
        """Stop accepting, write every accepted event, close the files. Idempotent."""
        self._closing = True
        if self._thread is None and not self._stopping:
            # Never started: drain what was offered on a thread of our own.
            self._stopping = True
            with trio.CancelScope(shield=True):
                await trio.to_thread.run_sync(self._drain_and_close)
            self._check_usable()
            return
        await self._shutdown()
        self._check_usable()

    async def _shutdown(self) -> None:
        self._closing = True
        self._stopping = True
        self._wake.set()
        thread = self._thread
        if thread is None:
            return
        # Shielded: a cancelled nursery must still get its accepted events on disk.
        with trio.CancelScope(shield=True):
            with trio.move_on_after(self.close_timeout) as scope:
                await trio.to_thread.run_sync(thread.join)
            if scope.cancelled_caught:
                log.error("trace writer did not finish within %.1fs; %d events not written", self.close_timeout, len(self._queue))

    # ---- worker thread ---------------------------------------------------

    def _work(self) -> None:
        try:
            while True:
                self._wake.wait(self.flush_interval)
                self._wake.clear()
                # Read the stop flag before draining: everything accepted
                # before stop was asked for is then in the deque we drain.
                stopping = self._stopping
                self._write_queued()
                if stopping:
                    break
                self._sink.rotate_if_old()
        except BaseException as exc:  # noqa: BLE001 - reported to the trio side
            log.exception("trace writer failed")
            self._failure = exc
        finally:
            try:
                self._sink.close()
            except Exception as exc:  # noqa: BLE001
                log.exception("closing the trace file failed")
                self._failure = self._failure or exc
            self._call_soon_on_trio(self._done.set)
            self._call_soon_on_trio(self._room_available)

    def _drain_and_close(self) -> None:
        try:
            self._write_queued()
        except BaseException as exc:  # noqa: BLE001
            self._failure = exc
        finally:
            self._sink.close()

    def _write_queued(self) -> None:
        if self.level != "records" or not self._queue:
            self._write_queue()
            return
        default = sys.getswitchinterval()
        sys.setswitchinterval(min(default, _RECORDS_SWITCH_INTERVAL))
        try:
            self._write_queue()
        finally:
            sys.setswitchinterval(default)

    def _write_queue(self) -> None:
        queue = self._queue
        strip_records = self.level == "headers"
        as_rows = self._sink.rows
        names = FIELD_NAMES
        while queue:
            batch = []
            for _ in range(min(len(queue), _MAX_BATCH)):
                event = queue.popleft()
                if type(event) is tuple:
                    event = self._build(event)
                    if event is None:
                        continue
                if type(event) is dict:
                    if as_rows:
                        event = [event.get(name) for name in names]
                elif not as_rows:
                    event = dict(zip(names, event))
                if as_rows:
                    if event[_VERSION] is None:
                        event[_VERSION] = SCHEMA_VERSION
                    if event[_PROXY] is None:
                        event[_PROXY] = self.proxy_id
                    partitions = event[_PARTITIONS]
                    if partitions is not None:
                        if strip_records:
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
                        if strip_records:
                            event["partitions"] = None
                            event["upstream_partitions"] = None
                        elif isinstance(partitions, RawPartitions):
                            event["partitions"] = self._resolve(partitions)
                batch.append(event)
            written = self._sink.write(batch)
            self.written += written
            metrics.trace_events.labels("written").inc(written)
            if written < len(batch):
                self.unwritable += len(batch) - written
                metrics.trace_events.labels("dropped").inc(len(batch) - written)
            if self._room_wanted:
                self._room_wanted = False
                self._call_soon_on_trio(self._room_available)

    def _resolve(self, partitions: RawPartitions) -> list[dict] | None:
        """Scan a frame's batches in place and queue its raw batches for the side file."""
        try:
            return partitions.resolve(self._sink.store_raw)
        except Exception:  # noqa: BLE001 - one bad frame must not stop the writer
            log.exception("records of a trace event not traced: scanning them failed")
            return None

    def _build(self, deferred: tuple) -> dict | None:
        """Build a deferred event: (builder, *args) handed over by the data path."""
        try:
            return deferred[0](*deferred[1:])
        except Exception:  # noqa: BLE001 - one bad event must not stop the writer
            log.exception("trace event dropped: building it failed")
            raw = deferred[5] if len(deferred) > 5 else None
            if isinstance(raw, RawPartitions):
                raw._scanned()  # noqa: SLF001 - its bytes are gone with the event
            self.unwritable += 1
            metrics.trace_events.labels("dropped").inc()
            return None

    def _call_soon_on_trio(self, fn: Any) -> None:
        if self._token is None:
            return
        try:
            self._token.run_sync_soon(fn)
        except trio.RunFinishedError:
            pass


def default_proxy_id() -> str:
    """A random id per process, used when the operator does not name the proxy."""
    return f"p{os.getpid()}-{os.urandom(3).hex()}"
