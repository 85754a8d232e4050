"""`kproxy rules`: offline validation and schema, and the admin-API client
subcommands against a real HTTP server serving the rule routes over a real
FaultEngine (the same routes the proxy's admin server mounts)."""

from __future__ import annotations

import asyncio
import json
import socket
import textwrap
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from click.testing import CliRunner
from hypercorn.asyncio import serve
from hypercorn.config import Config
from starlette.applications import Starlette

from kproxy.cli import main
from kproxy.faults import FaultEngine, ExchangeView, load_rule_file
from kproxy.faults.admin_routes import rules_routes

RULES_DIR = Path(__file__).resolve().parent.parent / "rules"

RUNNING_RULES = textwrap.dedent("""
    version: 1
    seed: 7
    rules:
      - id: torn
        match: {api: end_txn, committed: true, txn_number: 1}
        action: {type: duplicate, copies: 1, hold_until: next_txn_records}
        limits: {once: true}
      - id: slow-produce
        match: {api: produce}
        action: {type: delay, ms: 5}
    schedule:
      phases:
        - {name: warmup, duration_s: 3600, rules: []}
""").lstrip()


def kproxy(*args: str, input: str | None = None):  # noqa: ANN201 - click's Result
    return CliRunner().invoke(main, ["rules", *args], input=input)


# -- offline --------------------------------------------------------------------

def test_validate_every_shipped_rule_file() -> None:
    files = sorted(str(p) for p in RULES_DIR.glob("*.yaml"))
    result = kproxy("validate", *files)
    assert result.exit_code == 0, result.stderr
    assert result.stdout.splitlines() == [f"ok: {f} ({len(load_rule_file(f).rules)} rule{'' if len(load_rule_file(f).rules) == 1 else 's'})" for f in files]
    assert "ok: " + str(RULES_DIR / "torn-transaction.yaml") + " (1 rule)" in result.stdout


def test_validate_reports_file_and_line_and_fails(tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("version: 1\nrules: []\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules:\n  - id: a\n    action: {type: delay, ms: 5, jitter: 1}\n")
    result = kproxy("validate", str(good), str(bad))
    assert result.exit_code == 1
    assert result.stdout == f"ok: {good} (0 rules)\n"
    assert result.stderr == f"{bad}:4: rules[0].action.jitter: Extra inputs are not permitted\n"


def test_schema_is_json_for_editors() -> None:
    result = kproxy("schema")
    assert result.exit_code == 0
    schema = json.loads(result.stdout)
    assert schema["title"] == "kproxy rule file" and "Rule" in schema["$defs"]


@pytest.mark.parametrize("command", [[], ["validate"], ["schema"], ["list"], ["add"], ["enable"], ["disable"],
                                     ["delete"], ["reset"], ["reload"]])
def test_every_help_is_complete(command: list[str]) -> None:
    result = kproxy(*command, "--help")
    assert result.exit_code == 0
    assert "Usage: " in result.stdout and len(result.stdout.splitlines()) > 4
    if command and command[0] not in ("validate", "schema"):
        assert "--admin HOST:PORT" in result.stdout


# -- against a running admin API ---------------------------------------------------

@dataclass
class AdminServer:
    address: str
    engine: FaultEngine
    rule_path: Path


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def admin(tmp_path: Path) -> Iterator[AdminServer]:
    rule_path = tmp_path / "running.yaml"
    rule_path.write_text(RUNNING_RULES)
    server = AdminServer("", FaultEngine(load_rule_file(rule_path)), rule_path)

    def reload() -> None:
        server.engine.replace(load_rule_file(rule_path))  # a bad file raises and nothing changes

    app = Starlette(routes=rules_routes(lambda: server.engine, reload, clock=time.monotonic))
    port = _free_port()
    config = Config()
    config.bind = [f"127.0.0.1:{port}"]
    config.accesslog = config.errorlog = None
    loop = asyncio.new_event_loop()
    stop = asyncio.Event()

    def run() -> None:
        asyncio.set_event_loop(loop)
        loop.run_until_complete(serve(app, config, shutdown_trigger=stop.wait))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    server.address = f"127.0.0.1:{port}"
    deadline = time.monotonic() + 10
    while True:
        try:
            httpx.get(f"http://{server.address}/rules", timeout=1)
            break
        except httpx.TransportError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.05)
    yield server
    loop.call_soon_threadsafe(stop.set)
    thread.join(timeout=10)


def rules_on(server: AdminServer) -> dict:
    return httpx.get(f"http://{server.address}/rules", timeout=5).json()


def test_list_shows_rules_counters_and_phase(admin: AdminServer) -> None:
    admin.engine.decide(ExchangeView(0, 9), time.monotonic())
    result = kproxy("list", "--admin", admin.address)
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0] == "phase: warmup"
    assert lines[1].split() == ["ID", "ENABLED", "MATCH", "ACTION", "MATCHED", "APPLIED"]
    assert lines[2].split() == ["torn", "yes", "api=end_txn", "committed=true", "txn_number=1", "duplicate", "0", "0"]
    assert lines[3].split() == ["slow-produce", "yes", "api=produce", "delay", "1", "1"]
    as_json = json.loads(kproxy("list", "--json", "--admin", admin.address).stdout)
    assert as_json["rules"][1]["counters"] == {"matched": 1, "applied": 1}


def test_add_one_rule_a_list_and_a_whole_file(admin: AdminServer, tmp_path: Path) -> None:
    single = tmp_path / "one.yaml"
    single.write_text("id: lost-ack\nmatch: {api: produce, every: 10}\naction: {type: drop_response}\n")
    assert kproxy("add", str(single), "--admin", admin.address).stdout == "put: lost-ack\n"
    listed = '[{"id": "fenced", "match": {"api": "end_txn", "txn_number": 2}, "action": {"type": "respond", "error": "PRODUCER_FENCED"}},' \
             ' {"id": "slow-produce", "match": {"api": "produce"}, "action": {"type": "delay", "ms": 50}}]'
    result = kproxy("add", "-", "--admin", admin.address, input=listed)
    assert result.exit_code == 0 and result.stdout == "put: fenced\nput: slow-produce\n"
    assert kproxy("add", str(RULES_DIR / "txn-timeout-fenced.yaml"), "--admin", admin.address).exit_code == 0
    ids = [r["id"] for r in rules_on(admin)["rules"]]
    assert ids == ["torn", "slow-produce", "lost-ack", "fenced", "timeout-as-fenced"]
    assert rules_on(admin)["rules"][1]["action"] == {"type": "delay", "ms": 50.0, "jitter_ms": 0.0}
    # The engine the proxy would consult sees the new rule at once.
    assert admin.engine.decide(ExchangeView(26, 3, committed=True, txn_number=2), time.monotonic()).action == "respond"


def test_add_refuses_a_bad_rule_locally_with_its_line(admin: AdminServer, tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("- id: ok-rule\n  action: {type: drop}\n- id: broken\n  action:\n    type: hold\n    until: forever\n")
    result = kproxy("add", str(bad), "--admin", admin.address)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"{bad}:6: [1].action.until: Input should be ")
    assert [r["id"] for r in rules_on(admin)["rules"]] == ["torn", "slow-produce"]  # nothing sent


def test_add_refuses_a_file_that_is_not_utf8_at_its_line(admin: AdminServer, tmp_path: Path) -> None:
    bad = tmp_path / "latin1.yaml"
    bad.write_bytes(b"- id: ok-rule\n  action: {type: drop}\n- id: caf\xe9\n  action: {type: drop}\n")
    result = kproxy("add", str(bad), "--admin", admin.address)
    assert result.exit_code == 1
    assert result.stderr.startswith(f"{bad}:3: not UTF-8: byte 0xe9"), result.stderr
    assert [r["id"] for r in rules_on(admin)["rules"]] == ["torn", "slow-produce"]  # nothing sent


def test_add_shows_the_proxys_refusal(admin: AdminServer) -> None:
    rule = "id: in-phase\nmatch: {phase: no-such-phase}\naction: {type: drop}\n"
    result = kproxy("add", "-", "--admin", admin.address, input=rule)
    assert result.exit_code == 1
    assert result.stderr == "rule 'in-phase': match.phase: no schedule phase is named 'no-such-phase'\n"


def test_enable_disable_delete_and_unknown_ids(admin: AdminServer) -> None:
    assert kproxy("disable", "torn", "--admin", admin.address).stdout == "disabled: torn\n"
    assert rules_on(admin)["rules"][0]["enabled"] is False
    assert not admin.engine.wants(26, "request")
    assert kproxy("enable", "torn", "--admin", admin.address).stdout == "enabled: torn\n"
    assert admin.engine.wants(26, "request")
    assert kproxy("delete", "slow-produce", "--admin", admin.address).stdout == "deleted: slow-produce\n"
    assert [r["id"] for r in rules_on(admin)["rules"]] == ["torn"]
    for command in ("enable", "disable", "delete"):
        result = kproxy(command, "nope", "--admin", admin.address)
        assert result.exit_code == 1 and result.stderr == "no rule has id 'nope'\n"


def test_reset_zeroes_counters(admin: AdminServer) -> None:
    admin.engine.decide(ExchangeView(0, 9), time.monotonic())
    assert rules_on(admin)["rules"][1]["counters"]["applied"] == 1
    assert kproxy("reset", "--admin", admin.address).stdout == "counters reset\n"
    assert rules_on(admin)["rules"][1]["counters"] == {"matched": 0, "applied": 0}


def test_reload_accepts_a_good_file_and_refuses_a_bad_one(admin: AdminServer) -> None:
    admin.rule_path.write_text("version: 1\nrules:\n  - id: only\n    action: {type: drop}\n")
    result = kproxy("reload", "--admin", admin.address)
    assert result.exit_code == 0 and result.stdout == "reloaded: 1 rules\n"
    assert [r["id"] for r in rules_on(admin)["rules"]] == ["only"]
    admin.rule_path.write_text("version: 1\nrules:\n  - id: only\n    action: {type: drop, why: 1}\n")
    result = kproxy("reload", "--admin", admin.address)
    assert result.exit_code == 1
    assert result.stderr == f"{admin.rule_path}:4: rules[0].action.why: Extra inputs are not permitted\n"
    assert [r["id"] for r in rules_on(admin)["rules"]] == ["only"]  # the running rules stay


def test_put_route_checks_body_and_id(admin: AdminServer) -> None:
    url = f"http://{admin.address}/rules/x"
    assert httpx.put(url, content=b"{not json", timeout=5).status_code == 400
    mismatch = httpx.put(url, json={"id": "y", "action": {"type": "drop"}}, timeout=5)
    assert mismatch.status_code == 400 and "differs" in mismatch.json()["error"]
    created = httpx.put(url, json={"action": {"type": "drop"}}, timeout=5)
    assert created.status_code == 200 and created.json()["id"] == "x"
    listed = rules_on(admin)["rules"][-1]
    assert httpx.put(url, json=listed, timeout=5).status_code == 200  # GET output can be PUT back


def test_unreachable_admin_api_is_a_clear_error() -> None:
    result = kproxy("list", "--admin", f"127.0.0.1:{_free_port()}", "--timeout", "2")
    assert result.exit_code == 1
    assert "cannot reach the admin API at 127.0.0.1:" in result.stderr


def test_run_refuses_a_broken_rule_file_with_its_line_and_no_traceback(tmp_path: Path) -> None:
    bad = tmp_path / "broken.yaml"
    bad.write_text("version: 1\nrules:\n  - id: x\n    match: {api: produce\n    action: {type: drop}\n")
    done = subprocess.run(
        [sys.executable, "-m", "kproxy", "run", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0",
         "--no-admin", "--rules", str(bad)],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: {bad}:5: YAML syntax error"), done.stderr
    assert "Traceback" not in done.stderr


MISFIT_REWRITE = "version: 1\nrules:\n  - id: r\n    action: {type: rewrite, field: fetch_drop_records}\n"


def test_validate_refuses_a_rewrite_field_for_apis_it_does_not_fit(tmp_path: Path) -> None:
    # Without `match` the Fetch-only rewrite would meet ApiVersions and every other answer.
    bad = tmp_path / "misfit.yaml"
    bad.write_text(MISFIT_REWRITE)
    result = kproxy("validate", str(bad))
    assert result.exit_code == 1
    assert result.stderr.startswith(f"{bad}:4: rules[0].action.field: action rewrite with field fetch_drop_records "
                                    "applies only to fetch"), result.stderr


def test_put_refuses_a_rewrite_field_for_apis_it_does_not_fit(admin: AdminServer) -> None:
    url = f"http://{admin.address}/rules/misfit"
    for match in ({}, {"match": {"api": "produce"}}, {"match": {"api": ["fetch", "metadata"]}}):
        refused = httpx.put(url, json={**match, "action": {"type": "rewrite", "field": "fetch_drop_records"}}, timeout=5)
        assert refused.status_code == 400 and "applies only to fetch" in refused.json()["error"], (match, refused.text)
    assert "misfit" not in [r["id"] for r in rules_on(admin)["rules"]]
    fits = httpx.put(url, json={"match": {"api": "Fetch"}, "action": {"type": "rewrite", "field": "fetch_drop_records"}}, timeout=5)
    assert fits.status_code == 200


def test_run_refuses_a_rewrite_field_for_apis_it_does_not_fit(tmp_path: Path) -> None:
    bad = tmp_path / "misfit.yaml"
    bad.write_text(MISFIT_REWRITE)
    done = subprocess.run(
        [sys.executable, "-m", "kproxy", "run", "--upstream", "127.0.0.1:1", "--listen", "127.0.0.1:0",
         "--no-admin", "--rules", str(bad)],
        capture_output=True, text=True, timeout=60, check=False,
    )
    assert done.returncode == 1
    assert done.stderr.startswith(f"Error: {bad}:4: rules[0].action.field: action rewrite"), done.stderr
