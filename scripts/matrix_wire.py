"""What one matrix cell's client spoke and what the broker answered, read from the cell's trace and report.

scripts/kafka-matrix.py keeps these per cell, so a cell says *why* it is
fenced or torn from the wire alone: the versions of the transactional
requests the client sent, and whether its producer epoch moved from one
transaction to the next (transaction version 2: EndTxn v5, and the broker
bumps the epoch at every commit or abort). A client release nobody has
classified classifies itself from its first run.
"""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

from kproxy.obs.trace_files import iter_trace_events
from kproxy.protocol.errors import error_name

# The requests whose versions decide which transaction protocol a client speaks.
PROTOCOL_APIS = ("end_txn", "produce", "add_partitions_to_txn", "txn_offset_commit", "add_offsets_to_txn",
                 "init_producer_id")
COPIED_APIS = ("end_txn", "produce")
# What a broker answers a request whose epoch has moved on.
FENCING_ERRORS = {"PRODUCER_FENCED", "INVALID_PRODUCER_EPOCH"}


def _events(cell_dir: Path) -> list[dict[str, Any]]:
    traces = cell_dir / "traces"
    if not traces.is_dir():
        return []
    wanted = set(PROTOCOL_APIS)
    return [e for e in iter_trace_events(traces, records=False) if e.get("api") in wanted]


def protocol(events: list[dict[str, Any]]) -> dict[str, Any]:
    """The versions the client sent (originals only: a rule's copies repeat them) and its epoch at each end.

    `epoch` counts, per transactional id, each EndTxn followed by another of
    the same transactional id: `moved` when the second carries a higher epoch
    of the same producer id, `same` when it carries the same epoch, and
    `reinitialised` when an InitProducerId of that transactional id came
    between them (an epoch that moved for that reason says nothing about the
    protocol). Commits and aborts are counted apart.
    """
    versions: dict[str, set[int]] = collections.defaultdict(set)
    by_txn_id: dict[str, list[dict[str, Any]]] = collections.defaultdict(list)
    for e in sorted(events, key=lambda e: e.get("mono_ns") or 0):
        if e.get("direction") != "request" or e.get("copy"):
            continue
        if e.get("api_version") is not None:
            versions[e["api"]].add(int(e["api_version"]))
        if e["api"] in ("end_txn", "init_producer_id") and e.get("transactional_id"):
            by_txn_id[e["transactional_id"]].append(e)
    epoch = {end: {"moved": 0, "same": 0, "reinitialised": 0} for end in ("commit", "abort")}
    for requests in by_txn_id.values():
        previous: dict[str, Any] | None = None
        reinitialised = False
        for e in requests:
            if e["api"] == "init_producer_id":
                reinitialised = True
                continue
            if previous is not None:
                end = "commit" if previous.get("end_txn_commit") else "abort"
                if reinitialised or e.get("producer_id") != previous.get("producer_id"):
                    epoch[end]["reinitialised"] += 1
                elif (e.get("producer_epoch") or 0) > (previous.get("producer_epoch") or 0):
                    epoch[end]["moved"] += 1
                else:
                    epoch[end]["same"] += 1
            previous, reinitialised = e, False
    return {"versions": {api: sorted(versions[api]) for api in PROTOCOL_APIS if versions.get(api)}, "epoch": epoch}


def copy_answers(events: list[dict[str, Any]]) -> dict[str, dict[str, int]]:
    """How the broker answered each rule copy (EndTxn, Produce).

    A refused copy never reached the broker (the guard). A Produce copy the
    broker answered with no error and the original's base offset was
    deduplicated by idempotence, not appended again.
    """
    out: dict[str, collections.Counter[str]] = {api: collections.Counter() for api in COPIED_APIS}
    copied = [e for e in events if e.get("api") in out]
    originals = {(e["conn_id"], e["correlation_id"]): e for e in copied
                 if e.get("direction") == "response" and not e.get("copy")}
    answers = {(e["conn_id"], e["correlation_id"], e.get("copy")): e for e in copied
               if e.get("direction") == "response" and e.get("copy")}
    for e in copied:
        if e.get("direction") != "request" or not e.get("copy"):
            continue
        if e.get("outcome") == "refused":
            out[e["api"]]["refused by the guard"] += 1
            continue
        reply = answers.get((e["conn_id"], e["correlation_id"], e.get("copy")))
        if reply is None:
            out[e["api"]][f"no answer ({e.get('outcome')})"] += 1
            continue
        codes = [p.get("error_code") for p in reply.get("partitions") or []] or [reply.get("error_code")]
        errors = sorted({error_name(c) for c in codes if c})
        if errors:
            out[e["api"]][" ".join(errors)] += 1
        elif e["api"] == "produce":
            original = originals.get((e["conn_id"], e["correlation_id"]))
            base = [p.get("base_offset") for p in reply.get("partitions") or []]
            first = [p.get("base_offset") for p in (original or {}).get("partitions") or []]
            out[e["api"]]["accepted as a duplicate (original's offset)" if original and base == first
                          else "accepted and appended"] += 1
        else:
            out[e["api"]]["accepted (NONE)"] += 1
    return {api: dict(counter.most_common()) for api, counter in out.items()}


def findings(report: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Each error-level anomaly class of the report: its cases and what caused them (by, and the cause's name)."""
    out: dict[str, dict[str, Any]] = {}
    for name in report.get("errors", []):
        cases = report.get("anomalies", {}).get(name) or []
        causes: collections.Counter[str] = collections.Counter()
        for case in cases if isinstance(cases, list) else []:
            cause = case.get("cause") if isinstance(case, dict) else None
            if not cause:
                causes["none given"] += 1
                continue
            label = cause.get("by", "?")
            if cause.get("name"):
                label += f": {cause['name']}"
            causes[label] += 1
        out[name] = {"cases": report.get("counts", {}).get(name, len(cases)), "causes": dict(causes.most_common())}
    return out


def read_cell(cell_dir: Path, report: dict[str, Any]) -> dict[str, Any]:
    """Everything a matrix cell keeps of its trace and report."""
    events = _events(cell_dir)
    return {"wire": protocol(events), "copies": copy_answers(events), "findings": findings(report)}


def speaks_tv2(wire: dict[str, Any]) -> bool | None:
    """Whether the client spoke transaction version 2: EndTxn v5+ and an epoch that moved at every commit.

    None when the trace holds no two successive EndTxns of one transactional
    id to compare (a client that ended fewer than two transactions).
    """
    end_txn = wire.get("versions", {}).get("end_txn") or []
    commits = wire.get("epoch", {}).get("commit", {})
    if not end_txn or commits.get("moved", 0) + commits.get("same", 0) == 0:
        return None
    return max(end_txn) >= 5 and commits.get("same", 0) == 0


def why(wire: dict[str, Any]) -> str:
    """The protocol a cell's client spoke, in the words the table uses."""
    versions = wire.get("versions", {})
    end_txn = versions.get("end_txn") or []
    if not end_txn:
        return "no EndTxn sent"
    commits = wire.get("epoch", {}).get("commit", {})
    compared = commits.get("moved", 0) + commits.get("same", 0)
    bump = f"epoch moved at {commits.get('moved', 0)} of {compared} commits" if compared else "no two commits to compare"
    spoken = speaks_tv2(wire)
    kind = {True: "TV2", False: "not TV2", None: "?"}[spoken]
    return f"{kind}: EndTxn v{'/'.join(map(str, end_txn))}, {bump}"
