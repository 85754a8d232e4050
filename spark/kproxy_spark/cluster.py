"""What an analysis on a Spark cluster needs before it reads anything: the
executors get kproxy's own code, and their Python is checked.

A standalone (or YARN, or Kubernetes) executor starts a Python of its own
that has never seen kproxy: every grouped pass would fail with
`No module named 'kproxy_spark'`. So the driver zips the `kproxy` and
`kproxy_spark` packages it runs from (an installed wheel's or a
checkout's, found by their ``__file__``), once per kproxy version and
content, into a cache directory, and adds the zip to the session before
the first job. Then one tiny job asks an executor for its Python, PySpark,
pyarrow and pandas, and the rest of what the checks import there; what is
missing or does not match the driver is an error that names the setting to
fix (`spark.pyspark.python` / `PYSPARK_PYTHON`), not a Java stack trace from
the middle of the analysis. docs/analysis.md, "On a Spark cluster".
"""

from __future__ import annotations

import hashlib
import os
import re
import sys
import threading
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path

#: The packages shipped to the executors, by import name.
SHIPPED_PACKAGES = ("kproxy", "kproxy_spark")

#: What the code that runs on executors imports, beside the shipped packages
#: and the standard library (tests/test_spark_cluster_setup.py derives it from
#: the source). Import name = distribution name for each.
EXECUTOR_MODULES = ("pyspark", "pyarrow", "pandas", "numpy", "orjson", "networkx", "kio", "crc32c", "cramjam")

#: Version bounds the executors' modules must meet, as pyproject.toml's
#: `analysis` extra states them: (lowest, first refused) with None for none.
#: PySpark must match the driver's major.minor instead (a patch release of
#: Spark speaks the same worker protocol).
VERSION_BOUNDS = {"pyarrow": ((14,), None), "pandas": ((2, 2), (3,))}

#: The analysis packages an executor must import from the shipped zip.
EXECUTOR_PACKAGES = ("kproxy_spark.checks", "kproxy_spark.wire", "kproxy_spark.traces", "kproxy_spark.history")

#: How often the driver says it is still waiting for an executor.
WAIT_NOTICE_S = 30.0

Progress = Callable[[str], None]


class ClusterSetupError(Exception):
    """The cluster's executors cannot run the analysis (exit code 2): what is
    wrong and the setting that fixes it."""


def is_local(master: str) -> bool:
    """Whether the master runs executors inside the driver's process
    (`local`, `local[N]`, `local[*]`), where no code needs shipping.
    `local-cluster[...]` starts executor processes of its own: not local."""
    return master == "local" or master.startswith("local[")


# --- the zip ---------------------------------------------------------------


def cache_dir() -> Path:
    """Where the zips are kept: $XDG_CACHE_HOME/kproxy/analysis (~/.cache/...)."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "kproxy" / "analysis"


def package_dirs() -> dict[str, Path] | None:
    """Each shipped package's directory, as this process imported it, or None
    when one is not a directory on disk (it was imported from a zip, as under
    spark-submit --py-files in cluster deploy mode: Spark ships that zip)."""
    import importlib

    found: dict[str, Path] = {}
    for name in SHIPPED_PACKAGES:
        module = importlib.import_module(name)
        origin = getattr(module, "__file__", None)
        if origin is None or not Path(origin).is_file():
            return None
        found[name] = Path(origin).resolve().parent
    return found


def _package_files(dirs: dict[str, Path]) -> Iterator[tuple[str, Path]]:
    """(name in the zip, file) for every file of the packages, sorted;
    compiled caches left out (each executor compiles for its own Python)."""
    for name, folder in sorted(dirs.items()):
        for path in sorted(folder.rglob("*")):
            relative = path.relative_to(folder)
            if path.is_file() and "__pycache__" not in relative.parts and path.suffix not in (".pyc", ".pyo"):
                yield f"{name}/{relative.as_posix()}", path


def analysis_zip(dirs: dict[str, Path] | None = None, cache: Path | None = None) -> Path:
    """The zip of the packages (both at its top level), built once per kproxy
    version and content: its name carries the version and a digest of every
    file's name and bytes, so a changed checkout gets a new zip and an
    unchanged one reuses its zip. Written under a temporary name and renamed,
    so concurrent analyses never read a half-written zip."""
    import kproxy

    dirs = dirs if dirs is not None else package_dirs()
    if dirs is None:
        raise ClusterSetupError("kproxy's packages are not directories on disk (imported from a zip?); "
                                "nothing to build a zip from")
    files = list(_package_files(dirs))
    digest = hashlib.sha256()
    for name, path in files:
        digest.update(name.encode() + b"\0")
        digest.update(path.read_bytes())
        digest.update(b"\0")
    folder = cache if cache is not None else cache_dir()
    target = folder / f"kproxy-analysis-{kproxy.__version__}-{digest.hexdigest()[:16]}.zip"
    if target.is_file():
        return target
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f".{target.name}.{os.getpid()}.{threading.get_ident()}.tmp"
    try:
        with zipfile.ZipFile(partial, "w", zipfile.ZIP_DEFLATED) as archive:
            for name, path in files:
                archive.write(path, name)
        os.replace(partial, target)
    finally:
        partial.unlink(missing_ok=True)
    return target


# --- the executors' Python ----------------------------------------------------


def _probe(modules: tuple[str, ...], packages: tuple[str, ...]) -> Callable[[object], dict]:
    """The function an executor runs: which Python it is, the versions of
    `modules` it imports (or why not), and whether the analysis `packages`
    import. Built here, inside a function, so that it is pickled by value:
    it must run where kproxy itself cannot be imported yet."""

    def probe(_: object) -> dict:
        import importlib
        import sys

        found: dict = {"python": "%d.%d.%d" % sys.version_info[:3], "executable": sys.executable,
                       "versions": {}, "missing": {}, "analysis_error": None, "analysis_from": None}
        for name in modules:
            try:
                module = importlib.import_module(name)
            except Exception as exc:  # noqa: BLE001 - a broken install is as missing as an absent one
                found["missing"][name] = f"{type(exc).__name__}: {exc}"
            else:
                found["versions"][name] = str(getattr(module, "__version__", "unknown"))
        if not found["missing"]:
            try:
                for name in packages:
                    importlib.import_module(name)
                found["analysis_from"] = importlib.import_module("kproxy_spark").__file__
            except Exception as exc:  # noqa: BLE001 - reported, with its type, on the driver
                found["analysis_error"] = f"{type(exc).__name__}: {exc}"
        return found

    return probe


def _version(text: str) -> tuple[int, ...]:
    """The leading numbers of a version string: "2.2.3" -> (2, 2, 3), "15.0.0.dev1" -> (15, 0, 0)."""
    numbers = []
    for part in text.split("."):
        match = re.match(r"\d+", part)
        if match is None:
            break
        numbers.append(int(match.group()))
        if match.group() != part:
            break
    return tuple(numbers)


def _major_minor(text: str) -> str:
    return ".".join(str(n) for n in _version(text)[:2])


def _bounds_text(name: str) -> str:
    lowest, refused = VERSION_BOUNDS[name]
    text = f">={'.'.join(map(str, lowest))}" if lowest else ""
    if refused:
        text += f"{',' if text else ''}<{'.'.join(map(str, refused))}"
    return text


def driver_facts() -> dict:
    """The driver's side of the comparison: its Python and the versions of
    the executors' modules it has."""
    import importlib

    versions = {}
    for name in EXECUTOR_MODULES:
        try:
            versions[name] = str(getattr(importlib.import_module(name), "__version__", "unknown"))
        except ImportError:
            pass
    return {"python": "%d.%d.%d" % sys.version_info[:3], "versions": versions}


def _install_hint(driver: dict, names: list[str]) -> str:
    """`pip install` of `names` at the driver's versions (those work with this kproxy)."""
    pins = [f"{name}=={driver['versions'][name]}" if driver["versions"].get(name, "unknown") != "unknown" else name
            for name in names]
    return "pip install " + " ".join(f"'{pin}'" for pin in pins)


def fix_hint(python_exec: str, driver: dict) -> str:
    """The sentence every executor error ends with: which setting chooses the
    executors' Python, and what that Python needs."""
    return (f"The executors ran {python_exec!r}. Point spark.pyspark.python (kproxy analyze --conf "
            f"spark.pyspark.python=/path/to/python) or PYSPARK_PYTHON at a Python {_major_minor(driver['python'])} "
            f"that exists on every worker and has {_install_hint(driver, list(EXECUTOR_MODULES))} "
            "(docs/analysis.md, \"On a Spark cluster\").")


def judge(found: dict, driver: dict) -> list[str]:
    """What in an executor's answer stops the analysis, one sentence each
    (empty when the executors can run it)."""
    problems = []
    where = f"the executors' Python ({found['executable']}, {found['python']})"
    if _major_minor(found["python"]) != _major_minor(driver["python"]):
        problems.append(f"{where} is Python {_major_minor(found['python'])}, the driver's is "
                        f"{_major_minor(driver['python'])}: PySpark needs the same major.minor on both")
    missing = [name for name in EXECUTOR_MODULES if name in found["missing"]]
    if missing:
        reasons = "; ".join(f"{name}: {found['missing'][name]}" for name in missing)
        problems.append(f"{where} cannot import {', '.join(missing)} ({reasons}); install them there: "
                        f"{_install_hint(driver, missing)}")
    executor_spark = found["versions"].get("pyspark")
    driver_spark = driver["versions"].get("pyspark")
    if executor_spark and driver_spark and _major_minor(executor_spark) != _major_minor(driver_spark):
        problems.append(f"{where} runs PySpark {executor_spark}, the driver PySpark {driver_spark}: "
                        f"the executors need PySpark {_major_minor(driver_spark)}.x")
    for name, (lowest, refused) in VERSION_BOUNDS.items():
        have = found["versions"].get(name)
        if have is None:
            continue
        version = _version(have)
        if (lowest and version < lowest) or (refused and version[:len(refused)] >= refused):
            problems.append(f"{where} has {name} {have}; the analysis needs {name}{_bounds_text(name)}")
    if not problems and found["analysis_error"]:
        problems.append(f"the executors cannot import kproxy's analysis from the shipped zip: "
                        f"{found['analysis_error']}")
    return problems


def explain_failure(exc: BaseException, python_exec: str) -> str:
    """What a failed probe job says about the executors' Python, from
    Spark's error (the Python worker's own message is inside it)."""
    text = str(exc)
    mismatch = re.search(r"Python in worker has different version:? (\S+?),? than that in driver:? (\S+?),", text)
    if mismatch:
        return (f"the executors' Python is {mismatch.group(1)}, the driver's is {mismatch.group(2)}: "
                "PySpark needs the same major.minor on both")
    program = re.search(r'Cannot run program "([^"]*)"[^\n]*?(error=\d+, [^\n]*)?\n', text + "\n")
    if program:
        return (f"the executors could not start Python {program.group(1)!r}"
                + (f" ({program.group(2).strip()})" if program.group(2) else "") + " on the worker")
    module = re.search(r"No module named '([^']+)'", text)
    if module:
        return (f"the executors' Python {python_exec!r} cannot start PySpark's worker: "
                f"no module named {module.group(1)!r}")
    if "SparkContext was shut down" in text or "stopped SparkContext" in text:
        return "the Spark application stopped before an executor ran (is the master reachable, and did it " \
               "accept the application?)"
    # Spark's first line of the failure, without the stack trace under it.
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reason = next((line for line in lines if "most recent failure" in line or "Exception:" in line
                   or "Error:" in line), lines[0] if lines else type(exc).__name__)
    return f"an executor failed to run a Python task: {reason[:400]}"


def check_executors(spark, progress: Progress, connect: bool = False) -> dict:  # noqa: ANN001 - a SparkSession
    """Run one task on an executor that reports its Python and modules;
    raise ClusterSetupError naming what to fix when the analysis cannot run
    there. Returns the executor's answer. `connect`: `spark` is a Spark
    Connect client's session, which has no SparkContext: the task is a
    one-row Python UDF, and the fix names the server's settings."""
    import time
    import uuid

    driver = driver_facts()
    probe = _probe(EXECUTOR_MODULES, EXECUTOR_PACKAGES)
    outcome: dict = {}
    if connect:
        python_exec = "the Connect server's Python"
        memory = _connect_setting(spark, "spark.executor.memory", "1g")
        hint = lambda executable: connect_fix_hint(executable, driver)  # noqa: E731
        frame = _probe_frame(spark, probe)

        def ask() -> dict:
            import json

            return json.loads(frame.collect()[0][0])
    else:
        context = spark.sparkContext
        python_exec = context.pythonExec
        memory = context.getConf().get("spark.executor.memory", "1g")
        hint = lambda executable: fix_hint(executable, driver)  # noqa: E731
        group = f"kproxy-executor-check-{uuid.uuid4().hex}"

        def ask() -> dict:
            context.setJobGroup(group, "kproxy: the executors' Python")
            return context.parallelize([0], 1).map(probe).collect()[0]

    def run() -> None:
        try:
            outcome["found"] = ask()
        except BaseException as exc:  # noqa: BLE001 - judged below, on the calling thread
            outcome["error"] = exc

    worker = threading.Thread(target=run, name="kproxy-executor-check", daemon=True)
    started = time.monotonic()
    worker.start()
    while True:
        worker.join(WAIT_NOTICE_S)
        if not worker.is_alive():
            break
        # A cluster with no free cores (or too little memory for
        # spark.executor.memory) never starts an executor; Spark only logs it.
        progress(f"still waiting for an executor after {time.monotonic() - started:.0f} s: does the cluster "
                 f"have a worker with a free core and spark.executor.memory ({memory}) to spare?")
    if "error" in outcome:
        raise ClusterSetupError(f"{explain_failure(outcome['error'], python_exec)}. {hint(python_exec)}")
    found = outcome["found"]
    problems = judge(found, driver)
    if problems:
        # A Connect client knows the executors' Python only from their answer.
        raise ClusterSetupError("; ".join(problems) + ". " + hint(found["executable"] if connect else python_exec))
    return found


def _probe_frame(spark, probe: Callable[[object], dict]):  # noqa: ANN001, ANN202 - session in, DataFrame out
    """One row: the executor's answer to `probe`, as JSON, computed by a
    plain (pickled, not Arrow) Python UDF, so that an executor without
    pyarrow still answers and is told what it lacks."""
    import json

    from pyspark.sql import functions as F

    def answer(_: object) -> str:
        return json.dumps(probe(0))

    return spark.range(0, 1, 1, 1).select(F.udf(answer, "string", useArrow=False)("id").alias("found"))


def _connect_setting(spark, name: str, default: str) -> str:  # noqa: ANN001 - a Connect SparkSession
    """A setting of the Connect server as its client may read it, or `default`."""
    try:
        return spark.conf.get(name, default) or default
    except Exception:  # noqa: BLE001 - a server may refuse to say; the default is what it runs with then
        return default


def connect_fix_hint(python_exec: str, driver: dict) -> str:
    """fix_hint for a Spark Connect server: the executors' Python is the
    server's to choose (a client cannot set spark.pyspark.python)."""
    return (f"The executors ran {python_exec!r}. Start the Spark Connect server with spark.pyspark.python "
            "(start-connect-server.sh --conf spark.pyspark.python=/path/to/python) or PYSPARK_PYTHON in its "
            f"environment pointing at a Python {_major_minor(driver['python'])} that exists on the server and "
            f"every worker and has {_install_hint(driver, list(EXECUTOR_MODULES))} "
            "(docs/analysis.md, \"Spark Connect\").")


# --- both, once per session ----------------------------------------------------


def prepare_cluster(spark, progress: Progress) -> None:  # noqa: ANN001 - a SparkSession
    """Ship the code and check the executors, once per SparkContext."""
    context = spark.sparkContext
    if getattr(context, "_kproxy_ready", False):
        return
    # Under spark-submit, spark.pyspark.python chooses the executors' Python;
    # a driver started from Python (kproxy analyze) reads only PYSPARK_PYTHON
    # unless told: the setting wins, as it does under spark-submit.
    configured = context.getConf().get("spark.pyspark.python", None)
    if configured:
        context.pythonExec = configured
    dirs = package_dirs()
    if dirs is None:
        progress("kproxy's code comes from a zip (spark-submit --py-files): Spark ships it")
    else:
        import kproxy

        shipped = analysis_zip(dirs)
        # Spark takes a file name once per session; the name carries the
        # content's digest, so the same name (spark-submit --py-files of the
        # zip `python -m kproxy_spark.cluster` printed) is the same code.
        if shipped.name in (context._python_includes or []):
            progress(f"kproxy {kproxy.__version__} is already in the session ({shipped.name})")
        else:
            progress(f"shipping kproxy {kproxy.__version__} to the executors ({shipped})")
            context.addPyFile(str(shipped))
    progress(f"checking the executors' Python ({context.pythonExec})")
    found = check_executors(spark, progress)
    versions = ", ".join(f"{name} {found['versions'][name]}" for name in ("pyspark", "pyarrow", "pandas"))
    progress(f"executors: Python {found['python']} ({found['executable']}), {versions}; "
             f"kproxy_spark from {found['analysis_from']}")
    context._kproxy_ready = True


#: The Connect sessions (by id) that have kproxy's code and a checked server.
_CONNECT_READY: set[str] = set()


def prepare_connect(spark, progress: Progress) -> None:  # noqa: ANN001 - a Spark Connect SparkSession
    """Ship the code and check the executors of a Spark Connect session, once
    per session: the zip goes as a session artifact (``addArtifacts(...,
    pyfile=True)``: Connect's counterpart of ``addPyFile``, on the Python path
    of this session's tasks only), and the probe runs as a one-row UDF."""
    import kproxy

    if spark.session_id in _CONNECT_READY:
        return
    dirs = package_dirs()
    if dirs is None:
        raise ClusterSetupError("kproxy's packages are not directories on disk (imported from a zip?); "
                                "a Spark Connect session needs them to build the zip it ships")
    shipped = analysis_zip(dirs)
    progress(f"shipping kproxy {kproxy.__version__} to the Spark Connect session ({shipped})")
    spark.addArtifacts(str(shipped), pyfile=True)
    progress("checking the executors' Python (the Connect server's)")
    found = check_executors(spark, progress, connect=True)
    versions = ", ".join(f"{name} {found['versions'][name]}" for name in ("pyspark", "pyarrow", "pandas"))
    progress(f"executors: Python {found['python']} ({found['executable']}), {versions}; "
             f"kproxy_spark from {found['analysis_from']}")
    _CONNECT_READY.add(spark.session_id)


def main(argv: list[str] | None = None) -> int:
    """`python -m kproxy_spark.cluster`: build (or find) the zip and print its
    path, for spark-submit --py-files (docs/analysis.md)."""
    import argparse

    parser = argparse.ArgumentParser(prog="python -m kproxy_spark.cluster",
                                     description="Print the path of the zip of kproxy's analysis code, "
                                                 "built once per version and content (for spark-submit --py-files).")
    parser.add_argument("--cache-dir", type=Path, default=None, help=f"where to keep it (default: {cache_dir()})")
    args = parser.parse_args(argv)
    try:
        print(analysis_zip(cache=args.cache_dir))
    except ClusterSetupError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
