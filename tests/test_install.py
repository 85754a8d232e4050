"""kproxy as users install it: a wheel built from this tree, installed into a
fresh venv, run from a directory that is not the source tree.

The default-suite tests install the wheel without the `analysis` extra (the
base dependencies come from the pip cache in a few seconds): the shipped
scenarios, `rules validate` on one of them, and the prerequisite checks that
must fail at once, before any broker starts. The end-to-end demo from the
wheel needs PySpark in the venv as well and is marked slow.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# What the build reads; copied so that building leaves no build/ or egg-info in the tree.
BUILD_INPUTS = ("pyproject.toml", "README.md", "kproxy", "spark", "rules", "dashboards")


def _clean_env() -> dict[str, str]:
    # The suite runs with PYTHONPATH on the source tree; the installed kproxy must not see it (nor must pip,
    # which would take the tree's kproxy for an installed one).
    return {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}


def _pip(*args: str, timeout: float = 600) -> None:
    # The suite's own pip installs into the test venvs (--python): the fresh venvs need no pip of their own.
    subprocess.run([sys.executable, "-m", "pip", *args], check=True, capture_output=True, text=True, timeout=timeout,
                   env=_clean_env())


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    work = tmp_path_factory.mktemp("wheel-build")
    source = work / "src"
    source.mkdir()
    for name in BUILD_INPUTS:
        origin = ROOT / name
        if origin.is_dir():
            shutil.copytree(origin, source / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc", "*.egg-info"))
        else:
            shutil.copy2(origin, source / name)
    _pip("wheel", "--no-deps", "-q", "-w", str(work / "dist"), str(source))
    (built,) = (work / "dist").glob("kproxy-*.whl")
    return built


def _fresh_venv(root: Path, requirement: str) -> Path:
    venv = root / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True, timeout=60)
    _pip("--python", str(venv / "bin" / "python"), "install", "-q", requirement)
    return venv


@pytest.fixture(scope="module")
def base_venv(wheel: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel with its default dependencies only: no analysis extra."""
    return _fresh_venv(tmp_path_factory.mktemp("base-venv"), str(wheel))


def _run(venv: Path, *args: str, cwd: Path, env: dict[str, str] | None = None, timeout: float = 60):
    environment = _clean_env()
    environment["PATH"] = f"{venv / 'bin'}:{environment.get('PATH', '')}"
    environment.update(env or {})
    started = time.monotonic()
    done = subprocess.run([str(venv / "bin" / "kproxy"), *args], cwd=cwd, env=environment,
                          capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


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
    assert elapsed < 1.0, f"took {elapsed:.2f}s"
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
    assert elapsed < 1.0, f"took {elapsed:.2f}s"
    assert "kproxy analyze needs the analysis dependencies" in done.stderr
    assert not (tmp_path / "report").exists()


def test_demo_without_java_stops_at_once_naming_java(base_venv: Path, tmp_path: Path) -> None:
    # Only the venv on PATH and no JAVA_HOME: no java anywhere Spark would look.
    done, elapsed = _run(base_venv, "demo", "--scenario", "healthy", cwd=tmp_path,
                         env={"PATH": str(base_venv / "bin"), "JAVA_HOME": ""})
    assert done.returncode == 3
    assert elapsed < 1.0, f"took {elapsed:.2f}s"
    assert "needs Java 17 or later: no java found on PATH" in done.stderr
    assert "apt-get install openjdk-17-jre-headless" in done.stderr
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(900)  # installing PySpark, a demo and a second analysis, each with its own JVM
def test_demo_from_the_wheel_writes_its_report_under_the_current_directory(wheel: Path, tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path, f"{wheel}[analysis]")
    run_dir = tmp_path / "elsewhere"
    run_dir.mkdir()
    done, _ = _run(venv, "demo", "--scenario", "healthy", "--duration", "5", "--no-progress", cwd=run_dir, timeout=600)
    assert done.returncode in (0, 1), done.stdout + done.stderr  # 1: anomalies found, the demo worked
    (out,) = (run_dir / "demo-out").iterdir()
    report = json.loads((out / "report.json").read_text())
    assert "valid" in report and (out / "report.html").is_file()
    assert report["broker"]["started_by_kproxy"] is True
    # The analysis on its own, from the installed package, with paths relative to where it runs.
    run = out.relative_to(run_dir)
    done, _ = _run(venv, "analyze", "--history", str(run / "history.jsonl"), "--traces", str(run / "traces"),
                   "--out", "again", "--quiet", cwd=run_dir, timeout=600)
    assert done.returncode in (0, 1), done.stderr
    assert json.loads((run_dir / "again" / "report.json").read_text())["valid"] == report["valid"]


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
    assert elapsed < 1.0, f"took {elapsed:.2f}s"
    assert "--plot needs matplotlib" in done.stderr and "'kproxy[analysis]'" in done.stderr
    assert list(tmp_path.iterdir()) == []
