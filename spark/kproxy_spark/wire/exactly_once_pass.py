"""The exactly-once check's two grouped passes, in plain pyarrow, numpy and
Python (kproxy_spark.wire.exactly_once builds their inputs; no Spark here,
so each pass is tested on literal tables).

* ``by_producer``, per transactional id (every producer session of it):
  each TxnOffsetCommit gets the EndTxn that decided it, and each client
  transaction whose output and input offsets did not commit together is a
  case.
* ``by_partition``, per input partition (topic, partition): each consumer
  group's chain of committed offsets, and the overlaps and gaps in it.

Together they replace about ninety DataFrame operations (joins, windows and
groupings, each analysed and compiled anew by the driver in every analysis:
docs/performance-analysis.md) with two groupings.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from kproxy_spark.wire.arrow_groups import TXN_KEY, joint, numbers, session_ids

#: The rows by_producer reads, by their `kind`: a TxnOffsetCommit's
#: partition, an EndTxn, a client transaction's output in the log.
COMMIT, END, OUTPUT = 0, 1, 2
#: The rows by_partition reads, by their `kind`: an offset commit with its
#: decision (by_producer's DECIDED rows), a committed input record of the
#: log, a record a Fetch delivered.
LINK, LOGGED, READ = 0, 1, 2

#: At most this many offsets of one gap are listed in its case.
LISTED = 16

#: A case of the check (kproxy_spark.wire.exactly_once), and its types.
CASE_FIELDS = (
    ("group_id", pa.string()), ("topic", pa.string()), ("partition", pa.int32()), ("kind", pa.string()),
    ("mono_ns", pa.int64()), ("conn_id", pa.int64()), ("correlation_id", pa.int32()), ("txn_id", pa.string()),
    ("txn_client", pa.int64()), ("from_offset", pa.int64()), ("to_offset", pa.int64()),
    ("offsets", pa.list_(pa.int64())), ("missing", pa.int64()), ("rules", pa.list_(pa.string())),
    ("causes", pa.list_(pa.string())),
)
#: What by_producer adds to a DECIDED row: the EndTxn that decided the commit.
DECISION_FIELDS = (("decided_ns", pa.int64()), ("decided_commit", pa.bool_()), ("decided_rule", pa.string()))
PRODUCER_SCHEMA = pa.schema(CASE_FIELDS + DECISION_FIELDS)
CASE_SCHEMA = pa.schema(CASE_FIELDS)

#: by_producer's `kind` for an offset commit a decision reached (its
#: committed offset in `to_offset`): by_partition's LINK rows, not a case.
DECIDED = "decided"

#: The client transaction: its producer session and the client's number.
TXN = (*TXN_KEY, "txn_client")


def _rows(table: pa.Table, kind: int) -> pa.Table:
    return table.filter(pc.equal(table.column("kind"), kind))


def _deciding_ends(commits: pa.Table, ends: pa.Table) -> np.ndarray:
    """Per commit, the index into `ends` of the EndTxn that decided it, -1 where none: the first of its
    producer session the broker took (`taken`) at or after the commit reached it (`at_ns`), whatever
    transaction the client meant it for; at one instant the first by mono_ns, then copy."""
    chosen = np.full(commits.num_rows, -1, dtype=np.int64)
    if not commits.num_rows or not ends.num_rows:
        return chosen
    mine, theirs = session_ids(commits, ends)
    taken = numbers(pc.fill_null(ends.column("taken"), False)) & numbers(pc.is_valid(ends.column("at_ns")))
    candidates = np.flatnonzero(taken)
    arrived = numbers(pc.is_valid(commits.column("at_ns")))
    if not len(candidates) or not arrived.any():
        return chosen
    end_at = numbers(pc.fill_null(ends.column("at_ns"), 0)).astype(np.int64)
    order = candidates[np.lexsort(tuple(
        numbers(pc.fill_null(ends.column(c), 0)).astype(np.int64)[candidates] for c in ("copy", "mono_ns"))
        + (end_at[candidates], theirs[candidates]))]
    commit_at = numbers(pc.fill_null(commits.column("at_ns"), 0)).astype(np.int64)
    offered, wanted = joint((theirs[order], end_at[order]), (mine, commit_at))
    at = np.minimum(np.searchsorted(offered, wanted, side="left"), len(order) - 1)
    found = arrived & (offered[at] >= wanted) & ((offered[at] >> 32) == mine)
    chosen[found] = order[at[found]]
    return chosen


def _sorted_rules(*rules: Any) -> list[str]:
    return sorted({rule for rule in rules if rule is not None})


#: The fields of a case that name the request and the transaction behind it,
#: and with them where the case is.
SENT_BY = ("mono_ns", "conn_id", "correlation_id", "txn_id", "txn_client")
CASE_IDS = ("group_id", "topic", "partition", *SENT_BY)


def _ids(row: dict[str, Any], fields: tuple[str, ...] = CASE_IDS) -> dict[str, Any]:
    return {k: row[k] for k in fields}


def _case(**fields: Any) -> dict[str, Any]:
    return {"from_offset": None, "offsets": [], "missing": 0, "rules": [], "causes": [], **fields}


def by_producer(rows: pa.Table) -> pa.Table:
    """For any number of whole transactional ids: every offset commit a
    decision reached and that the broker accepted (kind DECIDED, its offset
    in `to_offset`, with DECISION_FIELDS), and the cases of client
    transactions whose output and input offsets did not commit together
    (PRODUCER_SCHEMA).

    `rows`, by `kind`: COMMIT (TXN, group_id, topic, partition,
    committed_offset, mono_ns, conn_id, correlation_id, `at_ns` when it
    reached the broker, `ok` when accepted); END (TXN, mono_ns, conn_id,
    correlation_id, copy, `at_ns` when it reached the broker, `taken` when
    the broker took it, `commit`, `rule` when a rule's stale copy); OUTPUT
    (TXN, committed_records, aborted_records, output_rules, and mono_ns,
    conn_id, correlation_id of its first record)."""
    if rows.num_rows == 0:
        return PRODUCER_SCHEMA.empty_table()
    commits, ends = _rows(rows, COMMIT), _rows(rows, END)
    decider = _deciding_ends(commits, ends)
    end_rows = ends.to_pylist()
    committed: list[dict[str, Any]] = commits.to_pylist()
    for commit, index in zip(committed, decider.tolist()):
        end = end_rows[index] if index >= 0 else {}
        commit.update(decided_ns=end.get("at_ns"), decided_commit=end.get("commit"), decided_rule=end.get("rule"))
    committed.sort(key=lambda c: (c["mono_ns"], c["conn_id"], c["correlation_id"]))
    out = [_case(**_ids(c, CASE_IDS + tuple(name for name, _ in DECISION_FIELDS)), kind=DECIDED,
                 to_offset=c["committed_offset"])
           for c in committed if c["ok"] and c["decided_commit"] is not None]
    outputs = {tuple(o[k] for k in TXN): o for o in _rows(rows, OUTPUT).to_pylist()}
    out += _apart(committed, outputs)
    out += _bare(committed, outputs, end_rows)
    return pa.Table.from_pylist(out, PRODUCER_SCHEMA)


def _apart(committed: list[dict[str, Any]], outputs: dict[tuple, dict[str, Any]]) -> list[dict[str, Any]]:
    """Per client transaction and input partition: its output committed without its offsets (that input
    is processed again: duplicates), or its offsets committed without any of its output (loss)."""
    offsets: dict[tuple, dict[str, Any]] = {}
    for c in committed:  # in the order the commits were sent
        key = (*(c[k] for k in TXN), c["group_id"], c["topic"], c["partition"])
        first = offsets.setdefault(key, {**c, "offsets_committed": False, "offsets_rule": None})
        first["committed_offset"] = max(first["committed_offset"], c["committed_offset"])
        first["offsets_committed"] |= bool(c["ok"] and c["decided_commit"])
        first["offsets_rule"] = first["offsets_rule"] or c["decided_rule"]
    cases = []
    for key, o in offsets.items():
        output = outputs.get(key[:len(TXN)])
        if output is None:
            continue
        duplicated = output["committed_records"] > 0 and not o["offsets_committed"]
        lost = o["offsets_committed"] and output["committed_records"] == 0 and output["aborted_records"] > 0
        if duplicated or lost:
            cases.append(_case(
                **_ids(o),
                kind="output-without-offsets" if duplicated else "offsets-without-output",
                to_offset=o["committed_offset"],
                missing=output["committed_records"] if duplicated else output["aborted_records"],
                rules=_sorted_rules(*output["output_rules"] or (), o["offsets_rule"])))
    return cases


def _bare(committed: list[dict[str, Any]], outputs: dict[tuple, dict[str, Any]],
          ends: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """A consume-transform-produce producer (one that commits offsets in its transactions) whose client
    aborted a transaction before sending its offsets, and whose output committed anyway (a stale EndTxn
    had committed it; the abort may even be refused): the client processes that input again. The case
    names the group of the producer's first offset commit."""
    group: dict[str, str] = {}
    for c in committed:
        group.setdefault(c["txn_id"], c["group_id"])
    with_offsets = {tuple(c[k] for k in TXN) for c in committed}
    last_told: dict[tuple, dict[str, Any]] = {}  # the client's last EndTxn of each transaction
    for end in sorted((e for e in ends if e["copy"] == 0 and e["txn_client"] is not None),
                      key=lambda e: (e["mono_ns"], e["conn_id"], e["correlation_id"])):
        last_told[tuple(end[k] for k in TXN)] = end
    cases = []
    for txn, output in outputs.items():
        told = last_told.get(txn)
        if (output["txn_id"] in group and txn not in with_offsets and told is not None
                and told["commit"] is False and output["committed_records"] > 0):
            cases.append(_case(
                group_id=group[output["txn_id"]], topic=None, partition=None, kind="output-without-offsets",
                **_ids(output, SENT_BY),
                to_offset=None, missing=output["committed_records"],
                rules=_sorted_rules(*output["output_rules"] or ())))
    return cases


def by_partition(rows: pa.Table, members: frozenset[str]) -> pa.Table:
    """For any number of whole input partitions, each consumer group's
    overlaps and gaps (CASE_SCHEMA).

    `rows`, by `kind`: LINK (by_producer's DECIDED rows: group_id, topic,
    partition, `offset` committed, `at_ns` decided, decided_commit,
    decided_rule, mono_ns, conn_id, correlation_id, txn_id, txn_client);
    LOGGED (topic, partition, offset: a committed data record of the log);
    READ (topic, partition, offset, `at_ns` delivered, `listed` when served
    listed as aborted to a read_committed consumer). `members`: the groups
    whose consumers joined them."""
    if rows.num_rows == 0:
        return CASE_SCHEMA.empty_table()
    names = pc.binary_join_element_wise(rows.column("topic"), pc.cast(rows.column("partition"), pa.string()), "\x00")
    part = numbers(pc.dictionary_encode(names.combine_chunks()).indices).astype(np.int64)
    kind = numbers(rows.column("kind")).astype(np.int64)
    offset = numbers(pc.fill_null(rows.column("offset"), 0)).astype(np.int64)
    at = numbers(pc.fill_null(rows.column("at_ns"), 0)).astype(np.int64)
    listed = numbers(pc.fill_null(rows.column("listed"), False)).astype(bool)
    order = np.lexsort((at, offset, part))
    bounds = np.searchsorted(part[order], np.arange(part.max() + 2))
    links: dict[int, list[dict[str, Any]]] = defaultdict(list)
    link_rows = np.flatnonzero(kind == LINK)
    for index, link in zip(link_rows.tolist(), rows.take(pa.array(link_rows)).to_pylist()):
        links[int(part[index])].append(link)
    cases: list[dict[str, Any]] = []
    for number, its_links in links.items():
        mine = order[bounds[number]:bounds[number + 1]]  # the partition's rows, by offset, then time
        logged = np.unique(offset[mine[kind[mine] == LOGGED]])
        reads = mine[(kind[mine] == READ) & ~listed[mine]]
        delivered = Reads(offset[reads], at[reads], np.unique(offset[mine[(kind[mine] == READ) & listed[mine]]]))
        by_group: dict[str, list[dict[str, Any]]] = defaultdict(list)
        for link in its_links:
            by_group[link["group_id"]].append(link)
        for group, commits in by_group.items():
            cases += _chain_breaks(group in members, commits, logged, delivered)
    return pa.Table.from_pylist(cases, CASE_SCHEMA)


class Reads:
    """What Fetches delivered of one partition: `offsets` ascending with the time of each delivery
    (`ns`, ascending within an offset), and the first delivery of each offset; `listed`: the offsets
    served listed as aborted to a read_committed consumer (ascending)."""

    def __init__(self, offsets: np.ndarray, ns: np.ndarray, listed: np.ndarray) -> None:
        self.offsets, self.ns, self.listed = offsets, ns, listed
        self.first_offsets, first = np.unique(offsets, return_index=True)
        self.first_ns = ns[first]

    def before(self, offsets: np.ndarray, until: int) -> np.ndarray:
        """Per offset (ascending), whether it was delivered at or before `until`."""
        at = np.minimum(np.searchsorted(self.first_offsets, offsets), max(len(self.first_offsets) - 1, 0))
        if not len(self.first_offsets):
            return np.zeros(len(offsets), bool)
        return (self.first_offsets[at] == offsets) & (self.first_ns[at] <= until)

    def between(self, offsets: np.ndarray, after: int, until: int) -> np.ndarray:
        """Per offset (ascending, in [offsets[0], offsets[-1]]), whether it was delivered in (after, until]."""
        window = slice(np.searchsorted(self.offsets, offsets[0]), np.searchsorted(self.offsets, offsets[-1], "right"))
        times = self.ns[window]
        return np.isin(offsets, self.offsets[window][(times > after) & (times <= until)])


def _chain_breaks(has_members: bool, commits: list[dict[str, Any]], logged: np.ndarray,
                  reads: Reads) -> list[dict[str, Any]]:
    """One group's overlaps and gaps on one partition."""
    chain = sorted((c for c in commits if c["decided_commit"]),
                   key=lambda c: (c["at_ns"], c["mono_ns"], c["conn_id"], c["correlation_id"], c["offset"]))
    aborted = sorted((c for c in commits if c["decided_commit"] is False), key=lambda c: c["at_ns"])
    abort_times = [a["at_ns"] for a in aborted]
    cases = []
    for prev, link in zip(chain, chain[1:]):
        ids = _ids(link)
        if link["offset"] < prev["offset"]:
            # A group without members: its consumers assign partitions themselves (kproxy's own workload
            # does), so two of them may commit the same partition, the one behind after the one ahead.
            # No owner, no order: the clients' doing, not the broker's.
            cases.append(_case(**ids, kind="overlap", from_offset=link["offset"], to_offset=prev["offset"],
                               rules=_sorted_rules(link["decided_rule"], prev["decided_rule"]),
                               causes=[] if has_members else ["unowned-partitions"]))
        elif link["offset"] > prev["offset"]:
            # The aborted transactions that ended between the link's two commits.
            between = aborted[bisect_right(abort_times, prev["at_ns"]):bisect_left(abort_times, link["at_ns"])]
            gap = _gap(prev, link, between, logged, reads)
            if gap:
                cases.append(_case(**ids, **gap, kind="gap", from_offset=prev["offset"], to_offset=link["offset"]))
    return cases


def _gap(prev: dict[str, Any], link: dict[str, Any], between: list[dict[str, Any]], logged: np.ndarray,
         reads: Reads) -> dict[str, Any] | None:
    """The input records of the log inside a link (from the link before it, up to its own offset) that no
    consumer was delivered while the link's transaction was made; None when there is none.

    After an aborted transaction that ended between the link's two commits, the input below that
    transaction's offset must be delivered again after the abort (the consumer goes back to the committed
    position: KAFKA-17582 is the client that does not); a consumer that fetches ahead is not held to
    more."""
    decided = link["at_ns"]
    inside = logged[np.searchsorted(logged, prev["offset"]):np.searchsorted(logged, link["offset"])]
    if not len(inside):
        return None
    read_before = reads.before(inside, decided)
    if between:
        must_again = inside < max(a["offset"] for a in between)
        read_again = reads.between(inside, max(a["at_ns"] for a in between), decided)
    else:
        must_again = read_again = np.zeros(len(inside), bool)
    missing = ~read_before | (must_again & ~read_again)
    if not missing.any():
        return None
    # Each missing offset is explained when it lies below an aborted transaction's (the consumer kept the
    # aborted reads' position) or was served listed as aborted (the broker's list); a gap whose every
    # offset is one or the other has those causes (both, when its offsets differ), else none.
    not_back = (must_again & ~read_again & read_before)[missing]
    listed = (~read_before & np.isin(inside, reads.listed))[missing]
    causes = [] if not (not_back | listed).all() else (
        ["not-back-after-abort"] * bool(not_back.any()) + ["listed-as-aborted"] * bool(listed.any()))
    gone = inside[missing]
    return {"offsets": gone[:LISTED].tolist(), "missing": len(gone),
            "rules": _sorted_rules(link["decided_rule"], *(a["decided_rule"] for a in between)), "causes": causes}
