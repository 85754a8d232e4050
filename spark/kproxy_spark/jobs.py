"""The analysis job: read a history (and traces), run every check, write
report.json and report.html.

Run it with `kproxy analyze`, `python -m kproxy_spark.jobs`, or on a cluster
through the entry script beside this package (docs/analysis.md):

    spark-submit --master spark://host:7077 --py-files kproxy-analysis.zip \\
        spark/jobs.py --history H --traces D --out O

It only wires input and output; the checks live in kproxy_spark.checks and
kproxy_spark.wire.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from kproxy_spark.cluster import ClusterSetupError, is_local, prepare_cluster, prepare_connect
from kproxy_spark.inputs import RemoteInputError, is_remote, local_path
from kproxy_spark.report import (
    EXIT_INTERNAL,
    EXIT_USAGE,
    build_report,
    describe_jobs,
    exit_code,
    format_summary,
    write_json,
)
from kproxy_spark.traces import TRACE_SUFFIXES

Progress = Callable[[str], None]


def _quiet(_: str) -> None:
    pass


#: Below this much input a driver JVM started for one analysis pays more for
#: its optimising JIT, and for compiling Java for each stage, than it gains:
#: a 10-operation analysis 10.8 s -> 8.0 s; the noida demo's 17 MB 37.1 s ->
#: 31.9 s; 10,000 operations with traces (50 MB) 41.7 s -> 33.3 s. Above it
#: the rows are the work: a million operations' history (321 MB) took 121 s
#: on the quick tier, interpreted, against 71 s; 100,000 with traces (508 MB)
#: 142 s against 115 s (docs/performance-analysis.md, "The quick JIT tier"
#: and "Ten to a million operations").
QUICK_START_BYTES = 64 * 1024 * 1024


class JobCounter:
    """How many Spark jobs the analysis launched: every job it runs is in one
    job group, which Spark's status tracker lists.

    A Spark Connect client has neither (no SparkContext on its side, and
    Connect offers no job listing): there the count is None, reported as not
    available rather than guessed."""

    def __init__(self, spark) -> None:
        import uuid

        from kproxy_spark.session import is_connect

        self._context = None if is_connect(spark) else spark.sparkContext
        self._group = f"kproxy-analyze-{uuid.uuid4().hex}"

    @property
    def group(self) -> str | None:
        """The job group, on a session that has them."""
        return self._group if self._context is not None else None

    def join(self) -> None:
        """Put the calling thread's jobs in the group (a per-thread setting)."""
        if self._context is not None:
            self._context.setJobGroup(self._group, "kproxy analyze")

    def count(self) -> int | None:
        if self._context is None:
            return None
        return len(self._context.statusTracker().getJobIdsForGroup(self._group))

    def stages(self) -> int | None:
        """The stages the analysis's jobs ran: a stage whose output an earlier
        job had kept is listed by its job but skipped, and is not counted."""
        if self._context is None:
            return None
        tracker = self._context.statusTracker()
        ran = set()
        for job in tracker.getJobIdsForGroup(self._group):
            info = tracker.getJobInfo(job)
            for stage in info.stageIds if info is not None else ():
                stage_info = tracker.getStageInfo(stage)
                if stage_info is not None and stage_info.numCompletedTasks > 0:
                    ran.add(stage)
        return len(ran)


def _input_bytes(history_path, traces_dir) -> int:
    """Bytes the analysis reads, before Spark starts: an input on a Hadoop file system counts as large
    (sized once the session can list it: _sized_input)."""
    if is_remote(history_path) or is_remote(traces_dir):
        return 1 << 40
    return sum(_local_bytes(path) for path in (history_path, traces_dir) if path is not None)


def _local_bytes(path) -> int:  # a path or a file:// URI
    local = Path(local_path(path))
    if local.is_file():
        return local.stat().st_size
    return sum(p.stat().st_size for p in local.rglob("*") if p.is_file())


def _sized_input(spark, history_path, traces_dir, input_bytes: int) -> int:
    """`input_bytes`, with inputs on a Hadoop file system sized there (what the session is sized to)."""
    from kproxy_spark.inputs import HadoopPath
    from kproxy_spark.session import is_connect

    if not (is_remote(history_path) or is_remote(traces_dir)) or is_connect(spark):
        return input_bytes  # all local, or no JVM to ask
    return sum(HadoopPath(spark, str(path)).size() if is_remote(path) else _local_bytes(path)
               for path in (history_path, traces_dir) if path is not None)


def _absolute(path):  # noqa: ANN001, ANN202 - a path, a URL or None, the same back
    """A local path made absolute; a URL (hdfs://, s3a://) or None as it is."""
    if path is None or "://" in str(path):
        return path
    return str(Path(path).resolve())


class InputError(Exception):
    """The history or traces cannot be read (exit code 2)."""



def check_trace_versions(traces_dir: str | os.PathLike) -> None:
    """Refuse, before any Spark job, a trace file written under a schema version this kproxy does not read.

    A newer writer's trace must not be read as if it were an older one (a
    checker never calls valid what it could not read).
    """
    from kproxy.obs.trace_files import TraceFileError, check_file_version

    for path in sorted(Path(local_path(traces_dir)).rglob("*")):
        if path.is_file() and path.name.endswith(TRACE_SUFFIXES):
            try:
                check_file_version(path)
            except TraceFileError as exc:
                raise InputError(str(exc)) from None


def check_remote_inputs(spark, history_path, traces_dir) -> None:
    """What analyze() checks of local inputs before Spark starts, for inputs on a Hadoop file system
    (hdfs://, s3a://, viewfs://): that they are there, and the traces' schema versions. No Spark job."""
    from kproxy.obs.trace_files import TraceFileError
    from kproxy_spark.inputs import check_remote_version, require
    from kproxy_spark.session import is_connect

    try:
        if is_remote(history_path) and not is_connect(spark):  # a Connect server reports a missing history itself
            require(spark, str(history_path), "file", "history")
        if is_remote(traces_dir):
            for uri, _ in require(spark, str(traces_dir), "directory", "trace directory").files():
                if uri.endswith(TRACE_SUFFIXES):
                    check_remote_version(spark, uri)
    except (RemoteInputError, TraceFileError) as exc:
        raise InputError(str(exc)) from None


def analyze(
    history_path: str | os.PathLike | None,
    traces_dir: str | os.PathLike | None,
    out_dir: str | os.PathLike,
    master: str = "local[*]",
    isolation: str = "auto",
    progress: Progress = _quiet,
    spark=None,
    ww_deps: bool = True,
    spark_conf: dict[str, str] | None = None,
    broker: dict | None = None,
    before_writing: Callable[[], None] | None = None,
) -> dict:
    """Check the history (and the traces when given); write
    out_dir/report.json and out_dir/report.html; return the report.

    `before_writing`, when given, is called once the report is made and
    before anything is written; what it raises stops the analysis there (the
    CLI's check of a large history's lines, run beside the analysis).

    `spark_conf`: Spark settings for the session this call starts (not for
    a `spark` given). `broker`: the report's `broker` section, when the
    caller knows the broker (`kproxy demo`, `kproxy test`), so that
    report.json and report.html are written once, with it. On a cluster master the executors get kproxy's code
    and their Python is checked before any input is read
    (kproxy_spark.cluster); a cluster they cannot run the analysis on raises
    ClusterSetupError."""
    derived = history_path is None
    if derived and traces_dir is None:
        raise InputError("give a history, traces, or both: without a history the verdict is derived from the traces")
    # Inputs on a Hadoop file system (hdfs://, s3a://) are checked once the session can reach them.
    if not derived and not is_remote(history_path) and not Path(local_path(history_path)).is_file():
        raise InputError(f"history not found: {history_path}")
    if traces_dir is not None and not is_remote(traces_dir) and not Path(local_path(traces_dir)).is_dir():
        raise InputError(f"trace directory not found: {traces_dir}")
    if traces_dir is not None and not is_remote(traces_dir):
        check_trace_versions(traces_dir)
    from kproxy.workload.names import NamesFormatError, load_names

    try:
        # Imported Jepsen histories keep their keyword/string keys and values here.
        names = None if derived else load_names(history_path)
    except NamesFormatError as exc:
        raise InputError(str(exc)) from None
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)

    started = time.monotonic()
    phases: dict[str, float] = {}

    def step(message: str) -> None:
        # The elapsed time tells where a long analysis spends it.
        progress(f"{message} (at {time.monotonic() - started:.1f} s)")

    input_bytes = _input_bytes(history_path, traces_dir)
    from kproxy_spark.session import is_connect_url

    # A Connect session this call opens is closed at its end: the server
    # keeps a session's cached and checkpointed rows until then.
    owned_connect = spark is None and is_connect_url(master)
    if spark is None:
        step(f"connecting to Spark Connect ({master})" if owned_connect else f"starting Spark ({master})")
        from kproxy_spark.session import get_session

        spark = get_session(master, quick_start=input_bytes < QUICK_START_BYTES, conf=spark_conf)
        phases["spark_start"] = round(time.monotonic() - started, 3)
    try:
        check_remote_inputs(spark, history_path, traces_dir)
        input_bytes = _sized_input(spark, history_path, traces_dir, input_bytes)
        return _analyze_in(spark, history_path, traces_dir, out, derived, names, isolation, ww_deps, broker,
                           input_bytes, started, phases, step, before_writing)
    finally:
        if owned_connect:
            try:
                spark.stop()
            except Exception:  # noqa: BLE001 - a server already gone has freed the session; the analysis's own error counts
                pass


def _analyze_in(spark, history_path, traces_dir, out: Path, derived: bool, names, isolation: str, ww_deps: bool,
                broker: dict | None, input_bytes: int, started: float, phases: dict[str, float],
                step: Progress, before_writing: Callable[[], None] | None = None) -> dict:
    """analyze()'s work once it has a session."""
    from kproxy_spark.checks import (
        allowed_anomalies,
        cases_of,
        summary,
        summary_counts,
        unseen_series,
    )
    from kproxy_spark.checks.kernel import UNSEEN_BUCKET_NS
    from kproxy_spark.checks.keypass import run_pass
    from kproxy_spark.history import load_history
    from kproxy_spark.report import history_timeline, history_totals, read_timeline
    from kproxy_spark.session import is_connect

    def timed(phase: str, work: Callable[[], object]) -> Callable[[], object]:
        def run() -> object:
            begun = time.monotonic()
            jobs.join()  # Spark's job group is per thread
            try:
                return work()
            finally:
                phases[phase] = round(time.monotonic() - begun, 3)
                step(f"{phase.replace('_', ' ')} done")
        return run

    connect = is_connect(spark)
    if connect:
        # The server reads the inputs, from its own working directory: a
        # relative path means where the command runs, as in local mode.
        history_path, traces_dir = (_absolute(path) for path in (history_path, traces_dir))
        begun = time.monotonic()
        prepare_connect(spark, step)
        phases["cluster_setup"] = round(time.monotonic() - begun, 3)
        step("Spark Connect: the analysis's Spark jobs are not counted (Connect has no status tracker); "
             "report.json says spark_jobs and spark_stages: null")
    elif not is_local(spark.sparkContext.master):
        begun = time.monotonic()
        prepare_cluster(spark, step)
        phases["cluster_setup"] = round(time.monotonic() - begun, 3)
    jobs = JobCounter(spark)
    from kproxy_spark.session import size_for_input, storage_level

    size_for_input(spark, input_bytes, QUICK_START_BYTES)
    traces = None
    derivation: dict = {}
    if derived:
        # The history is the trace's account of the clients (kproxy_spark.derived).
        cached = []
        traces, parts, ops, derivation = _derived_history(spark, traces_dir, isolation, step, cached)
        phases["derive_history"] = round(time.monotonic() - started - phases.get("spark_start", 0.0), 3)
    else:
        # Parsed once: the statistics, the pass and the wire job all read the
        # operations, and parsing JSON costs more than reading kept rows back.
        ops = load_history(spark, str(history_path)).persist(storage_level(spark))
        cached = [ops]
        parts = None

    def history_stats() -> tuple[dict, list, dict]:
        describe_jobs(ops, "history totals")
        summary_rows = summary(ops).collect()
        totals = history_totals(summary_rows)
        if not totals["ops"]:
            return totals, summary_rows, {}
        found: dict = {}
        describe_jobs(ops, "history timeline")
        found["txn_outcomes"], found["final_reads"] = read_timeline(history_timeline(ops, totals).collect())
        return totals, summary_rows, found

    def history_checks() -> tuple[dict, list, dict]:
        describe_jobs(ops, "history checks: one grouped pass per key")
        result = run_pass(ops, ww_deps)
        return cases_of(result), unseen_series(result, UNSEEN_BUCKET_NS), result.micro_ops

    def wire() -> tuple[dict, dict, object]:
        from kproxy_spark.traces import load_traces
        from kproxy_spark.wire import read_wire_rows
        from kproxy_spark.wire.frame import checks_frame, kept_views

        read = traces
        if read is None:
            # lean: an idle consumer's repeated empty Fetch responses keep their
            # events but not their partitions (nothing the checks read is lost).
            read = load_traces(spark, traces_dir, lean=True).cache()
            cached.append(read)
        describe_jobs(read, "wire checks and statistics")
        views = kept_views(ops, read, isolation, cached, parts)
        # The views stay kept: the report's pictures read a few of their rows again.
        return (*read_wire_rows(checks_frame(views).collect()), views)

    # The three are independent: run concurrently, Spark interleaves their
    # jobs (the history pass is mostly Python, the wire job mostly JVM).
    step(f"checking {'the history derived from ' + str(traces_dir) if derived else history_path}"
         + (f" and {traces_dir}" if traces_dir is not None and not derived else ""))
    from kproxy_spark.progress import watch_jobs

    with watch_jobs(spark, jobs.group, step), \
            ThreadPoolExecutor(max_workers=3, thread_name_prefix="kproxy-analyze") as pool:
        stats_job = pool.submit(timed("history_stats", history_stats))
        checks_job = pool.submit(timed("history_checks", history_checks))
        wire_job = pool.submit(timed("wire_checks", wire)) if traces_dir is not None else None
        totals, summary_rows, timeline = stats_job.result()
        history_cases, unseen, micro_ops = checks_job.result()
        wire_cases, wire_stats, views = wire_job.result() if wire_job is not None else ({}, {}, None)
    if derived and "unseen" in history_cases:
        from kproxy_spark.derived.describe import set_aside_deleted

        history_cases["unseen"] = set_aside_deleted(history_cases["unseen"], derivation)
    if not totals["ops"]:
        raise InputError(f"no operations in {history_path}" if not derived else
                         f"the traces in {traces_dir} show no client sending or reading a record")
    stats: dict = {**summary_counts(summary_rows, micro_ops), **timeline}
    stats["completed_ops"] = totals["completed"]
    stats["history_start_ns"] = totals["start"]
    subscribe = totals["subscribe"]
    stats["subscribe"] = subscribe
    stats["ww_deps"] = ww_deps
    stats["unseen_over_time"] = unseen
    if names is not None:
        stats["names"] = names
    if derived:
        stats["derived_history"] = derivation
    stats.update(wire_stats)
    from kproxy_spark.attribution import attribute_run
    from kproxy_spark.report import INFORMATIONAL

    attribute_run(history_cases, wire_cases, INFORMATIONAL)

    report = build_report(history_cases, wire_cases, stats,
                          allowed=allowed_anomalies(subscribe=subscribe, ww_deps=ww_deps))
    if broker is not None:
        report["broker"] = broker
    if views is not None:
        begun = time.monotonic()
        from kproxy_spark.drawings.wire_story import attach_wire_stories

        describe_jobs(ops, "the first cases' exchanges, for their pictures")
        jobs.join()
        attach_wire_stories(report["anomalies"], views)
        phases["wire_stories"] = round(time.monotonic() - begun, 3)
        step("wire stories done")
    if before_writing is not None:
        try:
            before_writing()
        except BaseException:
            _release(cached)
            raise
    step("rendering report.html")
    rendering = time.monotonic()
    from kproxy_spark.html import write_html

    write_html(report, str(out / "report.html"))
    phases["render"] = round(time.monotonic() - rendering, 3)
    describe_jobs(ops, None)
    _release(cached)
    step("done")
    report["stats"]["elapsed_s"] = round(time.monotonic() - started, 3)
    report["stats"]["phases_s"] = phases
    report["stats"]["spark_jobs"] = jobs.count()
    report["stats"]["spark_stages"] = jobs.stages()
    write_json(report, str(out / "report.json"))
    return report


def _release(cached: list) -> None:
    """Drop the rows this analysis kept; only its own: others may share the session."""
    for frame in cached:
        frame.unpersist()


def _derived_history(spark, traces_dir, isolation: str, step: Progress, held: list):
    """(the traces with their records identified, the wire views of them alone, the derived operations,
    what the derivation saw); what is kept is appended to `held`."""
    from kproxy_spark.derived import describe, identity
    from kproxy_spark.derived.history import clock_offsets, derive_history
    from kproxy_spark.session import one_partition, storage_level
    from kproxy_spark.traces import load_traces
    from kproxy_spark.wire.views import wire_parts

    step(f"deriving the clients' history from {traces_dir}")
    raw = load_traces(spark, traces_dir, lean=True).cache()
    keys = identity.collect_keys(raw)
    if not keys.records:
        raw.unpersist()
        raise InputError(
            f"the traces in {traces_dir} carry no records: a verdict without a history needs the proxy's trace "
            "level `records` (kproxy run --trace-level records), which keeps every record sent and fetched")
    # Every reader downstream reads the identified records: rewrite them once and keep that instead.
    traces = identity.identify_records(raw, keys).persist(storage_level(spark))
    held.append(traces)
    clock = clock_offsets(traces)  # the job that fills the kept frame
    raw.unpersist()
    traces = one_partition(traces)
    # Built once: the derivation reads them, and so do the wire checks.
    parts = wire_parts(traces, isolation, held)
    # Checkpointed: the checks then plan over stored rows, not over the derivation's joins and windows.
    ops = derive_history(spark, traces, keys, isolation, clock, parts).localCheckpoint(eager=True)
    held.append(ops)
    return traces, parts, ops, {**describe.derivation(ops, keys), "deleted_topics": describe.deleted_topics(traces)}


def main(argv: list[str] | None = None) -> int:
    """spark-submit entry point; exit codes as `kproxy analyze`."""
    parser = argparse.ArgumentParser(prog="spark/jobs.py", description="kproxy analysis job")
    parser.add_argument("--history", required=True, help="client history (JSON Lines)")
    parser.add_argument("--traces", help="trace directory (*.jsonl / *.parquet)")
    parser.add_argument("--out", required=True, help="output directory for report.json and report.html")
    parser.add_argument("--master", default=None,
                        help="Spark master; default: the one spark-submit set, else local[*]")
    parser.add_argument("--isolation", default="auto", choices=["auto", "read_committed", "read_uncommitted"])
    parser.add_argument("--ww-deps", dest="ww_deps", action=argparse.BooleanOptionalAction, default=True,
                        help="infer write-write dependencies from offsets (Jepsen's --ww-deps)")
    parser.add_argument("--quiet", action="store_true")
    args = parser.parse_args(argv)
    progress = _quiet if args.quiet else (lambda msg: print(f"[analyze] {msg}", file=sys.stderr, flush=True))
    from kproxy_spark.session import ConnectError

    spark = None
    if args.master is None:
        # Under spark-submit the master comes from --master there; keep it.
        from pyspark.sql import SparkSession

        spark = (SparkSession.builder.appName("kproxy-analyze")
                 .config("spark.sql.adaptive.enabled", "true").getOrCreate())
        spark.sparkContext.setLogLevel("WARN")
        from kproxy_spark.session import pin_jvm_names

        pin_jvm_names(spark)
    try:
        report = analyze(args.history, args.traces, args.out, args.master or "local[*]",
                         args.isolation, progress, spark=spark, ww_deps=args.ww_deps)
    except (InputError, ClusterSetupError, ConnectError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except Exception as exc:  # noqa: BLE001 - the exit code must say "internal error"
        print(f"internal error: {type(exc).__name__}: {exc}", file=sys.stderr)
        return EXIT_INTERNAL
    print(format_summary(report, args.out))
    return exit_code(report)


if __name__ == "__main__":
    sys.exit(main())
