"""Prerequisites of the commands that analyse: the analysis dependencies
(the `analysis` extra) and a Java that Spark can run on.

Checked before a command starts any work (broker, proxy, workload), so a
missing piece fails in well under a second with the command that fixes it
instead of after a run. docs/install.md explains the choice of an extra.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

# Import name -> distribution, as the `analysis` extra in pyproject.toml lists them.
ANALYSIS_MODULES = {
    "pyspark": "pyspark",
    "pyarrow": "pyarrow",
    "pandas": "pandas",
    "matplotlib": "matplotlib",
    "networkx": "networkx",
}
# Spark 4 runs on Java 17 and 21 (and later LTS releases); it refuses 8 and 11.
MIN_JAVA = 17
JAVA_PROBE_TIMEOUT_S = 5.0


class MissingPrerequisite(Exception):
    """What is missing and the exact command that installs it."""


def missing_analysis_modules() -> list[str]:
    # find_spec looks the modules up without importing them: fast, and no JVM.
    return [name for name in ANALYSIS_MODULES if importlib.util.find_spec(name) is None]


def install_analysis_command() -> str:
    """The command that installs the extra into the Python running kproxy."""
    if _is_source_checkout():
        return f"{sys.executable} -m pip install -e '{Path(__file__).resolve().parent.parent}[analysis]'"
    return f"{sys.executable} -m pip install 'kproxy[analysis]'"


def _is_source_checkout() -> bool:
    package = Path(__file__).resolve().parent
    return not (package / "_data").is_dir() and (package.parent / "pyproject.toml").is_file()


def check_analysis(command: str) -> None:
    missing = missing_analysis_modules()
    if missing:
        raise MissingPrerequisite(
            f"kproxy {command} needs the analysis dependencies (the 'analysis' extra); missing: "
            f"{', '.join(missing)}.\nInstall them with:\n    {install_analysis_command()}\n"
            "(installed with pipx: pipx install --force 'kproxy[analysis]')"
        )


def java_executable() -> tuple[str | None, str]:
    """The java Spark will launch (JAVA_HOME first, as spark-class does, then PATH) and where it came from."""
    java_home = os.environ.get("JAVA_HOME")
    if java_home:
        candidate = Path(java_home) / "bin" / "java"
        return (str(candidate) if os.access(candidate, os.X_OK) else None), f"JAVA_HOME={java_home}"
    return shutil.which("java"), "PATH"


def java_major(version_output: str) -> int | None:
    """The major version from `java -version` output ("17.0.15", "21", or the old "1.8.0_392")."""
    match = re.search(r'version "(\d+)(?:\.(\d+))?', version_output)
    if match is None:
        return None
    major = int(match.group(1))
    if major == 1 and match.group(2) is not None:
        major = int(match.group(2))
    return major


def release_major(java: str) -> int | None:
    """The major version from the runtime's `release` file beside bin/java, or None without one.

    Every JDK and JRE build since 9 has it. Reading it costs nothing, where
    `java -version` starts a JVM: on a loaded machine that alone can take
    longer than the second a missing prerequisite may cost.
    """
    release = Path(os.path.realpath(java)).parent.parent / "release"
    try:
        text = release.read_text(errors="replace")
    except OSError:
        return None
    match = re.search(r'^JAVA_VERSION="([^"]+)"', text, re.MULTILINE)
    return java_major(f'version "{match.group(1)}"') if match else None


JAVA_FIX = (
    f"Install Java {MIN_JAVA} or 21 (Debian/Ubuntu: sudo apt-get install openjdk-17-jre-headless; "
    f"macOS: brew install openjdk@17), then put its java on PATH or set JAVA_HOME to it."
)


def check_java(command: str) -> None:
    java, source = java_executable()
    if java is None:
        where = "in JAVA_HOME/bin" if source != "PATH" else "on PATH"
        raise MissingPrerequisite(
            f"kproxy {command} runs its analysis on Spark, which needs Java {MIN_JAVA} or later: "
            f"no java found {where} ({source}).\n{JAVA_FIX}"
        )
    major = release_major(java)
    if major is not None:
        if major < MIN_JAVA:
            raise MissingPrerequisite(
                f"kproxy {command} runs its analysis on Spark, which needs Java {MIN_JAVA} or later; "
                f"{java} ({source}) is Java {major}.\n{JAVA_FIX}"
            )
        return
    try:
        probe = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=JAVA_PROBE_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise MissingPrerequisite(f"kproxy {command}: {java} ({source}) does not run: {exc}.\n{JAVA_FIX}") from None
    major = java_major(probe.stderr + probe.stdout)
    if probe.returncode != 0 or major is None:
        raise MissingPrerequisite(
            f"kproxy {command}: {java} ({source}) does not run (`java -version` exited {probe.returncode}: "
            f"{(probe.stderr or probe.stdout).strip()[:200]}).\n{JAVA_FIX}"
        )
    if major < MIN_JAVA:
        raise MissingPrerequisite(
            f"kproxy {command} runs its analysis on Spark, which needs Java {MIN_JAVA} or later; "
            f"{java} ({source}) is Java {major}.\n{JAVA_FIX}"
        )


def check_spark_prerequisites(command: str) -> None:
    """Everything the local Spark analysis needs; MissingPrerequisite names every missing piece at once."""
    problems = []
    for check in (check_analysis, check_java):
        try:
            check(command)
        except MissingPrerequisite as exc:
            problems.append(str(exc))
    if problems:
        raise MissingPrerequisite("\n\n".join(problems))
