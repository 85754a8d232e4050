"""One place that knows how to start Spark for the analysis."""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

from pyspark import SparkContext
from pyspark.sql import SparkSession

from kproxy_spark.class_archive import ClassArchive
from kproxy_spark.jvm_calls import pin_jvm_names

#: A join whose every side is in one partition stays unshuffled only while
#: Spark estimates it below this size; after a few joins its estimates run
#: to exabytes on a trace of kilobytes. The analysis puts frames in one
#: partition only when the session shuffles into one anyway (one_partition).
SINGLE_PARTITION_BYTES = "spark.sql.maxSinglePartitionBytes"
UNBOUNDED = str(2**62)

#: Spark's logging for the analysis: errors only (see the file).
LOG_CONFIG = Path(__file__).with_name("log4j2.properties")


def get_session(
    master: str = "local[*]", app_name: str = "kproxy-analyze", conf: dict[str, str] | None = None,
    quick_start: bool = False,
) -> SparkSession:
    """A SparkSession sized for a small machine (2 cores) unless a cluster is given.

    Shuffle partitions stay small because the default of 200 turns every
    aggregation of a modest history into hundreds of near-empty tasks, which
    dominates run time on two cores. Adaptive execution (which coalesces
    partitions and splits skew) pays on a cluster; in local mode it only
    turns every shuffle stage into a job of its own (about 300 instead of
    100 for one analysis), so it is off there: measured 20-25 % faster on
    20k-100k-operation histories (docs/performance-analysis.md).
    ``conf`` overrides any setting (tests use it for tiny-data settings).
    ``quick_start`` (a small input) keeps the driver JVM on its quick JIT
    tier: it compiles sooner and cheaper, which is what a run of a few
    seconds needs; long runs want the optimising tier.
    A Spark Connect URL (``sc://host:port``) as ``master`` gives a session
    of that server instead (`connect_session`).
    """
    if is_connect_url(master):
        return connect_session(master, conf)
    if master.startswith("local"):
        # Python workers must be this interpreter: the system one lacks
        # pyarrow and pandas, which the grouped Arrow passes need. (On a
        # cluster PYSPARK_PYTHON names the workers' own: docs/analysis.md.)
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        # Local mode talks to itself: loopback, not whatever the host name
        # resolves to (Spark warns about that on every start otherwise).
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    adaptive = "false" if master.startswith("local") else "true"
    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.shuffle.partitions", os.environ.get("KPROXY_SPARK_PARTITIONS", "4"))
        .config("spark.default.parallelism", "4")
        .config("spark.sql.adaptive.enabled", adaptive)
        .config("spark.sql.adaptive.coalescePartitions.enabled", "true")
        # A broadcast join runs a Spark job of its own to collect its small
        # side; the analysis is shaped as a handful of jobs, so joins shuffle
        # unless a broadcast is asked for by name.
        .config("spark.sql.autoBroadcastJoinThreshold", "-1")
        .config(SINGLE_PARTITION_BYTES, UNBOUNDED)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.driver.memory", os.environ.get("KPROXY_SPARK_DRIVER_MEMORY", "2g"))
        .config("spark.sql.session.timeZone", "UTC")
        # PySpark's DataFrame debugging records the Python call site of every
        # column function in the JVM: five or six more calls into the JVM for
        # each F.col or F.lit, about a third of the 39,000 it took to build the
        # wire checks (docs/performance-analysis.md). Errors still name the
        # failing expression; only the Python line of its origin is lost.
        .config("spark.python.sql.dataFrameDebugging.enabled", "false")
        # Traces carry arbitrary record bytes as text (control records, binary
        # values): a value that is not a number must read as null, not abort
        # the job, so casts are lenient.
        .config("spark.sql.ansi.enabled", "false")
        # Histories are small files read once; no need for Hive or a warehouse dir.
        .config("spark.sql.catalogImplementation", "in-memory")
        .config("spark.sql.warehouse.dir", os.path.join(os.environ.get("TMPDIR", "/tmp"), "kproxy-spark-warehouse"))
    )
    # The throughput collector: G1's concurrent marking and write barriers
    # cost the driver more than its pauses save on a batch job of plans and
    # small tasks (a tenth of the JVM's CPU over eight analyses in one session,
    # docs/performance-analysis.md, "The driver's collector").
    java_options = [f"-Dlog4j2.configurationFile={LOG_CONFIG}", "-XX:+UseParallelGC"]
    if quick_start:
        from kproxy.jvm_options import QUICK_JIT

        java_options += QUICK_JIT
    # Spark's classes mapped from an archive instead of read from its jars; a
    # one-off run writes the archive when there is none (kproxy_spark.class_archive).
    # A process whose driver already runs is handed that one (getOrCreate) and
    # starts no JVM: it must not take the right to write the archive, which it
    # would hold until it exits (a test worker, the whole suite) while writing nothing.
    launching = SparkContext._active_spark_context is None
    archive = ClassArchive.for_driver(may_write=quick_start) if launching else ClassArchive(None)
    java_options += archive.java_options()
    builder = builder.config("spark.driver.extraJavaOptions", " ".join(java_options))
    for name, setting in (conf or {}).items():
        builder = builder.config(name, setting)
    session = builder.getOrCreate()
    archive.started(session)
    session.sparkContext.setLogLevel("ERROR")
    pin_jvm_names(session)
    return session


#: The settings get_session gives a classic session that a Spark Connect
#: client may set too: SQL settings of its own session on the server.
CONNECT_SETTINGS = {
    "spark.sql.shuffle.partitions": lambda: os.environ.get("KPROXY_SPARK_PARTITIONS", "4"),
    "spark.sql.adaptive.coalescePartitions.enabled": lambda: "true",
    "spark.sql.autoBroadcastJoinThreshold": lambda: "-1",
    SINGLE_PARTITION_BYTES: lambda: UNBOUNDED,
    "spark.sql.session.timeZone": lambda: "UTC",
    "spark.sql.ansi.enabled": lambda: "false",
}
#: What get_session sets on a classic session and a Connect client cannot:
#: they are fixed when the server starts (its own --conf decides them). None
#: changes a verdict: memory, the UI, logging, where a warehouse would be,
#: and the JVM-side call sites of column functions, which a Connect client
#: builds in Python without calling the JVM at all.
SERVER_ONLY_SETTINGS = (
    "spark.driver.memory", "spark.driver.extraJavaOptions", "spark.default.parallelism", "spark.ui.enabled",
    "spark.ui.showConsoleProgress", "spark.python.sql.dataFrameDebugging.enabled",
    "spark.sql.catalogImplementation", "spark.sql.warehouse.dir",
)
#: How long the analysis waits for a Connect server's port to answer before
#: it says the server cannot be reached (Spark's own client retries for minutes).
CONNECT_TIMEOUT_S = 10.0


class ConnectError(Exception):
    """A Spark Connect server that cannot be reached or cannot take a setting
    (a usage error: exit code 2)."""


def is_connect_url(master: str | None) -> bool:
    return bool(master) and master.startswith("sc://")


def is_connect(spark) -> bool:  # noqa: ANN001 - a SparkSession of either kind
    """Whether `spark` is a Spark Connect client's session (no SparkContext,
    no JVM in this process)."""
    return type(spark).__module__.startswith("pyspark.sql.connect")


def connect_session(url: str, conf: dict[str, str] | None = None):  # noqa: ANN201 - a Connect SparkSession
    """A session of the Spark Connect server at `url`, with the analysis's SQL
    settings (CONNECT_SETTINGS) and the caller's ``conf``.

    The server's port is tried first, with a deadline: Spark's client would
    otherwise retry an unreachable address for minutes. A setting in ``conf``
    the server refuses from a client (a static one, fixed when the server
    started) is an error that names it; the analysis's own SERVER_ONLY_SETTINGS
    are left to the server.
    """
    import socket

    from pyspark.errors import PySparkValueError

    try:
        from pyspark.sql.connect.client.core import DefaultChannelBuilder
    except ImportError as exc:
        raise ConnectError(f"Spark Connect's client does not import ({exc}); install it: "
                           "pip install 'kproxy[analysis]' (or 'pyspark[connect]')") from None
    try:
        channel = DefaultChannelBuilder(url)
    except PySparkValueError as exc:
        raise ConnectError(f"{url} is not a Spark Connect URL: {str(exc).splitlines()[0]}") from None
    host, _, port = channel.endpoint.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=CONNECT_TIMEOUT_S).close()
    except (OSError, ValueError) as exc:
        raise ConnectError(f"cannot reach the Spark Connect server at {url} ({channel.endpoint}: "
                           f"{getattr(exc, 'strerror', None) or exc}); is it running (sbin/start-connect-server.sh) "
                           "and is the port open from here?") from None
    _allow_deep_plans()
    session = SparkSession.builder.remote(url).getOrCreate()
    settings = {name: value() for name, value in CONNECT_SETTINGS.items()}
    try:
        server_master = session.conf.get("spark.master", "") or ""
    except Exception:  # noqa: BLE001 - a server that will not say is taken for a cluster
        server_master = ""
    # As get_session decides it: adaptive execution pays on a cluster only.
    settings["spark.sql.adaptive.enabled"] = "false" if server_master.startswith("local") else "true"
    settings.update(conf or {})
    for name, setting in settings.items():
        try:
            session.conf.set(name, setting)
        except Exception as exc:  # noqa: BLE001 - the server's AnalysisException says why
            refused = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            session.stop()
            raise ConnectError(f"the Spark Connect server at {url} refuses {name}={setting} from a client "
                               f"({refused}): set it when the server starts "
                               "(start-connect-server.sh --conf ...)") from None
    return session


def _allow_deep_plans() -> None:
    """Let this process's protobuf build and read plans nested deeper than
    its default limit of 100 levels.

    A Connect client sends each plan as nested protobuf messages, one level
    per operation, and copies it (a parse) when it wraps it in a command. The
    wire views are built of a few hundred joins, windows and projections over
    the traces: their plans run past 100 levels, and the client failed with
    `Exceeded upb_DecodeOptions_MaxDepth`. The server reads them up to
    spark.connect.grpc.marshallerRecursionLimit (1024 by default).
    """
    try:
        from google._upb import _message
    except ImportError:  # the pure-Python or C++ protobuf: neither has the 100-level limit of upb
        return
    _message.SetAllowOversizeProtos(True)


#: Input bytes per shuffle partition the analysis aims for. Most of a
#: trace's bytes are record batches that become narrow rows, and the wire
#: job has 60-85 stages, each paying a fixed cost per task: at 100,000
#: operations with traces (532 MB), 32 partitions ran 2,910 tasks and took
#: 88.6 s, 4 partitions 642 tasks and 59.8 s (2: 59.7 s, 8: 64.8 s); a
#: million operations' history took as long in 3 as in 21
#: (docs/performance-analysis.md, "Shuffle partitions by the rows").
BYTES_PER_PARTITION = 128 * 1024 * 1024


def shuffle_partitions_for(input_bytes: int, most: int = 400, cores: int | None = None) -> int:
    """Shuffle partitions sized to the input: one for a small history, where
    every extra partition is only another near-empty task per stage (the
    wire job has dozens of stages), and enough for a large one that each
    key group and sort fits a task comfortably. With the session's `cores`
    known, more than one is rounded up to a multiple of them: three tasks on
    two cores left the last to run alone (a million operations' history
    pass: 9 s of one idle core)."""
    wanted = max(1, min(most, -(-input_bytes // BYTES_PER_PARTITION)))
    if cores and wanted > 1:
        wanted = min(max(most, cores), -(-wanted // cores) * cores)
    return wanted


#: Where size_for_input says how many tasks the history pass runs in (kproxy_spark.checks.keypass).
PASS_PARTITIONS_CONF = "spark.kproxy.passPartitions"
#: From this input on, a local session's history pass gets a task per core.
SPREAD_PASS_BYTES = 8 * 1024 * 1024


def pass_partitions_for(input_bytes: int, shuffle: int, cores: int | None) -> int:
    """The history pass's tasks: the shuffle's partitions, or one per local core where those are fewer
    and the input is not small. The pass is mostly Python, one process per task: at 100,000 operations
    (32 MB of history, one shuffle partition) it ran as one task beside an idle core, and two tasks
    took 2-4 s off a 30 s analysis (docs/performance-analysis.md, "The history pass's input packed
    per operation and key"); below SPREAD_PASS_BYTES the extra shuffle costs what it saves."""
    if cores and shuffle < cores and input_bytes >= SPREAD_PASS_BYTES:
        return cores
    return shuffle


def pass_partitions(spark) -> int | None:  # noqa: ANN001 - a SparkSession of either kind
    """The history pass's tasks when size_for_input set them apart from the shuffle's, else None."""
    wanted = spark.conf.get(PASS_PARTITIONS_CONF, None)
    if wanted is None or wanted == spark.conf.get("spark.sql.shuffle.partitions"):
        return None
    return int(wanted)


_LOCAL_MASTER = re.compile(r"local(?:\[(\*|\d+)(?:,\s*\d+)?\])?")


def local_cores(spark: SparkSession) -> int | None:
    """The cores a local session runs its tasks on (local: 1, local[N]: N, local[*]: the machine's); None
    for a cluster or Spark Connect, whose executors the driver does not count here."""
    if is_connect(spark):
        return None
    found = _LOCAL_MASTER.fullmatch(spark.sparkContext.master)
    if found is None:
        return None
    count = found.group(1)
    if count is None:
        return 1
    return (os.cpu_count() or 1) if count == "*" else int(count)


def size_for_input(spark: SparkSession, input_bytes: int, small_bytes: int) -> None:
    """Set the SQL settings that depend on how much the analysis reads, on
    any session (local, a cluster under spark-submit, a test's):

    * shuffle partitions sized to the input (``shuffle_partitions_for``),
      unless KPROXY_SPARK_PARTITIONS fixes them, and the history pass's
      (``pass_partitions_for``);
    * below ``small_bytes``, no generated code: compiling Java for each of
      the wire job's ~60 stages costs seconds, interpreting a small input
      costs less.
    """
    cores = local_cores(spark)
    if "KPROXY_SPARK_PARTITIONS" not in os.environ:
        spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions_for(input_bytes, cores=cores)))
    shuffle = int(spark.conf.get("spark.sql.shuffle.partitions"))
    spark.conf.set(PASS_PARTITIONS_CONF, str(pass_partitions_for(input_bytes, shuffle, cores)))
    small = input_bytes < small_bytes
    spark.conf.set("spark.sql.codegen.wholeStage", "false" if small else "true")
    spark.conf.set("spark.sql.codegen.factoryMode", "NO_CODEGEN" if small else "FALLBACK")
    # Input splits small enough that a task's rows, parsed and kept, fit a
    # 2 GiB driver beside its neighbour's (128 MB of JSON did not, at 10M ops).
    spark.conf.set("spark.sql.files.maxPartitionBytes", str(32 * 1024 * 1024))
    spark.conf.set(SINGLE_PARTITION_BYTES, UNBOUNDED)
    spark.conf.set(PERSIST_CONF, "MEMORY_AND_DISK" if input_bytes < IN_MEMORY_BYTES else "DISK_ONLY")


#: Above this input the analysis keeps its intermediate rows on disk only:
#: in memory they would outgrow the driver's heap.
IN_MEMORY_BYTES = 512 * 1024 * 1024
#: Where size_for_input says how to keep intermediate rows (a StorageLevel name).
PERSIST_CONF = "spark.kproxy.persist"


def storage_level(spark: SparkSession):  # noqa: ANN201 - a pyspark StorageLevel
    """How to keep the analysis's intermediate rows on this session."""
    from pyspark import StorageLevel

    return getattr(StorageLevel, spark.conf.get(PERSIST_CONF, "MEMORY_AND_DISK"))


class KeptRows:
    """What `keep` holds: release() (alias unpersist(), as a cached frame
    has) frees the rows, whoever still refers to the frame.

    On Spark Connect the checkpointed rows live on the server under the
    frame's id, and no client call frees them by hand: the server drops them
    when the client lets go of the frame (its last reference) or when the
    session ends, which the analysis does for a session it started. Release
    is then nothing to do."""

    def __init__(self, frame) -> None:  # noqa: ANN001 - a DataFrame
        self._rdd = None if is_connect(frame.sparkSession) else frame._jdf.queryExecution().analyzed().rdd()

    def unpersist(self) -> None:
        if self._rdd is not None:
            self._rdd.unpersist(False)

    release = unpersist


def shuffles_into_one(spark: SparkSession) -> bool:
    """Whether every shuffle of this session lands in one partition (a small
    input, `size_for_input`, or the tests' session)."""
    return spark.conf.get("spark.sql.shuffle.partitions") == "1"


#: The most rows `one_partition` lets through: Spark's largest limit. It
#: bounds Spark's estimate of a frame's size, never its rows in practice: a
#: session shuffles into one partition for inputs of a few megabytes.
ONE_PARTITION_ROWS = 2**31 - 1
#: An estimate above this, for a frame of an input small enough to shuffle
#: into one partition, is an artefact of multiplied estimates, not a size.
PLAUSIBLE_BYTES = 1 << 32


def one_partition(frame, joined: bool = False):  # noqa: ANN001, ANN201 - DataFrame -> DataFrame
    """`frame` in one partition, without a shuffle, when the session shuffles
    into one partition anyway.

    A frame Spark knows to be in one partition satisfies every grouping and
    window without an exchange; a shuffle's output, even into one partition,
    is known only by its own keys, so the next operation on other keys
    shuffles again. On a small input every such stage costs a fixed
    0.1-0.2 s, and the wire job had 50-75 of them
    (docs/performance-analysis.md). The work is the same: one task per
    keyed operation either way.

    A join leaves its one-partition sides in place only while Spark
    estimates them below SINGLE_PARTITION_BYTES, and its estimate of a join
    is the product of its sides' estimates: after the few joins that build a
    view, a trace of kilobytes is estimated at exabytes, and the next join
    shuffled again. A limit's estimate is its row count times the row's
    width, so the limit (ONE_PARTITION_ROWS, far above any small input)
    puts the estimate back in reach. `joined`: the frame is built by joins,
    so its estimate is past reach without asking (asking optimises its plan
    once more). A Spark Connect client cannot ask for the estimate (it is
    the JVM's, behind `_jdf`): there every frame gets the limit, which keeps
    the same rows in the same order, and costs only a node in the plan.
    """
    if not shuffles_into_one(frame.sparkSession):
        return frame
    frame = frame.coalesce(1)
    if joined or is_connect(frame.sparkSession) or \
            frame._jdf.queryExecution().optimizedPlan().stats().sizeInBytes() > PLAUSIBLE_BYTES:
        frame = frame.limit(ONE_PARTITION_ROWS)
    return frame


def keep(frame, held: list | None = None):  # noqa: ANN001, ANN201 - DataFrame -> DataFrame
    """`frame` computed once, by the first job that reads it, and kept, as
    ``cache()`` does, but with its plan cut off: the frame reads as a leaf.

    A cached frame still carries its whole plan, and every frame built on
    it carries that plan once per use; the wire checks build on a few shared
    frames dozens of times, so that tree ran to many thousands of nodes,
    and analysing and planning it cost the driver more than the job itself
    (docs/performance-analysis.md). Kept rows launch no job of their own.
    Their release goes to `held` (rows kept by a checkpoint are not the
    session's cache: ``DataFrame.unpersist`` would not free them).
    """
    kept = frame.localCheckpoint(eager=False, storageLevel=storage_level(frame.sparkSession))
    if held is not None:
        held.append(KeptRows(kept))
    return kept


def rows_table(rows: list[tuple], columns: list[tuple[str, str]]):  # noqa: ANN201 - a pyarrow.Table
    """`rows` as an Arrow table of `columns`: (name, pyarrow type name) pairs, e.g. ("offset", "int64")."""
    import pyarrow as pa

    cells = list(zip(*rows)) if rows else [() for _ in columns]
    return pa.table([pa.array(list(column), getattr(pa, kind)()) for column, (_, kind) in zip(cells, columns, strict=True)],
                    names=[name for name, _ in columns])


def rows_frame(spark, rows: list[tuple], columns: list[tuple[str, str]]):  # noqa: ANN001, ANN201 - -> DataFrame
    """A few driver-side `rows` as a frame, handed over as Arrow (rows_table), which the JVM
    reads itself. A list of rows is unpickled by a Python worker, and that
    path's workers are not the SQL functions' (their environment differs), so
    it started a second Python daemon for a handful of rows: 2 of a small
    analysis's 18 stages and a process."""
    return spark.createDataFrame(rows_table(rows, columns))
