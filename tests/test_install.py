"""kproxy as users install it: a wheel built from this tree, installed into a
fresh venv, run from a directory that is not the source tree.

One venv serves the whole file. The wheel goes in with --no-deps; its
dependencies are the ones this test run already has installed: what the
wheel's metadata requires, followed transitively, linked into a folder that
a plain path line in a .pth file adds to the venv (a plain path line runs no
.pth file, and nothing the wheel does not require is linked, so neither the
checkout's editable install nor the test tools show through). The analysis
extra's distributions are left out: the shipped scenarios, `rules validate`
and the prerequisite checks that must fail at once run without them. For the
end-to-end demo a second path line adds them, as installing the extra would.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from email.parser import Parser
from importlib.metadata import Distribution, distribution
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.fixtures.timing import timed

ROOT = Path(__file__).resolve().parent.parent
# What the build reads; copied so that building leaves no build/ or egg-info in the tree.
BUILD_INPUTS = ("pyproject.toml", "README.md", "LICENSE", "kproxy", "spark", "rules", "dashboards")


#: What the suite's own process sets that must not reach the installed kproxy: PYTHONPATH on the source tree
#: (pip would also take the tree's kproxy for an installed one), and the Python the suite's Spark session
#: named for its workers (the checkout's venv: the wheel's analysis would run its executors there).
LEAKS = ("PYTHONPATH", "VIRTUAL_ENV", "PYSPARK_PYTHON", "PYSPARK_DRIVER_PYTHON")


def _clean_env() -> dict[str, str]:
    # The wheel's venv links its own PySpark: an archive of its classes would be written for it alone, and
    # the suite's time is better spent elsewhere (tests/test_class_archive.py writes and maps one).
    return {**{k: v for k, v in os.environ.items() if k not in LEAKS}, "KPROXY_CLASS_ARCHIVE": "off"}


def _pip(*args: str, timeout: float = 600) -> None:
    # The suite's own pip installs into the test venvs (--python): the fresh venvs need no pip of their own.
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, capture_output=True, text=True, timeout=timeout,
                   env=_clean_env())


@pytest.fixture(scope="module")
def built(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, str]:
    """The wheel, built by `python -m build` as a packager builds it, and everything the build printed."""
    work = tmp_path_factory.mktemp("wheel-build")
    source = work / "src"
    source.mkdir()
    for name in BUILD_INPUTS:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(origin, source / name)
    # PYTHONDONTWRITEBYTECODE (set on these machines) makes setuptools say that byte-compiling is off: a
    # word about this environment, not about the package, and a packager's environment does not set it.
    environment = {k: v for k, v in _clean_env().items() if k != "PYTHONDONTWRITEBYTECODE"}
    done = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(work / "dist"), str(source)],
                          capture_output=True, text=True, timeout=600, env=environment)
    assert done.returncode == 0, done.stdout + done.stderr
    (wheel_file,) = (work / "dist").glob("kproxy-*.whl")
    return wheel_file, done.stdout + done.stderr


@pytest.fixture(scope="module")
def wheel(built: tuple[Path, str]) -> Path:
    return built[0]


def test_the_build_prints_no_warning(built: tuple[Path, str]) -> None:
    """setuptools' deprecations (a licence table), packaging warnings (data folders missing from `packages`)
    and any other: what a packager would see, fixed rather than tolerated."""
    _, output = built
    warnings = [line for line in output.splitlines() if "warn" in line.lower() or line.strip() == "!!"]
    assert warnings == [], "\n".join(warnings)
    with zipfile.ZipFile(built[0]) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        assert Parser().parsestr(archive.read(metadata).decode())["License-Expression"] == "Apache-2.0"
        assert metadata.replace("METADATA", "licenses/LICENSE") in archive.namelist()


def _closure(requirements: list[str], extra: str = "") -> dict[str, Distribution]:
    """The installed distributions that these requirements pull in, transitively."""
    found: dict[str, Distribution] = {}
    followed: set[tuple[str, str]] = set()
    todo = [(Requirement(line), extra) for line in requirements]
    while todo:
        requirement, wanted = todo.pop()
        if requirement.marker and not requirement.marker.evaluate({"extra": wanted}):
            continue
        name = canonicalize_name(requirement.name)
        if name not in found:
            found[name] = distribution(name)  # PackageNotFoundError: this run lacks a dependency of the wheel
        dist = found[name]
        for with_extra in requirement.extras | {""}:
            if (name, with_extra) not in followed:
                followed.add((name, with_extra))
                todo += [(Requirement(line), with_extra) for line in dist.requires or ()]
    return found


def _entries(dists: dict[str, Distribution]) -> set[Path]:
    """Their top-level site-packages entries (packages, modules, .dist-info), from their RECORDs."""
    return {Path(dist.locate_file(f.parts[0])) for dist in dists.values() for f in dist.files
            if f.parts[0] not in ("..", "__pycache__")}


def _view(folder: Path, entries: set[Path]) -> Path:
    """A folder of links to installed site-packages entries."""
    folder.mkdir()
    for entry in entries:
        if entry.exists():
            (folder / entry.name).symlink_to(entry)
    return folder


def _site_packages(venv: Path) -> Path:
    (site,) = (venv / "lib").glob("python3*/site-packages")
    return site


@pytest.fixture(scope="module")
def base_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel in a fresh venv, with what its metadata requires and without the analysis extra."""
    root = tmp_path_factory.mktemp("wheel-venv")
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = Parser().parsestr(archive.read(metadata).decode()).get_all("Requires-Dist") or []
    base = _entries(_closure(requires))
    _view(root / "deps", base)
    _view(root / "analysis-deps", _entries(_closure(requires, "analysis")) - base)
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    _pip("--python", str(venv / "bin" / "python"), "install", "-q", "--no-deps", str(wheel))
    (_site_packages(venv) / "kproxy-test-deps.pth").write_text(f"{root / 'deps'}\n")
    return venv


@pytest.fixture
def with_analysis(base_venv: Path) -> Iterator[Path]:
    """The venv with the analysis extra's distributions as well, for one test."""
    line = _site_packages(base_venv) / "kproxy-test-analysis.pth"
    line.write_text(f"{base_venv.parent / 'analysis-deps'}\n")
    try:
        yield base_venv
    finally:
        line.unlink()


def _run(venv: Path, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):
    environment = _clean_env()
    environment["PATH"] = f"{venv / 'bin'}:{environment.get('PATH', '')}"
    environment.update(env or {})
    return timed(lambda: subprocess.run([str(venv / "bin" / "kproxy"), *args], cwd=cwd, env=environment,
                                        capture_output=True, text=True, timeout=timeout))


def test_wheel_holds_every_module_and_shipped_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    # The wheel's top-level packages and the folders they come from.
    sources = {"kproxy": ROOT / "kproxy", "kproxy_spark": ROOT / "spark" / "kproxy_spark"}
    modules = {f"{package}/{p.relative_to(folder)}" for package, folder in sources.items() for p in folder.rglob("*.py")
               if "__pycache__" not in p.parts}
    assert modules - names == set(), "packages missing from pyproject.toml's list"
    assert "kproxy_spark/log4j2.properties" in names
    assert not any(n.startswith("spark/") for n in names), "the analysis installs as kproxy_spark, never as spark"
    for folder in ("rules", "dashboards"):
        shipped = {f"kproxy/_data/{p.relative_to(ROOT)}" for p in (ROOT / folder).rglob("*") if p.is_file()}
        assert shipped and shipped <= names
    assert not any(n.startswith(("rules/", "dashboards/", "tests/")) for n in names)


def test_demo_list_shows_the_shipped_scenarios_from_any_directory(base_venv: Path, tmp_path: Path) -> None:
    done, _ = _run(base_venv, "demo", "--list", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [p.stem for p in sorted((ROOT / "rules").glob("*.yaml"))]


def test_rules_dir_still_chooses_where_scenarios_come_from(base_venv: Path, tmp_path: Path) -> None:
    mine = tmp_path / "my-rules"
    mine.mkdir()
    shutil.copy(ROOT / "rules" / "healthy.yaml", mine / "my-calm-run.yaml")
    done, _ = _run(base_venv, "demo", "--list", "--rules-dir", "my-rules", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["my-calm-run"]


def test_rules_validate_passes_on_a_shipped_scenario(base_venv: Path, tmp_path: Path) -> None:
    where = subprocess.run([str(base_venv / "bin" / "python"), "-c", "from kproxy.demo import rules_dir; print(rules_dir())"],
                           cwd=tmp_path, capture_output=True, text=True, check=True,
                           env=_clean_env())
    rules = Path(where.stdout.strip())
    assert rules.is_relative_to(base_venv), "the scenarios must come from the installed package"
    done, _ = _run(base_venv, "rules", "validate", str(rules / "torn-transaction.yaml"), cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith(f"ok: {rules / 'torn-transaction.yaml'} (")


def test_demo_without_the_analysis_extra_stops_at_once_with_the_fix(base_venv: Path, tmp_path: Path) -> None:
    done, elapsed = _run(base_venv, "demo", "--scenario", "healthy", "--duration", "5", cwd=tmp_path)
    assert done.returncode == 3
    assert elapsed.within_a_second(), elapsed
    assert "missing: pyspark" in done.stderr
    assert f"{base_venv / 'bin' / 'python'} -m pip install 'kproxy[analysis]'" in done.stderr
    assert "[1/4]" not in done.stdout, "a broker was started"
    assert list(tmp_path.iterdir()) == [], "the demo wrote output before failing"


def test_analyze_without_the_analysis_extra_names_the_extra(base_venv: Path, tmp_path: Path) -> None:
    history = tmp_path / "history.jsonl"
    history.write_text(json.dumps({"index": 0, "time": 0, "process": 0, "type": "invoke", "f": "send",
                                   "value": [["send", 0, 1]]}) + "\n")
    done, elapsed = _run(base_venv, "analyze", "--history", str(history), "--out", "report", cwd=tmp_path)
    assert done.returncode == 2
    assert elapsed.within_a_second(), elapsed
    assert "kproxy analyze needs the analysis dependencies" in done.stderr
    assert not (tmp_path / "report").exists()


def test_the_code_a_cluster_analysis_ships_is_the_installed_wheels(wheel: Path, base_venv: Path,
                                                                   tmp_path: Path) -> None:
    # What `kproxy analyze --master spark://...` adds to the session (tests/test_spark_standalone.py
    # runs it on a cluster from the checkout's install): built from the installed packages, not a checkout.
    done = subprocess.run([str(base_venv / "bin" / "python"), "-m", "kproxy_spark.cluster"], cwd=tmp_path,
                          env={**_clean_env(), "XDG_CACHE_HOME": str(tmp_path / "cache")},
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    shipped = Path(done.stdout.strip())
    assert shipped.parent == tmp_path / "cache" / "kproxy" / "analysis"
    with zipfile.ZipFile(wheel) as built, zipfile.ZipFile(shipped) as archive:
        packaged = {n: built.read(n) for n in built.namelist() if n.startswith(("kproxy/", "kproxy_spark/"))}
        assert {n: archive.read(n) for n in archive.namelist()} == packaged


def test_demo_without_java_stops_at_once_naming_java(base_venv: Path, tmp_path: Path) -> None:
    # Only the venv on PATH and no JAVA_HOME: no java anywhere Spark would look.
    done, elapsed = _run(base_venv, "demo", "--scenario", "healthy", cwd=tmp_path,
                         env={"PATH": str(base_venv / "bin"), "JAVA_HOME": ""})
    assert done.returncode == 3
    assert elapsed.within_a_second(), elapsed
    assert "needs Java 17 or later: no java found on PATH" in done.stderr
    assert "apt-get install openjdk-17-jre-headless" in done.stderr
    assert list(tmp_path.iterdir()) == []


def _origins(venv: Path, cwd: Path) -> dict[str, str]:
    code = ("import json, kproxy, kproxy_spark, pyspark; "
            "print(json.dumps({m.__name__: m.__file__ for m in (kproxy, kproxy_spark, pyspark)}))")
    done = subprocess.run([str(venv / "bin" / "python"), "-c", code], cwd=cwd, env=_clean_env(),
                          capture_output=True, text=True, timeout=60, check=True)
    return json.loads(done.stdout)


@pytest.mark.spark
@pytest.mark.timeout(600)  # a broker, the proxy, a 2 s workload and the analysis's JVM on a loaded machine
def test_demo_from_the_wheel_writes_its_report_under_the_current_directory(with_analysis: Path, tmp_path: Path) -> None:
    venv = with_analysis
    origins = _origins(venv, tmp_path)
    # The code under test is the wheel's, not the checkout's; only the dependencies come from outside.
    assert Path(origins["kproxy"]).is_relative_to(venv), origins
    assert Path(origins["kproxy_spark"]).is_relative_to(venv), origins
    assert not Path(origins["pyspark"]).is_relative_to(ROOT), origins
    # What is checked here is that the wheel's demo runs every stage (broker, proxy, clients, the analysis on
    # the wheel's own code) and where it writes; a longer workload only makes a larger trace to analyse
    # (2 s: about 30 s of CPU for the whole demo, 5 s: about 75 s).
    done, _ = _run(venv, "demo", "--scenario", "healthy", "--duration", "2", "--no-progress", cwd=tmp_path,
                   timeout=480)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: anomalies found, the demo worked
    (out,) = (tmp_path / "demo-out").iterdir()
    report = json.loads((out / "report.json").read_text())
    assert report["valid"] in (True, False, "unknown") and isinstance(report["counts"], dict)
    assert (out / "report.html").stat().st_size > 0
    assert report["broker"]["started_by_kproxy"] is True
    assert sorted(p.name for p in tmp_path.iterdir()) == ["demo-out"], "the demo wrote outside the current directory"


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(600)
def test_analyze_from_the_wheel_reads_paths_relative_to_where_it_runs(with_analysis: Path, tmp_path: Path) -> None:
    shutil.copytree(ROOT / "tests" / "data" / "recorded" / "noida-torn-transaction", tmp_path / "run")
    done, _ = _run(with_analysis, "analyze", "--history", "run/history.jsonl", "--traces", "run/traces",
                   "--out", "report", "--quiet", cwd=tmp_path, timeout=480)
    assert done.returncode == 1, done.stdout + done.stderr  # the recorded torn transaction is found
    assert json.loads((tmp_path / "report" / "report.json").read_text())["valid"] is False


def test_the_image_build_gets_every_folder_the_package_build_reads() -> None:
    import tomllib

    mapped = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-dir"].values()
    dockerfile = (ROOT / "Dockerfile").read_text().splitlines()
    allowed = (ROOT / ".dockerignore").read_text().splitlines()
    for folder in {path.split("/")[0] for path in mapped}:
        assert f"COPY {folder} ./{folder}" in dockerfile, f"the Dockerfile does not copy {folder}/"
        assert f"!{folder}/" in allowed, f".dockerignore keeps {folder}/ out of the build context"


def test_java_versions_read_the_way_spark_needs_them(tmp_path: Path) -> None:
    from kproxy.prereqs import MissingPrerequisite, check_java, java_major, release_major

    assert java_major('openjdk version "17.0.15" 2025-04-15') == 17
    assert java_major('openjdk version "21" 2023-09-19') == 21
    assert java_major('java version "1.8.0_392"') == 8
    # A runtime laid out as a JDK is (bin/java beside a release file); Spark refuses Java 11.
    (tmp_path / "bin").mkdir()
    java = tmp_path / "bin" / "java"
    java.write_text("")
    java.chmod(0o755)
    (tmp_path / "release").write_text('IMPLEMENTOR="Eclipse Adoptium"\nJAVA_VERSION="11.0.22"\n')
    assert release_major(str(java)) == 11
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("JAVA_HOME", str(tmp_path))
        with pytest.raises(MissingPrerequisite, match=r"needs Java 17 or later; .* is Java 11"):
            check_java("demo")
    real = shutil.which("java")
    assert real is not None and (release_major(real) or 0) >= 17, "the machine's own Java 17 reads as such"


def test_bench_plot_without_matplotlib_stops_before_measuring(base_venv: Path, tmp_path: Path) -> None:
    done, elapsed = _run(base_venv, "bench", "--plot", "bench.png", cwd=tmp_path)
    assert done.returncode == 2
    assert elapsed.within_a_second(), elapsed
    assert "--plot needs matplotlib" in done.stderr and "'kproxy[analysis]'" in done.stderr
    assert list(tmp_path.iterdir()) == []
