"""franz-go's own exactly-once test, TestTxnEtl, judged by `kproxy test` on Apache Kafka 4.4.0.

An application nobody on the project wrote (docs/testing.md, "Applications no
one on the project wrote"): a transactional producer feeds three levels of
consume-transform-produce consumer groups, in six subtests (classic and
KIP-848 groups, static members), each level committing its input offsets in
its transactions. The binary is franz-go's `go test -c` of pkg/kgo, from the
cache `make test` fills (tests/fixtures/franz_go.py).

The default suite has two short runs (500 records, the `range` subtests:
one classic and one KIP-848 group) in tests/test_kafka_live.py, on the
session's Kafka, in the test's process, so the analysis uses the worker's
warm Spark: rule-free, and under the torn-transaction rule, which
transaction version 2 fences; they use `quick_txn_etl` below. The full runs
(2000 records, all six subtests, and transaction version 0, on a broker of
their own) are slow-marked: two to six minutes each, most of it the analysis.

TestTxnEtl deletes its topics when a subtest passes, so the third level's
output, which nothing in the test reads, is gone before the final read. The
trace names the deleted topics, and the verdict sets those unread writes
aside (`stats.derived_history.deleted_unread`) instead of calling the run
unknown: a passing run is valid.

Without transaction version 2, a stale commit that the broker accepts in the
middle of a consumer's next transaction commits that transaction's output
while its input offsets are not committed (the offset commit comes after,
and fails; franz-go's abort is then refused with INVALID_TXN_STATE): the
input is processed again and its output committed twice. The exactly-once
check reports that (`output-without-offsets`), blamed on the rule.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from kproxy.obs.trace_files import iter_trace_events
from kproxy.testing.runner import EXIT_INVALID, EXIT_VALID, RunSettings, run_test
from kproxy.testing.verdict import Verdict

ROOT = Path(__file__).resolve().parent.parent
RULES = ROOT / "rules" / "torn-transaction.yaml"
RULE = "stale-commit-into-next-txn"
RECORDS = 2000
#: What a stale commit landing in the next transaction does to the data, when the broker accepts it.
TEAR = ("torn-transaction", "client-outcome-mismatch", "G1a", "exactly-once")
INVALID_TXN_STATE, CONCURRENT_TRANSACTIONS, PRODUCER_FENCED = 48, 51, 90

#: The default suite's runs: the `range` subtests (range, range/848), 500 records.
QUICK_RUN, QUICK_RECORDS = "^TestTxnEtl$/^range$", 500

pytestmark = [pytest.mark.spark, pytest.mark.timeout(1200)]


@dataclass
class Run:
    returncode: int
    run: dict
    verdict: Verdict
    deleted_topics: set[str]
    requests: dict[str, Counter]  # api -> versions the clients sent, as traced
    stale_copies: Counter  # (the proxy's outcome, the broker's error code or None) per copy of an EndTxn
    #: (transactional id, client-side txn) whose records a stale copy committed and the client did not
    split: set[tuple[str, int]]
    output: str
    #: Transactional ids that sent records in a second transaction: the torn-transaction rule's held copy of
    #: a first commit is released by them, and by nothing else.
    second_txns: set[str] = field(default_factory=set)

    @property
    def command_returncode(self) -> int | None:
        return self.run["command"].get("returncode")


def txn_etl(binary: Path, out: Path, *options: str, records: int = RECORDS) -> Run:
    argv = [sys.executable, "-m", "kproxy", "test", "--broker", "kafka", *options, "--out", str(out), "--",
            "env", "KGO_SEEDS={bootstrap}", "KGO_TEST_RF=1", f"KGO_TEST_RECORDS={records}",
            str(binary), "-test.run", "^TestTxnEtl$", "-test.v", "-test.timeout", "8m"]
    done = subprocess.run(argv, capture_output=True, text=True, check=False, timeout=1100, cwd=ROOT)
    return read_run(out, done.returncode, done.stdout + done.stderr)


def quick_txn_etl(binary: Path, bootstrap: str, out: Path, rules: Path | None = None) -> Run:
    """A short TestTxnEtl through `kproxy test` against `bootstrap`, run in this process (its analysis
    takes the worker's Spark session)."""
    command = ("env", "KGO_SEEDS={bootstrap}", "KGO_TEST_RF=1", f"KGO_TEST_RECORDS={QUICK_RECORDS}", str(binary),
               "-test.run", QUICK_RUN, "-test.v", "-test.timeout", "4m")
    said: list[str] = []
    result = run_test(RunSettings(command=command, out=out, bootstrap=bootstrap, rules=rules),
                      say=said.append, echo=said.append)
    return read_run(out, result.exit_code, "\n".join(said))


def read_run(out: Path, returncode: int, output: str) -> Run:
    """A finished run: its run.json, verdict, the topics franz-go deleted, and what the trace shows."""
    run = json.loads((out / "run.json").read_text())
    assert run["report"], f"no verdict (exit {returncode}):\n{output[-6000:]}"
    log = (out / "command.log").read_text(errors="replace")
    requests: dict[str, Counter] = {}
    asked: dict[tuple, dict] = {}
    stale: Counter = Counter()
    # When each reached the broker (its response's time less the broker's latency): a commit takes only the
    # records delivered before it. A stale copy that reached the broker before any record of the next
    # transaction is answered (TV2) as a retry of the commit already made, and took nothing.
    stale_commits: dict[tuple[str, int], int] = {}  # client txns a stale copy committed: its last delivery
    wrote: dict[tuple[str, int], int] = {}  # client txns with a Produce the broker took: its first delivery
    second_txns: set[str] = set()
    client_end: dict[tuple[str, int], tuple[bool, int]] = {}  # the client's own last EndTxn and its answer
    for event in iter_trace_events(out / "traces", records=False):
        api, direction = event.get("api"), event.get("direction")
        if direction not in ("request", "response"):
            continue
        key = (event["proxy_id"], event["conn_id"], event["correlation_id"], event.get("copy"))
        if direction == "request":
            asked[key] = event
            if not event.get("copy"):
                requests.setdefault(api, Counter())[event.get("api_version")] += 1
                if api == "produce" and (event.get("txn_client") or 0) >= 2:
                    second_txns.add(event["transactional_id"])
            if api == "end_txn" and event.get("copy") and event.get("outcome") == "refused":
                stale[("refused", None)] += 1
            continue
        request = asked.pop(key, None)
        if request is None or not request.get("transactional_id"):
            continue
        txn = (request["transactional_id"], request.get("txn_broker" if request.get("copy") else "txn_client"))
        error = event.get("error_code")
        delivered = event["mono_ns"] - int((event.get("upstream_latency_ms") or 0) * 1e6)
        if api == "end_txn" and request.get("copy"):
            stale[(request.get("outcome"), error)] += 1
            if error == 0 and request.get("end_txn_commit"):
                stale_commits[txn] = max(delivered, stale_commits.get(txn, delivered))
        elif api == "end_txn":
            client_end[txn] = (bool(request.get("end_txn_commit")), error)
        elif api == "produce" and error == 0:
            wrote[txn] = min(delivered, wrote.get(txn, delivered))
    split = {txn for txn, committed in stale_commits.items()
             if txn in wrote and wrote[txn] < committed and client_end.get(txn) != (True, 0)}
    return Run(returncode, run, Verdict.load(out / "report" / "report.json"),
               set(re.findall(r"deleting topic ([0-9a-f]{64})", log)), requests, stale, split, output, second_txns)


def assert_valid_with_deleted_output_set_aside(run: Run) -> None:
    """Valid (exit 0), with the unread output of the subtests that passed, all in topics franz-go deleted,
    set aside rather than judged."""
    verdict = run.verdict
    assert verdict.errors == {} and verdict.valid, verdict.summary()
    assert run.returncode == EXIT_VALID, run.output[-3000:]
    assert verdict.anomalies.get("unseen", 0) == 0
    derived = verdict.report["stats"]["derived_history"]
    assert set(derived["deleted_topics"]) == run.deleted_topics
    set_aside = derived.get("deleted_unread")
    assert set_aside and set_aside["writes"] > 0 and set(set_aside["topics"]) <= run.deleted_topics, set_aside


def assert_fenced(run: Run) -> None:
    """Under transaction version 2 every stale copy of an EndTxn reached the broker, which fenced it (the
    epoch moved on with the commit) or had it retried (CONCURRENT_TRANSACTIONS). Now and then a copy
    arrives while the next transaction has no record on the broker yet, and the broker answers it as a
    retry of the commit it already made: no error, and nothing committed by it. No copy committed
    records the client had not committed, and the verdict blames the stale EndTxns, and nothing else, on
    the rule."""
    assert set(run.requests["end_txn"]) == {5}
    assert run.stale_copies and {outcome for outcome, _ in run.stale_copies} == {"ghost"}, run.stale_copies
    # At least one copy was fenced by its epoch; with a handful of copies, those that met the next commit in
    # progress (CONCURRENT_TRANSACTIONS) may outnumber it (2 to 1 in a CI run).
    assert run.stale_copies[("ghost", PRODUCER_FENCED)] > 0, run.stale_copies
    assert {error for _, error in run.stale_copies} <= {PRODUCER_FENCED, CONCURRENT_TRANSACTIONS, 0}
    assert run.split == set()
    stale_cases = run.verdict.anomalies.get("stale-end-txn", 0)
    assert stale_cases > 0 and run.verdict.causes["stale-end-txn"] == {f"rule:{RULE}": stale_cases}
    assert not set(TEAR) & set(run.verdict.anomalies)
    assert run.verdict.by_rule == {RULE: {"stale-end-txn": stale_cases}}


@pytest.mark.slow
def test_rule_free_transaction_version_2(kgo_test_binary: Path, tmp_path: Path):
    run = txn_etl(kgo_test_binary, tmp_path / "out")
    assert run.command_returncode == 0, run.output[-3000:]
    assert run.verdict.by_rule == {}
    # KIP-890 part 2 on the wire: EndTxn v5 (the epoch bump), Produce v13, TxnOffsetCommit v6, and no
    # AddPartitionsToTxn or AddOffsetsToTxn (the partitions join the transaction with the first write).
    assert set(run.requests["end_txn"]) == {5}
    assert set(run.requests["produce"]) == {13}
    assert set(run.requests["txn_offset_commit"]) == {6}
    assert "add_partitions_to_txn" not in run.requests and "add_offsets_to_txn" not in run.requests
    assert_valid_with_deleted_output_set_aside(run)


@pytest.mark.slow
def test_stale_commit_is_fenced_by_transaction_version_2(kgo_test_binary: Path, tmp_path: Path):
    run = txn_etl(kgo_test_binary, tmp_path / "out", "--rules", str(RULES))
    assert run.command_returncode == 0, run.output[-3000:]
    assert_fenced(run)
    assert_valid_with_deleted_output_set_aside(run)


@pytest.mark.slow
def test_stale_commit_tears_transactions_without_transaction_version_2(kgo_test_binary: Path, tmp_path: Path):
    run = txn_etl(kgo_test_binary, tmp_path / "out", "--transaction-version", "0", "--rules", str(RULES))
    verdict = run.verdict
    # franz-go falls back to the protocol before KIP-890 part 2: EndTxn v4, no epoch bump.
    assert max(run.requests["end_txn"]) <= 4 and max(run.requests["produce"]) <= 11
    assert "add_partitions_to_txn" in run.requests
    assert run.stale_copies[("ghost", 0)] > 0, run.stale_copies  # the broker accepted stale commits
    assert run.split, "no stale commit took records the client did not commit: nothing for the verdict to find"
    assert verdict.causes["stale-end-txn"] == {f"rule:{RULE}": verdict.anomalies["stale-end-txn"]}
    # Every error is the rule's or a client's doing, never the broker's or unexplained. The unread output
    # of subtests that passed and deleted their topics is set aside, not judged.
    for name in verdict.errors:
        assert all(c.startswith(("rule:", "client:")) for c in verdict.causes.get(name, {})), (name, verdict.causes)
    assert verdict.anomalies.get("unseen", 0) == 0
    assert run.returncode == EXIT_INVALID and verdict.report["valid"] is False, run.output[-3000:]
    torn = {name: verdict.causes.get(name, {}) for name in TEAR if verdict.errors.get(name)}
    for name, causes in torn.items():
        assert causes == {f"rule:{RULE}": verdict.errors[name]}, (name, causes)
    assert torn, f"{len(run.split)} transactions a stale commit took and no {', '.join(TEAR)} case"
    assert set(torn) <= set(verdict.by_rule[RULE])


@pytest.mark.slow
def test_guard_refuses_every_stale_commit(kgo_test_binary: Path, tmp_path: Path):
    run = txn_etl(kgo_test_binary, tmp_path / "out", "--transaction-version", "0", "--rules", str(RULES), "--guard")
    assert run.command_returncode == 0, run.output[-3000:]
    assert run.stale_copies and set(run.stale_copies) == {("refused", None)}, run.stale_copies
    assert run.split == set()
    assert run.verdict.by_rule == {RULE: {}}  # it acted, and caused nothing
    assert_valid_with_deleted_output_set_aside(run)
