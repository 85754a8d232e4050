"""`kproxy analyze`: check a client history (and the proxy's traces) with Spark."""

from __future__ import annotations

import sys

import click

# Kept in step with kproxy_spark.report (importing it here would pull in Spark for `--help`).
EXIT_VALID, EXIT_INVALID, EXIT_USAGE, EXIT_INTERNAL, EXIT_UNKNOWN = 0, 1, 2, 3, 4

EPILOG = """\b
Exit codes:
  0  valid: no anomaly that counts as an error
  1  invalid: at least one error anomaly (see report.json "errors")
  2  usage or input error (missing or unreadable history / traces;
     a history line that breaks the format: FILE:LINE: message;
     without --history, traces not at level `records`;
     a cluster whose executors cannot run the analysis;
     a Spark Connect server that cannot be reached or refuses a --conf)
  3  internal error (Spark or the analysis failed)
  4  unknown: nothing could be judged, or writes are unseen and the
     history has no final reads

\b
Examples:
  kproxy analyze --history run/history.jsonl --traces run/traces --out run/report
  kproxy analyze --traces app-run/traces --out app-run/report     # any application: history from the wire
  kproxy analyze --history jepsen.jsonl --out report --master spark://host:7077 \\
      --conf spark.pyspark.python=/opt/venv/bin/python
  kproxy analyze --traces run/traces --out run/report --remote sc://spark-connect:15002
"""


def _unreadable_history(history: str) -> str | None:
    """What makes a local history unreadable, as `FILE:LINE: message`, or None.

    The same rules as `kproxy history validate`, checked before Spark starts:
    Spark reads a history leniently (a line it cannot parse is dropped, a key
    that is not an integer becomes null), so a history it misread could come
    out VALID. A URL (hdfs://, s3a://) is Spark's to open and is not checked
    here. Named keys (Jepsen's `:x` or "a") are refused with the way to
    number them: `kproxy history import`.
    """
    from pathlib import Path

    from kproxy.workload.history import HistoryFormatError, validate_history

    if "://" in history or not Path(history).is_file():
        return None  # a missing file is reported by the analysis as `history not found`
    try:
        validate_history(history)
    except HistoryFormatError as exc:
        return f"{exc} (kproxy history validate checks the same; docs/history.md)"
    except OSError as exc:
        return f"{history}: cannot read: {exc.strerror or exc}"
    return None


#: A local history at least this large has its lines checked in a process of its own while Spark starts and
#: reads it (a million operations' history, 190 MB, takes 9.5 s of one core to check); a smaller one is
#: checked first, in a fraction of a second, so a broken line is refused before Spark starts at all.
CHECK_BESIDE_BYTES = 16 * 1024 * 1024


class _HistoryCheckBeside:
    """_unreadable_history of a large local history, in a process of its own beside the analysis.

    A broken line found while the analysis runs cancels its Spark jobs, over
    and over until the analysis gives up, so the error comes as soon as the
    check has it rather than when the analysis would have ended."""

    def __init__(self, history: str) -> None:
        import multiprocessing
        import threading
        from concurrent.futures import ProcessPoolExecutor

        self._history = history
        self._ended = threading.Event()
        self._canceller: threading.Thread | None = None
        # spawn: the analysis's threads (py4j's, Spark's) must not be forked mid-flight.
        self._pool = ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn"))
        self._problem = self._pool.submit(_unreadable_history, history)
        self._problem.add_done_callback(self._stop_the_analysis_if_broken)

    def problem(self) -> str | None:
        """What the check found (waiting for it); the analysis has ended."""
        self._ended.set()
        if self._canceller is not None:
            self._canceller.join()  # no cancellation after this: the session may serve others (tests, callers)
        try:
            return self._problem.result()
        except Exception:  # noqa: BLE001 - its process died (killed, out of memory): check here instead
            return _unreadable_history(self._history)
        finally:
            self._pool.shutdown()

    def _stop_the_analysis_if_broken(self, future) -> None:  # noqa: ANN001 - a Future
        if future.cancelled() or future.exception() is not None or future.result() is None:
            return
        import threading

        self._canceller = threading.Thread(target=self._cancel_spark_jobs, name="history-check-cancel", daemon=True)
        self._canceller.start()

    def _cancel_spark_jobs(self) -> None:
        from pyspark import SparkContext

        # Jobs started between two cancellations (the analysis plans its next) are cancelled at the next.
        while not self._ended.wait(0.2):
            # None on Spark Connect, and without a JVM side while it starts: the gate before writing holds.
            context = SparkContext._active_spark_context
            if context is not None and getattr(context, "_jsc", None) is not None:
                try:
                    context.cancelAllJobs()
                except Exception:  # noqa: BLE001, S112 - a context stopping under us: the analysis is ending anyway
                    continue

    def gate(self) -> None:
        """Raise InputError when the history has a broken line: the report is not written."""
        from kproxy_spark.jobs import InputError

        problem = self.problem()
        if problem is not None:
            raise InputError(problem)


def _checked_beside(history: str | None) -> bool:
    """Whether `history`'s lines are checked beside the analysis rather than before it."""
    from pathlib import Path

    if history is None or "://" in history:
        return False
    try:
        return Path(history).stat().st_size >= CHECK_BESIDE_BYTES
    except OSError:
        return False


def _spark_conf(_ctx: click.Context, _param: click.Parameter, settings: tuple[str, ...]) -> dict[str, str]:
    """--conf KEY=VALUE pairs as a dict; a pair without '=' is a usage error."""
    conf = {}
    for setting in settings:
        key, equals, value = setting.partition("=")
        if not equals or not key.strip():
            raise click.BadParameter(f"{setting!r} is not KEY=VALUE", param_hint="--conf")
        conf[key.strip()] = value
    return conf


def remote_url(_ctx: click.Context, _param: click.Parameter, url: str | None) -> str | None:
    """A Spark Connect URL, sc://HOST[:PORT][/;param=value...]; anything else is a usage error."""
    if url is not None and not url.startswith("sc://"):
        raise click.BadParameter(f"{url!r} is not a Spark Connect URL (sc://HOST:PORT)", param_hint="--remote")
    return url


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--history", "history", type=click.Path(dir_okay=False), default=None,
              help="Client history: JSON Lines of Jepsen-style operations (kproxy workload or kproxy history import). "
                   "Without it the history is derived from the traces (level `records`): what each client sent, "
                   "was answered, committed, aborted and was delivered (docs/analysis.md).")
@click.option("--traces", "traces", type=click.Path(file_okay=False), default=None,
              help="Trace directory of the proxy (*.events, *.jsonl, *.parquet). Without it only the history checks "
                   "run. Traces of several proxies in one directory are read together.")
@click.option("--out", "out", required=True, type=click.Path(file_okay=False),
              help="Output directory; report.json and report.html are written there.")
@click.option("--master", default="local[*]", show_default=True,
              help="Spark master URL, e.g. local[2] or spark://host:7077.")
@click.option("--remote", default=None, metavar="sc://HOST:PORT", callback=remote_url,
              help="Run the analysis on a Spark Connect server instead of a Spark of its own (instead of "
                   "--master); kproxy's code is shipped to the server's session and its executors' Python is checked "
                   "first. Settings the server fixes at its start are its own (docs/analysis.md, \"Spark Connect\").")
@click.option("--conf", "spark_conf", multiple=True, metavar="KEY=VALUE", callback=_spark_conf,
              help="A Spark setting, as spark-submit's --conf (repeatable). On a cluster, spark.pyspark.python "
                   "names the executors' Python (default: PYSPARK_PYTHON, else python3 on the workers).")
@click.option("--isolation", type=click.Choice(["auto", "read_committed", "read_uncommitted"]), default="auto",
              show_default=True,
              help="How the consumers read: decides which Fetch responses count for broker-aborted-read. "
                   "auto: fetches answered with an aborted-transactions list are read_committed "
                   "(read_committed everywhere when no fetch carries one).")
@click.option("--ww-deps/--no-ww-deps", "ww_deps", default=True, show_default=True,
              help="Infer write-write dependencies from offsets, as Jepsen's --ww-deps: a G0 needs them, and with "
                   "them a G1c of the form T1 <ww T2 <wr T1 is normal Kafka behaviour (tolerated); without them "
                   "only wr edges are searched and any G1c is an error. The report's stats.ww_deps says which.")
@click.option("--engine/--no-engine", "use_engine", default=True, show_default=True,
              help="Analyse in the warm engine when one runs (kproxy engine start) and neither --master nor "
                   "--conf is given; --no-engine starts Spark here anyway.")
@click.option("--quiet", "-q", is_flag=True, help="No progress on stderr and no summary on stdout.")
def analyze(history: str | None, traces: str | None, out: str, master: str, remote: str | None,
            spark_conf: dict[str, str], isolation: str, ww_deps: bool, use_engine: bool, quiet: bool) -> None:
    """Check a client history, and with --traces correlate it with the
    proxy's wire traces, using Spark; write report.json and report.html to
    --out and print a short summary. With --traces and no --history, check
    any application: the history is derived from a records-level trace.

    History checks follow Jepsen's Kafka queue checker (G1a, lost-write,
    duplicate, poll-skip, ...); wire checks find torn transactions, stale
    EndTxns, late Produces, client/wire outcome mismatches, spurious offsets,
    ambiguous errors and broker-level aborted reads, and attribute them to
    fault rules. See docs/analysis.md.

    On a cluster master (spark://...) or a Spark Connect server (--remote
    sc://...) kproxy's own code is shipped to the executors and their Python
    is checked before any input is read.
    """
    def progress(message: str) -> None:
        if not quiet:
            click.echo(f"[analyze] {message}", err=True)

    from kproxy.prereqs import MissingPrerequisite, check_analysis, check_spark_prerequisites

    try:
        # A Spark Connect client starts no JVM here: Java is the server's need, not this machine's.
        check_analysis("analyze") if remote is not None else check_spark_prerequisites("analyze")
    except MissingPrerequisite as exc:
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    if remote is not None and master != "local[*]":
        raise click.UsageError("give --master or --remote, not both: --remote runs the analysis on that Spark "
                               "Connect server, whose own master decides where")
    if history is None and traces is None:
        click.echo("error: give --history, --traces, or both (--traces alone derives the history from the wire)",
                   err=True)
        sys.exit(EXIT_USAGE)
    from kproxy.engine.client import analyze_if_running
    from kproxy.engine.client import status as engine_status

    engine_asked = use_engine and master == "local[*]" and remote is None and not spark_conf
    # The warm engine writes its own report: a history it reads is checked first, as any small one.
    beside = _checked_beside(history) and not (engine_asked and engine_status() is not None)
    problem = _unreadable_history(history) if history is not None and not beside else None
    if problem is not None:
        click.echo(f"error: {problem}", err=True)
        sys.exit(EXIT_USAGE)
    try:
        from kproxy_spark.jobs import analyze as run_analysis
        from kproxy_spark.report import exit_code, format_summary
    except ImportError as exc:  # present (checked above) but broken
        click.echo(f"error: the analysis dependencies do not import: {exc}; reinstall them: "
                   f"pip install --force-reinstall 'kproxy[analysis]'", err=True)
        sys.exit(EXIT_USAGE)

    check = None
    try:
        report = None
        if engine_asked and not beside:
            report = analyze_if_running({"history": history, "traces": traces, "out": out, "isolation": isolation,
                                         "ww_deps": ww_deps}, progress)
        if report is None:
            if beside:
                progress("checking the history's lines beside the analysis (nothing is written if one is broken)")
                check = _HistoryCheckBeside(history)
            # A Connect URL in place of the master: kproxy_spark.session opens a Connect session for it.
            report = run_analysis(history, traces, out, master=remote or master, isolation=isolation,
                                  progress=progress, ww_deps=ww_deps, spark_conf=spark_conf,
                                  before_writing=check.gate if check is not None else None)
    except Exception as exc:  # noqa: BLE001 - _fail sorts it
        # A broken line explains whatever the analysis then made of the history.
        problem = check.problem() if check is not None else None
        if problem is not None:
            click.echo(f"error: {problem}", err=True)
            sys.exit(EXIT_USAGE)
        _fail(exc)
    if not quiet:
        click.echo(format_summary(report, out))
    sys.exit(exit_code(report))


def _fail(exc: Exception) -> None:
    """Exit with what the analysis raised: the user's input or setup (2), or ours (3)."""
    from kproxy.engine.client import EngineError, EngineInputError
    from kproxy_spark.cluster import ClusterSetupError
    from kproxy_spark.jobs import InputError
    from kproxy_spark.session import ConnectError

    if isinstance(exc, (InputError, FileNotFoundError, ClusterSetupError, ConnectError, EngineInputError)):
        click.echo(f"error: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    if isinstance(exc, EngineError):
        click.echo(f"internal error: the engine: {exc}", err=True)
        sys.exit(EXIT_INTERNAL)
    # Any other failure is ours: exit 3, not a traceback and 1.
    click.echo(f"internal error: {type(exc).__name__}: {exc}", err=True)
    sys.exit(EXIT_INTERNAL)
