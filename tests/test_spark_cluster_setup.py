"""What `kproxy analyze --master spark://...` does before reading anything
(kproxy_spark.cluster), without Spark: the zip of kproxy's code it ships, the
list of modules it asks the executors for, and the sentences it turns an
executor's answer, or Spark's failure, into. The same steps against a real
standalone master and worker are in tests/test_spark_standalone.py.
"""

from __future__ import annotations

import ast
import shutil
import sys
import tomllib
import zipfile
from pathlib import Path

import pytest
from click.testing import CliRunner
from packaging.requirements import Requirement

from kproxy.cli import main
from kproxy_spark import cluster
from kproxy_spark.cluster import EXECUTOR_MODULES, analysis_zip, explain_failure, judge, package_dirs

ROOT = Path(__file__).resolve().parent.parent
#: Imported by the analysis but only on the driver: report.html is drawn
#: there; protobuf's `google._upb` only by a Spark Connect client, to build
#: its plans (kproxy_spark.session); py4j (PySpark's own) by the driver's
#: calls into its JVM (kproxy_spark.jvm_calls).
DRIVER_ONLY = {"matplotlib", "google", "py4j"}


def sources() -> dict[str, Path]:
    return {"kproxy": ROOT / "kproxy", "kproxy_spark": ROOT / "spark" / "kproxy_spark"}


def test_the_zip_holds_both_packages_at_its_top_without_compiled_caches(tmp_path):
    shipped = analysis_zip(package_dirs(), cache=tmp_path)
    names = set(zipfile.ZipFile(shipped).namelist())
    modules = {f"{package}/{p.relative_to(folder).as_posix()}" for package, folder in sources().items()
               for p in folder.rglob("*.py") if "__pycache__" not in p.parts}
    assert modules - names == set()
    assert {"kproxy/__init__.py", "kproxy_spark/__init__.py", "kproxy_spark/checks/keypass.py"} <= names
    assert not any("__pycache__" in n or n.endswith(".pyc") for n in names)
    import kproxy

    assert shipped.parent == tmp_path and shipped.name.startswith(f"kproxy-analysis-{kproxy.__version__}-")


def test_the_zip_is_built_once_per_content_and_anew_when_the_code_changes(tmp_path):
    dirs = {name: shutil.copytree(folder, tmp_path / "src" / name, ignore=shutil.ignore_patterns("__pycache__"))
            for name, folder in sources().items()}
    cache = tmp_path / "cache"
    first = analysis_zip(dirs, cache=cache)
    built = first.stat().st_mtime_ns
    (dirs["kproxy"] / "__pycache__").mkdir(exist_ok=True)
    (dirs["kproxy"] / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"compiled")
    assert analysis_zip(dirs, cache=cache) == first, "a compiled cache is not part of the content"
    assert first.stat().st_mtime_ns == built, "an unchanged tree reuses its zip"
    (dirs["kproxy_spark"] / "checks" / "keypass.py").write_text("# changed\n", encoding="utf-8")
    second = analysis_zip(dirs, cache=cache)
    assert second != first and first.is_file()
    assert zipfile.ZipFile(second).read("kproxy_spark/checks/keypass.py") == b"# changed\n"
    assert sorted(p.name for p in cache.iterdir()) == sorted([first.name, second.name]), "no temporary file left"


def test_the_cache_follows_xdg_cache_home(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert cluster.cache_dir() == tmp_path / "kproxy" / "analysis"


def test_only_local_masters_skip_shipping():
    assert all(cluster.is_local(m) for m in ("local", "local[2]", "local[*]"))
    assert not any(cluster.is_local(m) for m in ("spark://h:7077", "local-cluster[2,1,1024]", "yarn", "k8s://h"))


def _third_party_imports() -> set[str]:
    """Top-level modules outside the standard library that kproxy_spark
    imports, directly or through the kproxy modules it imports (at module
    level or inside a function: both run on executors)."""
    def file_of(name: str) -> Path | None:
        parts = name.split(".")
        base = ROOT / "spark" if parts[0] == "kproxy_spark" else ROOT
        path = base.joinpath(*parts)
        for candidate in (path / "__init__.py", path.with_suffix(".py")):
            if candidate.is_file():
                return candidate
        return None

    todo = [f"kproxy_spark.{p.relative_to(sources()['kproxy_spark']).with_suffix('').as_posix().replace('/', '.')}"
            for p in sources()["kproxy_spark"].rglob("*.py")]
    seen: set[Path] = set()
    found: set[str] = set()
    while todo:
        name = todo.pop()
        path = file_of(name)
        if path is None or path in seen:
            continue
        seen.add(path)
        todo += [".".join(name.split(".")[:i]) for i in range(1, name.count(".") + 1)]  # parent packages run first
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                imported = [alias.name for alias in node.names]
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                imported = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                continue
            for module in imported:
                top = module.split(".")[0]
                if top in cluster.SHIPPED_PACKAGES:
                    todo.append(module)
                elif top not in sys.stdlib_module_names and top != "__future__":
                    found.add(top)
    return found


def test_the_executor_modules_are_what_the_analysis_imports():
    # pandas is imported by PySpark itself for every grouped Arrow pass.
    assert set(EXECUTOR_MODULES) == (_third_party_imports() - DRIVER_ONLY) | {"pandas"}


def test_the_version_bounds_are_the_analysis_extras():
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["analysis"]
    required = {Requirement(line).name: Requirement(line).specifier for line in extra}
    for name in cluster.VERSION_BOUNDS:
        assert str(required[name]) == ",".join(sorted(cluster._bounds_text(name).split(","))), name
    assert "pyspark" in required and set(cluster.VERSION_BOUNDS) <= set(EXECUTOR_MODULES)


DRIVER = {"python": "3.11.7", "versions": {"pyspark": "4.3.0", "pyarrow": "26.0.1", "pandas": "2.3.3",
                                           "numpy": "2.4.6", "orjson": "3.13.0", "networkx": "3.6.1",
                                           "kio": "0.6.5", "crc32c": "2.9.post0", "cramjam": "2.14.0"}}


def executor(**changes) -> dict:
    found = {"python": "3.11.2", "executable": "/usr/bin/python3", "versions": dict(DRIVER["versions"]),
             "missing": {}, "analysis_error": None, "analysis_from": "/w/kproxy-analysis.zip/kproxy_spark/__init__.py"}
    found.update(changes)
    return found


def test_a_matching_executor_passes():
    # Patch releases of Python and PySpark may differ; the analysis runs.
    assert judge(executor(versions={**DRIVER["versions"], "pyspark": "4.3.1", "pandas": "2.2.0"}),
                 DRIVER) == []


def test_missing_modules_are_named_with_the_install_command():
    versions = {k: v for k, v in DRIVER["versions"].items() if k not in ("pyarrow", "pandas")}
    [problem] = judge(executor(versions=versions, missing={"pyarrow": "ModuleNotFoundError: No module named 'pyarrow'",
                                                           "pandas": "ModuleNotFoundError: No module named 'pandas'"}),
                      DRIVER)
    assert "the executors' Python (/usr/bin/python3, 3.11.2) cannot import pyarrow, pandas" in problem
    assert "pip install 'pyarrow==26.0.1' 'pandas==2.3.3'" in problem


@pytest.mark.parametrize(("changes", "expected"), [
    ({"python": "3.10.12"}, "is Python 3.10, the driver's is 3.11: PySpark needs the same major.minor on both"),
    ({"versions": {**DRIVER["versions"], "pyspark": "3.5.1"}},
     "runs PySpark 3.5.1, the driver PySpark 4.3.0: the executors need PySpark 4.3.x"),
    ({"versions": {**DRIVER["versions"], "pandas": "3.0.0"}}, "has pandas 3.0.0; the analysis needs pandas>=2.2,<3"),
    ({"versions": {**DRIVER["versions"], "pyarrow": "12.0.1"}}, "has pyarrow 12.0.1; the analysis needs pyarrow>=14"),
    ({"analysis_error": "ModuleNotFoundError: No module named 'kproxy_spark'"},
     "the executors cannot import kproxy's analysis from the shipped zip: ModuleNotFoundError"),
])
def test_each_mismatch_is_one_sentence(changes, expected):
    [problem] = judge(executor(**changes), DRIVER)
    assert expected in problem


def test_the_fix_names_the_setting_and_what_the_python_needs():
    hint = cluster.fix_hint("/usr/bin/python3", DRIVER)
    assert "ran '/usr/bin/python3'" in hint
    assert "spark.pyspark.python" in hint and "PYSPARK_PYTHON" in hint and "--conf" in hint
    assert "a Python 3.11 " in hint and "'pyspark==4.3.0'" in hint and "'cramjam==2.14.0'" in hint


# Spark's own words for the failures that stop a Python task before it runs
# (abridged from Py4JJavaError texts: the Python worker's message is inside).
SPARK_FAILURES = [
    ("An error occurred while calling z:org.apache.spark.api.python.PythonRDD.collectAndServe.\n"
     ": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, "
     "most recent failure: Lost task 0.3 in stage 0.0 (TID 3) (127.0.0.1 executor 0): "
     "org.apache.spark.api.python.PythonException: Traceback (most recent call last):\n"
     "pyspark.errors.exceptions.base.PySparkRuntimeError: [PYTHON_VERSION_MISMATCH] Python in worker has different "
     "version: 3.9 than that in driver: 3.11, PySpark cannot run with different minor versions.\n"
     "\tat org.apache.spark.api.python.BasePythonRunner$ReaderIterator.handlePythonException(PythonRunner.scala:651)",
     "the executors' Python is 3.9, the driver's is 3.11"),
    (": org.apache.spark.SparkException: Job aborted due to stage failure: Task 0 in stage 0.0 failed 4 times, "
     "most recent failure: Lost task 0.3 in stage 0.0 (TID 3) (127.0.0.1 executor 0): java.io.IOException: "
     "Cannot run program \"/opt/nope/bin/python\": error=2, No such file or directory\n"
     "\tat java.base/java.lang.ProcessBuilder.start(ProcessBuilder.java:1143)",
     "the executors could not start Python '/opt/nope/bin/python' (error=2, No such file or directory) on the worker"),
    (": org.apache.spark.SparkException: Job aborted due to stage failure: ... org.apache.spark.SparkException: "
     "Python worker exited unexpectedly (crashed): /usr/bin/python3: Error while finding module specification for "
     "'pyspark.daemon' (ModuleNotFoundError: No module named 'pyspark')\n\tat org.apache.spark...",
     "the executors' Python '/usr/bin/python3' cannot start PySpark's worker: no module named 'pyspark'"),
    ("java.lang.IllegalStateException: Cannot call methods on a stopped SparkContext.\n\tat org.apache.spark...",
     "the Spark application stopped before an executor ran"),
]


@pytest.mark.parametrize(("text", "expected"), SPARK_FAILURES)
def test_spark_failures_become_one_sentence_without_the_stack(text, expected):
    said = explain_failure(RuntimeError(text), "/usr/bin/python3")
    assert said.startswith(expected)
    assert "\tat " not in said and "scala" not in said


def test_conf_takes_key_value_pairs():
    result = CliRunner().invoke(main, ["analyze", "--history", "h.jsonl", "--out", "o", "--conf", "spark.x"])
    assert result.exit_code == 2
    assert "'spark.x' is not KEY=VALUE" in result.output
