"""`kproxy shrink` with real runs: the session's Tansu broker, real clients, the shared Spark session."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from kproxy.demo import profile_for, run_demo
from kproxy.faults.loader import load_rule_file
from kproxy.shrink.runner import NotReproduced, ShrinkConfig, run_shrink
from kproxy.shrink.search import Floors, anomaly_appears

DATA = Path(__file__).parent / "data"
RULES = Path(__file__).parent.parent / "rules"
NOISY = DATA / "shrink-torn-plus-noise.yaml"


def quiet(line: str) -> None:
    pass


def two_rules(tmp_path: Path) -> Path:
    """The torn-transaction rule and the latency rule, the quickest start with something to remove."""
    data = yaml.safe_load(NOISY.read_text())
    data["rules"] = [r for r in data["rules"] if r["id"] != "fetch-hides-records"]
    path = tmp_path / "torn-plus-latency.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


@pytest.mark.spark
@pytest.mark.timeout(420)
def test_shrink_drops_the_unrelated_rule_and_keeps_every_run(broker, spark, tmp_path):
    out = tmp_path / "shrink"
    # Two runs a candidate: whether a stale commit tears a transaction or commits all of it depends on how
    # the client batched that transaction's sends, and a suite run once met a five-second run with six
    # stale commits and no tear. The rejected candidate pays both runs; a kept one stops at its first tear.
    # Floors at the starting workload: the three candidates are the rule moves, not the run-time ones.
    config = ShrinkConfig(rules_file=two_rules(tmp_path), anomaly="torn-transaction", out_dir=out,
                          bootstrap=broker.bootstrap, duration=5, max_candidates=3, runs_per_candidate=2,
                          floors=Floors(duration=5, processes=profile_for("torn-transaction").concurrency))
    lines: list[str] = []
    outcome = run_shrink(config, spark=spark, say=lines.append)
    summary = json.loads((out / "shrink.json").read_text())
    # start; without stale-commit (rejected); without latency (kept); then the candidate limit.
    assert [s["outcome"] for s in summary["steps"]] == ["kept", "rejected", "kept", "unfinished"], lines
    assert summary["steps"][1]["change"] == "drop rule stale-commit-into-next-txn"
    assert summary["steps"][1]["counts"].get("torn-transaction", 0) == 0
    assert summary["stopped"] == "candidate limit" and outcome.exit_code == 0
    assert summary["blamed_on_a_rule"] is True
    assert summary["minimal"]["rules"] == ["stale-commit-into-next-txn"]
    assert summary["removed"] == ["drop rule latency"]
    # The minimal rule file is one `kproxy rules validate` accepts, and says what it reproduces.
    minimal = out / "minimal.yaml"
    assert [r.id for r in load_rule_file(minimal).rules] == ["stale-commit-into-next-txn"]
    text = minimal.read_text()
    assert "reproduces torn-transaction" in text and "kproxy demo --scenario torn-transaction" in text
    # The report of the minimal run, and every candidate's history, traces and report.
    report = json.loads((out / "report.json").read_text())
    assert anomaly_appears(report, "torn-transaction", require_rule=True)
    for n in range(3):
        run = out / "candidates" / str(n) / "run-1"
        assert (run / "history.jsonl").stat().st_size > 0 and (run / "report.json").exists()
        assert any((run / "traces").iterdir())
    # Stopped early: the minimal is the candidate the last kept run showed, not replayed.
    assert summary["reproduction"] == {"runs": 1, "hits": 1, "rate": 1.0, "confirmed": None}
    assert any("min left" in line and "best: 1 rule" in line for line in lines)


@pytest.mark.spark
@pytest.mark.timeout(300)
def test_a_rule_file_without_the_anomaly_is_not_shrunk(broker, spark, tmp_path):
    out = tmp_path / "shrink"
    # The shortest workload: any run of rule-free traffic lacks a torn transaction, and what is checked is
    # that the shrink stops after its first run says so.
    config = ShrinkConfig(rules_file=RULES / "healthy.yaml", scenario="healthy", anomaly="torn-transaction",
                          out_dir=out, bootstrap=broker.bootstrap, duration=1)
    with pytest.raises(NotReproduced, match=r"torn-transaction did not appear in 1 run of .*healthy.yaml "
                                            r"\(seed 1\); the run found: .*Nothing to shrink"):
        run_shrink(config, spark=spark, say=quiet)
    assert not (out / "minimal.yaml").exists()
    assert sorted(p.name for p in (out / "candidates").iterdir()) == ["0"]


def kproxy(*args: str, timeout: float = 60) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "kproxy", "shrink", *args], capture_output=True, text=True,
                          timeout=timeout)


def test_a_bad_rule_file_is_refused_with_its_line(tmp_path):
    bad = tmp_path / "bad.yaml"
    bad.write_text("version: 1\nrules:\n  - id: x\n    action: {type: delay, ms: -5}\n")
    done = kproxy("--rules", str(bad), "--anomaly", "torn-transaction", "--out", str(tmp_path / "out"))
    assert done.returncode == 2
    assert f"{bad}:4:" in done.stderr
    assert not (tmp_path / "out").exists()


def test_an_out_holding_an_earlier_shrink_is_refused(tmp_path):
    (tmp_path / "out" / "candidates" / "0").mkdir(parents=True)
    done = kproxy("--rules", str(NOISY), "--anomaly", "torn-transaction", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "holds the candidates of an earlier shrink" in done.stderr, done.stderr
    assert sorted(p.name for p in (tmp_path / "out" / "candidates").iterdir()) == ["0"]


def test_a_broker_kind_and_an_address_are_refused_together(tmp_path):
    done = kproxy("--rules", str(NOISY), "--anomaly", "torn-transaction", "--broker", "tansu",
                  "--bootstrap", "127.0.0.1:9092", "--out", str(tmp_path / "out"))
    assert done.returncode == 2 and "give one of them" in done.stderr


def test_an_address_where_no_broker_answers_fails_before_anything_runs(tmp_path):
    from kproxy.brokers.process import free_port

    port = free_port()
    done = kproxy("--rules", str(NOISY), "--anomaly", "torn-transaction", "--bootstrap", f"127.0.0.1:{port}",
                  "--out", str(tmp_path / "out"))
    assert done.returncode == 3
    assert f"shrink failed: cannot connect to the broker at 127.0.0.1:{port}" in done.stderr
    assert not (tmp_path / "out" / "candidates").exists()


def test_every_run_and_the_replay_get_the_upstream_tls_and_client_settings(tmp_path):
    """What a shrink against a secured cluster hands each run: the proxy's upstream TLS files and the
    clients' settings; the replay command says the same, with a secret read from the environment."""
    import shlex

    from kproxy.proxy_process import UpstreamTlsFiles
    from kproxy.shrink.runner import _Runner, replay_command, start_workload
    from kproxy.shrink.search import Candidate

    tls = UpstreamTlsFiles(ca=tmp_path / "ca.pem", cert=tmp_path / "me.pem", key=tmp_path / "me.key")
    settings = {"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN", "sasl.username": "svc chaos",
                "sasl.password": "s3cret-value"}
    config = ShrinkConfig(rules_file=NOISY, anomaly="torn-transaction", out_dir=tmp_path / "out",
                          bootstrap="kafka.example:9093", upstream_tls=tls, client_config=settings)
    candidate = Candidate(rules={}, workload=start_workload(config))
    arguments = _Runner(config, config.bootstrap, None, quiet, time.monotonic).run_arguments(
        candidate, tmp_path / "rules.yaml")
    assert arguments["upstream_tls"] == tls and arguments["client_config"] == settings
    assert arguments["bootstrap"] == "kafka.example:9093"

    replay = replay_command(config, candidate.workload, NOISY)
    assert "s3cret-value" not in replay
    words = shlex.split(replay)  # as the shell reads it, the password variable left unexpanded by shlex
    assert words[words.index("--upstream-tls"):words.index("--upstream-tls") + 7] == [
        "--upstream-tls", "--upstream-ca", str(tmp_path / "ca.pem"), "--upstream-cert", str(tmp_path / "me.pem"),
        "--upstream-key", str(tmp_path / "me.key")]
    given = [words[i + 1] for i, word in enumerate(words) if word == "--client-config"]
    assert given == ["security.protocol=SASL_PLAINTEXT", "sasl.mechanism=PLAIN", "sasl.username=svc chaos",
                     "sasl.password=$SASL_PASSWORD"]
    # The replay is a command `kproxy demo` accepts as written.
    from kproxy.cli.demo import demo

    with demo.make_context("demo", words[2:]) as ctx:
        assert ctx.params["upstream_tls"] and ctx.params["upstream_ca"] == tmp_path / "ca.pem"
        assert ctx.params["client_config"]["sasl.username"] == "svc chaos"
    with pytest.raises(ValueError, match="needs a bootstrap address"):
        run_shrink(replace(config, bootstrap=None), say=quiet)


# --- the whole shrink (minutes) ----------------------------------------------


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(3600)
def test_the_torn_transaction_shrinks_to_its_endtxn_rule_and_replays(broker, spark, tmp_path):
    out = tmp_path / "shrink"
    config = ShrinkConfig(rules_file=NOISY, anomaly="torn-transaction", out_dir=out, bootstrap=broker.bootstrap,
                          duration=6, budget_s=40 * 60)
    started = time.monotonic()
    run_shrink(config, spark=spark, say=print)
    summary = json.loads((out / "shrink.json").read_text())
    print(f"shrink took {time.monotonic() - started:.0f} s, {summary['candidates']} candidates")
    assert summary["stopped"] is None
    assert summary["reproduction"]["confirmed"] is True, summary["replays"]
    assert summary["minimal"]["rules"] == ["stale-commit-into-next-txn"]
    start, minimal = summary["start"]["workload"], summary["minimal"]["workload"]
    assert sum(minimal[k] < start[k] for k in start) >= 2, (start, minimal)
    # Replaying the minimal rule file with the minimal workload finds the torn transaction again.
    w = minimal
    from kproxy.demo import WorkloadProfile
    from dataclasses import replace

    profile: WorkloadProfile = replace(profile_for("torn-transaction"), concurrency=w["processes"],
                                       max_txn_length=w["max_txn_length"], key_count=w["keys"])
    # At the floors a run holds few transactions: the replay may take more than one run, as the shrink's did.
    replays = []
    for attempt in range(3):
        replay = run_demo("torn-transaction", tmp_path / f"replay-{attempt}", rules_file=out / "minimal.yaml",
                          bootstrap=broker.bootstrap, spark=spark, profile=profile, duration=w["duration"],
                          say=quiet, progress=False)
        replays.append(replay.report["counts"].get("torn-transaction", 0))
        if anomaly_appears(replay.report, "torn-transaction", require_rule=True):
            break
    else:
        pytest.fail(f"no torn transaction in 3 replays of the minimal candidate: {replays}")


@pytest.mark.slow
@pytest.mark.spark
@pytest.mark.timeout(3600)
def test_two_shrinks_of_the_same_input_agree(broker, spark, tmp_path):
    results = []
    for name in ("a", "b"):
        config = ShrinkConfig(rules_file=two_rules(tmp_path), anomaly="torn-transaction", out_dir=tmp_path / name,
                              bootstrap=broker.bootstrap, duration=5, budget_s=30 * 60)
        run_shrink(config, spark=spark, say=quiet)
        results.append(load_rule_file(tmp_path / name / "minimal.yaml"))
    assert results[0] == results[1]


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_ctrl_c_still_writes_the_best_result(broker, tmp_path):
    out = tmp_path / "shrink"
    shrinking = subprocess.Popen(
        [sys.executable, "-m", "kproxy", "shrink", "--rules", str(two_rules(tmp_path)), "--anomaly", "torn-transaction",
         "--bootstrap", broker.bootstrap, "--duration", "5", "--out", str(out)],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    lines = []
    try:
        assert shrinking.stdout is not None
        for line in shrinking.stdout:
            lines.append(line)
            if line.startswith("candidate 2 "):  # the first change has been judged
                break
        # Ctrl-C reaches the terminal's whole process group: the shrink, its proxy and its clients.
        os.killpg(shrinking.pid, signal.SIGINT)
        rest, _ = shrinking.communicate(timeout=300)
    finally:
        if shrinking.poll() is None:
            os.killpg(shrinking.pid, signal.SIGKILL)
    assert shrinking.returncode == 130, "".join(lines) + rest
    summary = json.loads((out / "shrink.json").read_text())
    assert summary["stopped"] == "interrupted"
    assert load_rule_file(out / "minimal.yaml").rules
