"""Build the image with podman and check it the way users run it; each step's time in the log.

    .venv/bin/python scripts/container-check.py [--image kproxy:local] [--keep]

Steps (docs/observability.md, "The image"):

1. base: scripts/container-base.sh makes the Dockerfile's base, debian:bookworm-slim,
   from Debian's packages (cached per machine).
2. build: `podman build` of the repository's Dockerfile, never pulling; the image's size.
3. help: `kproxy --help` in the image.
4. demo: `kproxy demo --broker tansu --duration 5` in the image, in a network of its own,
   to a report (report.json with a verdict, report.html) written to a mounted folder.
5. proxy: the image's proxy in front of a broker on the host (`kproxy broker`, from this
   checkout), with its admin API beyond loopback and the token generated at start, as the
   image's default command has it: its HEALTHCHECK passes, a transactional round trip
   from the host goes through it (scripts/txn-roundtrip.py, confluent-kafka), and the
   admin API refuses a request without the token and takes one with it.
6. compose: deploy/compose.yaml's broker and kproxy services, which name this image, run
   from the compose file's own commands, environment and mounts, sharing a network of
   their own in which the service name `broker` resolves; the broker's health check,
   the demo rules loaded, a transactional round trip inside the stack, and its metrics.
   Its Prometheus and Grafana images come from a registry these machines cannot reach,
   and no compose tool runs here (docs/observability.md says what is and is not checked).

podman runs with scripts/podman-containers.conf (runc, cgroupfs, no rlimits, host
network by default): the settings these machines need. Exit 0 when every step passed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path

import yaml

ROOT = Path(__file__).resolve().parent.parent
TANSU_NODE_ID = 111
PODMAN_ENV = {**os.environ, "CONTAINERS_CONF": os.environ.get("CONTAINERS_CONF",
                                                               str(ROOT / "scripts" / "podman-containers.conf"))}


class CheckFailed(Exception):
    pass


def log(line: str) -> None:
    print(f"[image] {line}", flush=True)


def step(name: str, action: Callable[[], str]) -> None:
    started = time.monotonic()
    outcome = action()
    log(f"{name}: {outcome} ({time.monotonic() - started:.1f} s)")


def podman(*args: str, timeout: float = 120, check: bool = True, stdin: str | None = None) -> subprocess.CompletedProcess:
    done = subprocess.run(["podman", *args], capture_output=True, text=True, timeout=timeout, env=PODMAN_ENV,
                          input=stdin)
    if check and done.returncode != 0:
        raise CheckFailed(f"podman {' '.join(args[:6])} ... exited {done.returncode}:\n{done.stdout[-3000:]}"
                          f"\n{done.stderr[-3000:]}")
    return done


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(what: str, ready: Callable[[], bool], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not ready():
        if time.monotonic() > deadline:
            raise CheckFailed(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.5)


# -- the steps ---------------------------------------------------------------------


def base() -> str:
    done = subprocess.run([str(ROOT / "scripts" / "container-base.sh")], capture_output=True, text=True, timeout=900,
                          env=PODMAN_ENV)
    if done.returncode != 0:
        raise CheckFailed(f"scripts/container-base.sh exited {done.returncode}:\n{done.stdout}\n{done.stderr}")
    return done.stdout.strip().splitlines()[-1]


def build(image: str, log_dir: Path) -> Callable[[], str]:
    def run() -> str:
        build_log = log_dir / "podman-build.log"
        before = podman("image", "inspect", "--format", "{{.Id}}", image, check=False).stdout.strip()
        cpu_before = os.times()
        with build_log.open("w") as out:
            done = subprocess.run(["podman", "build", "--pull=never", "--network=host", "--format", "docker",
                                   "--tag", image, "--file", "Dockerfile", "."], cwd=ROOT, stdout=out,
                                  stderr=subprocess.STDOUT, timeout=1800, env=PODMAN_ENV)
        cpu_after = os.times()
        if done.returncode != 0:
            raise CheckFailed(f"podman build exited {done.returncode}:\n{build_log.read_text()[-5000:]}")
        built, size = podman("image", "inspect", "--format", "{{.Id}} {{.Size}}", image).stdout.split()
        if before and before != built:
            # The image this tag named before: left untagged, it would hold a gigabyte per run.
            podman("rmi", before, check=False)
        cpu = (cpu_after.children_user - cpu_before.children_user) + (cpu_after.children_system - cpu_before.children_system)
        load = " ".join(Path("/proc/loadavg").read_text().split()[:3])
        return (f"{image}, {int(size) / 1e6:.0f} MB; CPU {cpu:.0f} s (podman and the build steps it ran), "
                f"load average {load} (log: {build_log})")

    return run


def help_text(image: str) -> Callable[[], str]:
    def run() -> str:
        done = podman("run", "--rm", "--network=none", "--no-healthcheck", image, "--help")
        if not done.stdout.startswith("Usage: kproxy") or "demo" not in done.stdout:
            raise CheckFailed(f"kproxy --help printed:\n{done.stdout}\n{done.stderr}")
        return "kproxy --help lists the commands"

    return run


def demo(image: str, work: Path) -> Callable[[], str]:
    def run() -> str:
        out = work / "demo"
        out.mkdir()
        out.chmod(0o777)  # the image runs as uid 10001
        done = podman("run", "--rm", "--network=none", "--no-healthcheck", "-v", f"{out}:/var/lib/kproxy/out",
                      image, "demo", "--broker", "tansu", "--duration", "5", "--no-progress",
                      "--out", "/var/lib/kproxy/out/run", timeout=600, check=False)
        # Exit 1: the analysis found anomalies, which the default scenario is there to show.
        if done.returncode not in (0, 1):
            raise CheckFailed(f"kproxy demo exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}")
        report = json.loads((out / "run" / "report.json").read_text())
        html = (out / "run" / "report.html").read_text()
        if report["valid"] is not (done.returncode == 0) or "<html" not in html.lower():
            raise CheckFailed(f"the demo's report does not match its exit {done.returncode}: valid={report['valid']}")
        found = sorted(report.get("anomalies", {}))
        return f"kproxy demo exited {done.returncode}, report valid={report['valid']}, anomalies {found}"

    return run


@contextlib.contextmanager
def host_broker(work: Path) -> Iterator[str]:
    port = free_port()
    broker_log = work / "host-broker.log"
    process = subprocess.Popen([sys.executable, "-m", "kproxy", "broker", "--kind", "tansu", "--host", "127.0.0.1",
                                "--port", str(port)], stdout=broker_log.open("w"), stderr=subprocess.STDOUT, cwd=ROOT)
    try:
        def listening() -> bool:
            if process.poll() is not None:
                raise CheckFailed(f"the host broker exited {process.returncode}: {broker_log.read_text()[-2000:]}")
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), timeout=1):
                return True
            return False

        wait_for("the host broker listening", listening, 60)
        yield f"127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()


@contextlib.contextmanager
def container(name: str, *args: str) -> Iterator[str]:
    podman("run", "--detach", "--name", name, *args)
    try:
        yield name
    finally:
        podman("rm", "--force", "--time", "10", name, check=False, timeout=60)


def status_of(url: str, headers: dict[str, str] | None = None, method: str = "GET", body: bytes | None = None) -> int:
    request = urllib.request.Request(url, data=body, method=method, headers=headers or {})
    try:
        with urllib.request.urlopen(request, timeout=10) as answer:
            return answer.status
    except urllib.error.HTTPError as refused:
        return refused.code


def healthy(name: str) -> bool:
    return podman("healthcheck", "run", name, check=False, timeout=30).returncode == 0


def proxy(image: str, work: Path) -> Callable[[], str]:
    def run() -> str:
        with host_broker(work) as upstream:
            listen = free_port()
            base = 0
            while base <= 1024 or base + TANSU_NODE_ID == listen:
                base = free_port() - TANSU_NODE_ID
            admin = free_port()
            name = f"kproxy-check-{os.getpid()}"
            # The image's default command, pointed at the host's broker and these free ports.
            # The image's default command, pointed at the host's broker and these free ports; the
            # HEALTHCHECK asks the port KPROXY_ADMIN_PORT names, as docs/observability.md tells users.
            with container(name, "--network=host", "--health-interval=disable", "--env", f"KPROXY_ADMIN_PORT={admin}",
                           image, "run", "--upstream", upstream, "--listen", f"127.0.0.1:{listen}",
                           "--broker-port-base", str(base), "--advertise", "127.0.0.1",
                           "--admin", f"0.0.0.0:{admin}", "--admin-token-file", "/var/lib/kproxy/admin-token",
                           "--generate-admin-token"):
                wait_for("the proxy container's HEALTHCHECK (/readyz)", lambda: healthy(name), 60)
                trip = subprocess.run([sys.executable, str(ROOT / "scripts" / "txn-roundtrip.py"), f"127.0.0.1:{listen}"],
                                      capture_output=True, text=True, timeout=180)
                if trip.returncode != 0:
                    logs = podman("logs", name, check=False).stderr[-3000:]
                    raise CheckFailed(f"{trip.stdout}{trip.stderr}\nproxy log:\n{logs}")
                token = podman("exec", name, "cat", "/var/lib/kproxy/admin-token").stdout.strip()
                rules = f"http://127.0.0.1:{admin}/rules"
                refused = status_of(rules)
                taken = status_of(rules, {"Authorization": f"Bearer {token}"})
                put = status_of(f"{rules}/check-delay", {"Authorization": f"Bearer {token}",
                                                         "Content-Type": "application/json"}, "PUT",
                                json.dumps({"match": {"api": "produce"}, "action": {"type": "delay", "ms": 1}}).encode())
                put_refused = status_of(f"{rules}/intruder", {"Content-Type": "application/json"}, "PUT",
                                        json.dumps({"action": {"type": "drop"}}).encode())
                # `kproxy rules` in the container finds the token where the image's KPROXY_ADMIN_TOKEN_FILE says.
                listed = podman("exec", "--env", f"KPROXY_ADMIN=127.0.0.1:{admin}", name, "kproxy", "rules", "list")
                if (refused, taken, put, put_refused) != (401, 200, 200, 401) or "check-delay" not in listed.stdout \
                        or "intruder" in listed.stdout:
                    raise CheckFailed(f"admin API: GET /rules {refused} without the token, {taken} with it; PUT {put} "
                                      f"with it, {put_refused} without; kproxy rules list:\n{listed.stdout}")
        return (f"{trip.stdout.strip()}; admin API 401 without the token, 200 with it; "
                "the HEALTHCHECK passes on /readyz")

    return run


def compose(image: str, work: Path) -> Callable[[], str]:
    def run() -> str:
        deploy = ROOT / "deploy"
        services = yaml.safe_load((deploy / "compose.yaml").read_text())["services"]
        ours = {name: spec for name, spec in services.items() if spec.get("image") == image}
        if set(ours) != {"broker", "kproxy"}:
            raise CheckFailed(f"deploy/compose.yaml: the services of image {image} are {sorted(ours)}")
        tag = f"kproxy-compose-{os.getpid()}"
        traces = work / "compose-traces"
        traces.mkdir()
        traces.chmod(0o777)
        # One network namespace for the stack, not the host's: compose's fixed ports stay private,
        # and the service names are the stack's own loopback, as compose's DNS names its services
        # (a hosts file of its own: podman keeps --add-host from a container joining another's network).
        hosts = work / "compose-hosts"
        hosts.write_text(f"127.0.0.1 localhost {' '.join(services)}\n::1 localhost\n")
        stack = ["-v", f"{hosts}:/etc/hosts:ro", "--health-interval=disable"]
        broker = services["broker"]
        with container(f"{tag}-broker", "--network=none", *stack, *_environment(broker), image,
                       *broker["command"]) as broker_name:
            check = broker["healthcheck"]["test"]
            if check[0] != "CMD":
                raise CheckFailed(f"the broker's healthcheck is {check}")
            # depends_on: condition: service_healthy
            wait_for("the compose broker's healthcheck", lambda: podman("exec", broker_name, *check[1:], check=False)
                     .returncode == 0, 60)
            kproxy = services["kproxy"]
            volumes = []
            for volume in kproxy.get("volumes", []):
                source, target, *mode = volume.split(":")
                host = (deploy / source).resolve() if source.startswith(".") else traces
                volumes += ["-v", ":".join([str(host), target, *mode])]
            with container(f"{tag}-kproxy", f"--network=container:{broker_name}", *stack,
                           *_environment(kproxy), *volumes, image, *kproxy["command"]) as name:
                admin = kproxy["environment"]["KPROXY_ADMIN_PORT"]
                wait_for("the compose kproxy", lambda: healthy(name), 60)
                listen = kproxy["command"][kproxy["command"].index("--listen") + 1].rsplit(":", 1)[1]
                script = (ROOT / "scripts" / "txn-roundtrip.py").read_text()
                trip = podman("exec", "-i", name, "python", "-", f"localhost:{listen}", stdin=script, check=False,
                              timeout=180)
                if trip.returncode != 0:
                    logs = podman("logs", name, check=False).stderr[-3000:]
                    raise CheckFailed(f"{trip.stdout}{trip.stderr}\nkproxy log:\n{logs}")
                listed = podman("exec", name, "kproxy", "rules", "list", "--admin", f"127.0.0.1:{admin}").stdout
                expected = {r["id"] for r in yaml.safe_load((deploy / "rules" / "dashboards-demo.yaml").read_text())["rules"]}
                missing = [rule for rule in expected if rule not in listed]
                metrics = podman("exec", name, "python", "-c",
                                 f"import urllib.request; print(urllib.request.urlopen('http://127.0.0.1:{admin}/metrics')"
                                 ".read().decode())").stdout
                if missing or "kproxy_frames_total" not in metrics:
                    raise CheckFailed(f"compose kproxy: rules missing {missing}; metrics:\n{metrics[:2000]}")
                written = sorted(p.name for p in traces.iterdir())
        return (f"services broker and kproxy of {image}: broker healthy, the demo rules {sorted(expected)} loaded, "
                f"{trip.stdout.strip()}, /metrics served, traces written {written[:3]}")

    return run


def _environment(service: dict) -> list[str]:
    return [f"--env={key}={value}" for key, value in (service.get("environment") or {}).items()]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--image", default="kproxy:local", help="the image's tag, the one deploy/compose.yaml names")
    parser.add_argument("--keep", action="store_true", help="keep the work folder (reports, logs)")
    options = parser.parse_args()
    if shutil.which("podman") is None:
        print("podman is missing: run scripts/install-system-packages.sh", file=sys.stderr)
        return 3
    work = Path(tempfile.mkdtemp(prefix="kproxy-image-check-"))
    started = time.monotonic()
    try:
        step("base", base)
        step("build", build(options.image, work))
        step("help", help_text(options.image))
        step("demo", demo(options.image, work))
        step("proxy", proxy(options.image, work))
        step("compose", compose(options.image, work))
    except CheckFailed as failure:
        log(f"FAILED after {time.monotonic() - started:.1f} s: {failure} (work folder: {work})")
        return 1
    log(f"all checks passed in {time.monotonic() - started:.1f} s")
    if not options.keep:
        shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
