"""Jepsen EDN histories, converted by the importer and checked by `kproxy_spark.jobs.analyze`,
report the anomaly classes Jepsen's Kafka queue checker reports for them.

tests/data/edn/ holds one small history per anomaly class (and clean ones),
written in the format of Jepsen's kafka workload. The expectations below are
what `jepsen.tests.kafka/checker` reports for each history with ww
dependencies inferred from offsets (kproxy always infers them): the error
types it finds, how many cases, and its verdict. Where kproxy decides
differently on purpose (unseen writes without final reads), the test says so
and docs/analysis.md explains it.

Spark time dominates, so the histories run as two analyses, one of those
Jepsen calls invalid and one of clean and tolerated ones: each file gets its
own keys and processes, every case is attributed back to its file by its key,
and a file's verdict is the one the report's classification of anomaly names
gives it. Each group keeps the report-wide facts (subscribe, final reads)
that decide those classifications for its files alone, and the tolerated
group's report must be valid as a whole.
"""

from __future__ import annotations

import json
from collections import defaultdict
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from click.testing import CliRunner

from kproxy.cli import main
from kproxy.workload.edn_import import import_edn
from kproxy.workload.history import HistoryWriter, Op, read_history, validate_history
from kproxy.workload.names import load_names

pytestmark = pytest.mark.spark

EDN = Path(__file__).parent / "data" / "edn"

#: Names kproxy reports that Jepsen's checker has no counterpart for.
KPROXY_ONLY = frozenset({"abort-position"})

#: Keys and processes of the i-th history in a group are shifted by i * STRIDE.
STRIDE = 100


@dataclass(frozen=True)
class Expected:
    """What Jepsen's checker reports for one history."""

    anomalies: dict[str, int]  # anomaly name -> number of cases
    valid: bool
    # kproxy's own classifications (not Jepsen's): abort-position values, in op order.
    abort_positions: tuple[str, ...] = ()
    marks: tuple = field(default=())


@dataclass(frozen=True)
class Group:
    """Histories analysed as one, and the report-wide facts that keep each
    file's verdict what it is alone."""

    histories: dict[str, Expected]
    valid: bool
    subscribe: bool
    final_reads: bool = True


GROUPS: dict[str, Group] = {
    # Histories Jepsen calls invalid. unseen stays last: its final reads
    # follow every write, so unseen writes count, as Jepsen always counts them.
    "invalid": Group({
        "duplicate": Expected({"duplicate": 1}, False),
        # A failed poll's data counts for the version order (Jepsen's duplicate
        # test with aborted transactions); nothing acknowledged read the value.
        "duplicate_aborted_poll": Expected({"duplicate": 1, "unseen": 1}, False),
        "inconsistent_offsets": Expected({"inconsistent-offsets": 1}, False),
        "G1a": Expected({"G1a": 1}, False),
        "lost_write": Expected({"lost-write": 1}, False),
        "lost_write_inconsistent": Expected({"inconsistent-offsets": 1, "lost-write": 1, "unseen": 1}, False),
        "poll_skip": Expected({"poll-skip": 1}, False),
        "nonmonotonic_poll": Expected({"nonmonotonic-poll": 1}, False),
        "nonmonotonic_send": Expected({"nonmonotonic-send": 1}, False),
        "int_poll_skip": Expected({"int-poll-skip": 2}, False),
        "int_nonmonotonic_poll": Expected({"int-nonmonotonic-poll": 2}, False),
        "int_nonmonotonic_send": Expected({"int-nonmonotonic-send": 1}, False),
        "precommitted_read": Expected({"precommitted-read": 1}, False),
        "txn_abort_no_rewind": Expected(
            {"poll-skip": 2, "lost-write": 4, "unseen": 4}, False, abort_positions=("advance", "advance")),
        "txn_abort_info_skip": Expected({"poll-skip": 1, "unseen": 4}, False, abort_positions=("advance",)),
        "unseen": Expected({"unseen": 1}, False),
    }, valid=False, subscribe=False),
    # Clean histories and anomalies Jepsen tolerates for Kafka: the report as
    # a whole must be valid. valid stays last for its final reads; one
    # history subscribes, so poll-skip is tolerated as Jepsen does with
    # subscribe.
    "tolerated": Group({
        "inconsistent_offsets_unproven": Expected({}, True),
        "lost_write_unproven": Expected({}, True),
        "poll_skip_reassigned": Expected({}, True),
        "poll_skip_subscribe": Expected({"poll-skip": 1}, True),
        # Kafka interleaves producers: both are tolerated.
        "int_send_skip": Expected({"int-send-skip": 1, "G0": 1}, True),
        "G0": Expected({"G0": 1}, True),
        # With ww dependencies inferred from offsets Jepsen tolerates G1c.
        "G1c_wr": Expected({"G1c": 1}, True),
        "G1c_ww_wr": Expected({"G1c": 1}, True),
        "txn_abort_rewind": Expected({}, True, abort_positions=("rewind",)),
        "valid": Expected({}, True),
    }, valid=True, subscribe=True),
}


def test_every_edn_history_has_an_expectation():
    on_disk = {p.stem for p in EDN.glob("*.edn")}
    grouped = [name for group in GROUPS.values() for name in group.histories]
    assert len(grouped) == len(set(grouped))
    assert on_disk == set(grouped) | {"unseen_no_final_reads"}


def _shift_keys(op: Op, offset: int) -> object:
    """The op's value with every key moved by offset (send/poll micro-ops, assign/subscribe lists)."""
    if op.f in ("assign", "subscribe"):
        return [k + offset for k in op.value]
    if op.f not in ("send", "poll", "txn"):
        return op.value
    shifted = []
    for mop in op.value:
        if mop[0] == "send":
            shifted.append(["send", mop[1] + offset, mop[2]])
        elif len(mop) == 2:
            shifted.append(["poll", {str(int(k) + offset): pairs for k, pairs in mop[1].items()}])
        else:
            shifted.append(mop)
    return shifted


def combine(histories: list[Path], out: Path) -> Path:
    """One history that runs the given histories one after the other, the
    i-th with keys and processes shifted by i * STRIDE and times after the
    previous one's."""
    start = 0
    with HistoryWriter(out) as writer:
        for i, path in enumerate(histories):
            last = start
            for op in read_history(path):
                last = start + op.time
                writer.write_op(Op(0, last, op.process + i * STRIDE, op.type, op.f,
                                   _shift_keys(op, i * STRIDE), op.error))
            start = last + 1
    validate_history(out)
    return out


def _case_key(name: str, case: dict) -> int:
    # Cycles carry their keys in the steps; every other case names its key.
    return case["steps"][0]["key"] if name in ("G0", "G1c") else case["key"]


def _jepsen_view(cases: dict[str, list[dict]]) -> dict[str, int]:
    """Case counts of the anomalies Jepsen's checker also knows."""
    return {name: len(found) for name, found in cases.items() if name not in KPROXY_ONLY}


def _import(name: str, directory: Path) -> Path:
    out = directory / f"{name}.jsonl"
    import_edn(EDN / f"{name}.edn", out)
    return out


@pytest.fixture(scope="module")
def analysed(spark, tmp_path_factory):
    """group name -> (report, {file: {anomaly: [cases]}}); each group analysed once."""
    from kproxy_spark.jobs import analyze

    results: dict[str, tuple[dict, dict]] = {}

    def run(group_name: str) -> tuple[dict, dict]:
        if group_name not in results:
            work = tmp_path_factory.mktemp(f"edn-{group_name}")
            names = list(GROUPS[group_name].histories)
            history = combine([_import(n, work) for n in names], work / "group.jsonl")
            report = analyze(history, None, work / "report", spark=spark)
            by_file: dict[str, dict[str, list[dict]]] = defaultdict(lambda: defaultdict(list))
            for anomaly, cases in report["anomalies"].items():
                assert len(cases) == report["counts"][anomaly], f"{anomaly}: more cases than the report lists"
                for case in cases:
                    by_file[names[_case_key(anomaly, case) // STRIDE]][anomaly].append(case)
            results[group_name] = report, by_file
        return results[group_name]

    return run


@pytest.mark.parametrize("group_name", list(GROUPS))
def test_a_group_keeps_each_history_s_global_conditions(analysed, group_name):
    report, _ = analysed(group_name)
    group = GROUPS[group_name]
    assert report["stats"]["subscribe"] is group.subscribe
    assert report["stats"]["final_reads"] is group.final_reads
    assert report["valid"] is group.valid


@pytest.mark.parametrize("group_name, name", [
    pytest.param(group_name, name, marks=list(expected.marks), id=name)
    for group_name, group in GROUPS.items() for name, expected in group.histories.items()])
def test_history_reports_what_jepsen_reports(analysed, group_name, name):
    report, by_file = analysed(group_name)
    expected = GROUPS[group_name].histories[name]
    cases = by_file.get(name, {})
    assert _jepsen_view(cases) == expected.anomalies
    # Whether a name counts as an error is decided per name (report["errors"]).
    file_errors = sorted(set(cases) & set(report["errors"]))
    assert (not file_errors) is expected.valid, file_errors
    positions = [c["position"] for c in sorted(cases.get("abort-position", []), key=lambda c: c["abort_index"])]
    assert tuple(positions) == expected.abort_positions


def test_import_then_analyze_through_the_cli(spark, tmp_path):
    """Unseen writes without final reads: Jepsen calls the history invalid;
    kproxy cannot tell a lost write from a consumer that is behind, so the
    verdict is unknown (exit code 4)."""
    history = tmp_path / "history.jsonl"
    result = CliRunner().invoke(main, ["history", "import", str(EDN / "unseen_no_final_reads.edn"),
                                       "-o", str(history)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["analyze", "--history", str(history), "--out", str(out),
                                       "--master", "local[2]"])
    assert result.exit_code == 4, result.output
    assert "kproxy analyze: UNKNOWN" in result.stdout
    report = json.loads((out / "report.json").read_text())
    assert report["valid"] == "unknown"
    assert report["anomaly_types"] == ["unseen"] and report["errors"] == []
    [case] = report["anomalies"]["unseen"]
    assert (case["key"], case["value"], case["offset"]) == (0, 0, 0)
    assert report["stats"]["final_reads"] is False


def test_keyword_and_string_keys_and_values_analyse_and_keep_their_names(spark, tmp_path):
    """A history whose keys and values are Jepsen keywords and strings is
    numbered on import; the analysis finds its G1a on the numbers, and the
    report carries the originals, so a case can be read back as `:x`/`:a`."""
    history = tmp_path / "named.jsonl"
    result = CliRunner().invoke(main, ["history", "import", str(EDN.parent / "queue_named.edn"), "-o", str(history)])
    assert result.exit_code == 0, result.output
    out = tmp_path / "report"
    result = CliRunner().invoke(main, ["analyze", "--history", str(history), "--out", str(out),
                                       "--master", "local[2]"])
    assert result.exit_code == 1, result.output
    report = json.loads((out / "report.json").read_text())
    assert report["errors"] == ["G1a"] and report["stats"]["final_reads"] is True
    [case] = report["anomalies"]["G1a"]
    assert (case["key"], case["value"], case["offset"]) == (4, 0, 0)
    names = report["stats"]["names"]
    assert (names["keys"][str(case["key"])], names["values"][str(case["key"])][str(case["value"])]) == (":x", ":a")
    assert names == load_names(history)
