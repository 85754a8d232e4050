"""The Go clients' bridges (`--client franz-go`, `--client sarama`): found, checked and built once per machine.

go_bridge/ is one Go module (go.mod and go.sum pin franz-go and IBM/sarama)
with a package per client, franzgo/ and sarama/, and the protocol they share,
bridge/ (the same JSON lines as the Java bridge; kproxy.workload.clients.bridge
drives all three). `go build` compiles both binaries into a cache keyed by a
hash of the module's files:

    $XDG_CACHE_HOME/kproxy/go-clients/<hash>/{franzgo,sarama}   (default ~/.cache/...)

The build runs in a scratch copy beside the cache entry, and the finished
directory is moved into place last, so an interrupted build is redone, never
half used; a lock file keeps two processes from building at once. It needs Go
(go.mod's `go` line says which) and the Go module proxy, and takes about a
minute on two cores with an empty module cache. `make go-clients` (a
dependency of `make test`) and `python -m kproxy.workload.clients.go_build`
build ahead of use; otherwise the first run that asks for a Go client builds
them, with progress lines.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from kproxy.kafka.jars import cache_root, locked
from kproxy.workload.clients.bridge import Bridge, BridgeFactory

SOURCE = Path(__file__).with_name("go_bridge")
#: Workload client name -> the module's package (and binary) name.
PACKAGES = {"franz-go": "franzgo", "sarama": "sarama"}
#: Resolving modules and compiling both: about a minute on two idle cores; far longer on a loaded machine.
BUILD_TIMEOUT = 1200.0
PROGRESS_EVERY = 10.0
PROBE_TIMEOUT = 5.0

Say = Callable[[str], None]


class GoSetupError(ValueError):
    """Go is missing or too old, or the build failed; the message names what and how to fix it.

    A ValueError, as a setting the client refuses: the workload reports it and does not start.
    """


def find_go() -> str | None:
    """$KPROXY_GO, else `go` on PATH, else the official tarball's place (a shell profile puts it on PATH;
    make and CI may not)."""
    chosen = os.environ.get("KPROXY_GO")
    if chosen is not None:
        return chosen if os.access(chosen, os.X_OK) else None
    found = shutil.which("go")
    if found:
        return found
    fallback = Path("/usr/local/go/bin/go")
    return str(fallback) if os.access(fallback, os.X_OK) else None


def required_go() -> tuple[int, int]:
    """The Go release go.mod asks for."""
    match = re.search(r"^go (\d+)\.(\d+)", (SOURCE / "go.mod").read_text(), re.MULTILINE)
    assert match, "go_bridge/go.mod has no go line"
    return int(match.group(1)), int(match.group(2))


def go_release(go: str) -> tuple[int, int] | None:
    """What `go version` says (go1.26.8 -> (1, 26)), or None if it does not run."""
    try:
        out = subprocess.run([go, "version"], capture_output=True, text=True, timeout=PROBE_TIMEOUT,
                             check=False).stdout
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"\bgo(\d+)\.(\d+)", out)
    return (int(match.group(1)), int(match.group(2))) if match else None


def preflight() -> str:
    """The `go` that will build the bridges; GoSetupError naming what is missing, without building anything."""
    major, minor = required_go()
    need = f"Go {major}.{minor}+"
    go = find_go()
    if go is None:
        where = (f"$KPROXY_GO={os.environ['KPROXY_GO']} is not an executable" if "KPROXY_GO" in os.environ
                 else "no `go` on PATH or at /usr/local/go/bin/go")
        raise GoSetupError(f"the franz-go and sarama clients are built with Go, which is missing: {need} "
                           f"({where}; install it from https://go.dev/dl)")
    release = go_release(go)
    if release is None:
        raise GoSetupError(f"the franz-go and sarama clients need {need}; `{go} version` did not run")
    if release < required_go():
        raise GoSetupError(f"the franz-go and sarama clients need {need}; {go} is Go {release[0]}.{release[1]}")
    return go


def check_client(name: str) -> None:
    """Before any work: a Go client not yet built on this machine needs Go (GoSetupError names what is missing)."""
    if name in PACKAGES and not cached(cache_dir()):
        preflight()


def source_files() -> list[Path]:
    return sorted(p for p in SOURCE.rglob("*") if p.is_file() and (p.suffix == ".go" or p.name in ("go.mod", "go.sum")))


def cache_dir() -> Path:
    digest = hashlib.sha256()
    for path in source_files():
        digest.update(str(path.relative_to(SOURCE)).encode() + b"\0" + path.read_bytes() + b"\0")
    return cache_root().parent / "go-clients" / digest.hexdigest()[:16]


def cached(directory: Path) -> bool:
    return all(os.access(directory / name, os.X_OK) for name in PACKAGES.values())


def run_go(go: str, args: list[str], *, cwd: Path, say: Say, what: str, deadline: float,
           error: type[Exception], module: str) -> None:
    """Run one go command, passing on its `go: downloading` lines and saying every 10 s that it still works.

    A failure raises `error` with go's last lines, and a hint when the module proxy did not serve `module`.
    """
    env = {**os.environ, "GOWORK": "off"}  # a go.work above the build must not pull the module in
    proc = subprocess.Popen([go, *args], cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)
    assert proc.stdout is not None
    lines: list[str] = []
    started = time.monotonic()

    def read() -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            line = line.rstrip()
            lines.append(line)
            if line.startswith("go: downloading"):
                say(f"  {line}")

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        while True:
            try:
                proc.wait(timeout=min(PROGRESS_EVERY, max(0.1, deadline - time.monotonic())))
                break
            except subprocess.TimeoutExpired:
                if time.monotonic() > deadline:
                    raise error(f"{what} did not finish in time; gave up") from None
                say(f"  {what}: {time.monotonic() - started:.0f} s ...")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        reader.join(timeout=5)
    if proc.returncode != 0:
        detail = "\n".join(lines[-15:])
        hint = ""
        if any(word in detail for word in ("proxy.golang.org", "dial tcp", "no such host", "i/o timeout",
                                           "connection refused", "GOPROXY", "410 Gone", "404 Not Found")):
            hint = (f"\nthe Go module proxy ({os.environ.get('GOPROXY') or 'GOPROXY: go env GOPROXY'}) did not "
                    f"serve {module}: check the network, or set GOPROXY to a proxy that has it")
        raise error(f"{what} failed (go exit {proc.returncode}):\n{detail}{hint}")
    say(f"  {what}: done in {time.monotonic() - started:.0f} s")


def build(say: Say = lambda _: None) -> Path:
    """The cache directory holding both bridge binaries, built first if needed."""
    directory = cache_dir()
    if cached(directory):
        return directory
    go = preflight()
    with locked(directory.parent / ".lock"):
        if cached(directory):  # another process may have built them while we waited
            return directory
        say(f"building the franz-go and sarama client bridges ({SOURCE}) into {directory}; "
            "about a minute, once per machine")
        deadline = time.monotonic() + BUILD_TIMEOUT
        with tempfile.TemporaryDirectory(prefix=".build-", dir=directory.parent) as tmp:
            work = Path(tmp) / "src"
            shutil.copytree(SOURCE, work, ignore=shutil.ignore_patterns("__pycache__"))
            out = Path(tmp) / "bin"
            run_go(go, ["build", "-mod=readonly", "-buildvcs=false", "-trimpath", "-o", f"{out}{os.sep}",
                        *(f"./{name}" for name in PACKAGES.values())],
                   cwd=work, say=say, what="go build (franz-go, sarama)", deadline=deadline,
                   error=GoSetupError, module="github.com/twmb/franz-go and github.com/IBM/sarama")
            if not cached(out):
                raise GoSetupError(f"go build finished but {out} lacks {', '.join(PACKAGES.values())}")
            out.rename(directory)  # last: a directory in place is a whole one
    say(f"the Go client bridges are cached in {directory}")
    return directory


def binary(client: str, say: Say = lambda _: None) -> Path:
    """The bridge binary of a Go client ("franz-go" or "sarama")."""
    return build(say) / PACKAGES[client]


class GoBridgeFactory(BridgeFactory):
    """A Go client's factory: its bridge binary (built first if this machine has none) in one process per run."""

    def __init__(self, bootstrap: str, producer_overrides: Mapping[str, str], consumer_overrides: Mapping[str, str],
                 admin_overrides: Mapping[str, str] | None = None) -> None:
        # A first build takes a minute: say so on stderr, whatever the log level.
        path = binary(self.name, say=lambda text: print(f"[{self.name}] {text}", file=sys.stderr, flush=True))
        super().__init__(Bridge([str(path)], f"the {self.name} client bridge"), bootstrap, producer_overrides,
                         consumer_overrides, admin_overrides)


def main(argv: list[str] | None = None) -> int:
    """`python -m kproxy.workload.clients.go_build`: build (or find) both bridges and print their directory."""
    del argv
    try:
        print(build(say=lambda text: print(text, file=sys.stderr, flush=True)))
    except (GoSetupError, OSError, subprocess.TimeoutExpired) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
