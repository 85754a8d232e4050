"""The pieces wire sentences are made of, rendered on the driver from a
case's own fields (plain Python: no Spark here).

Numbers and names print as Spark's ``format_string`` printed them when the
sentences were built in Spark (a missing one as ``null``), so a case reads
the same wherever it was rendered.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

# How a fault action reads in a sentence: text before and after the rule's name.
_ACTED = {
    "duplicate": ("duplicated by rule '", "'"),
    "delay": ("delayed by rule '", "'"),
    "hold": ("held back by rule '", "'"),
    "drop": ("dropped by rule '", "'"),
    "drop_response": ("its response dropped by rule '", "'"),
    "respond": ("answered by the proxy (rule '", "')"),
    "replace_error": ("its answer replaced with an error by rule '", "'"),
    "rewrite": ("rewritten by rule '", "'"),
    "disconnect": ("its connection closed by rule '", "'"),
}

_ERROR_NAMES: dict[int, str] = {}


def text(value: Any) -> str:
    """A field as a sentence prints it: true/false, null when missing."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    return str(value)


def error(code: int | None) -> str:
    """An error code as Kafka names it (the number when kio does not know it)."""
    if not _ERROR_NAMES:
        from kio.schema.errors import ErrorCode

        _ERROR_NAMES.update({int(e): e.name.upper() for e in ErrorCode})
    return _ERROR_NAMES.get(code, text(code)) if code is not None else "null"


def errors(codes: Iterable[int | None] | None) -> str:
    return ", ".join(error(c) for c in codes or () if c is not None)


def pairs(records: Iterable[Iterable[Any]] | None) -> str:
    """[key, value] pairs as Kafka engineers write records: [3,0] [0,15]."""
    return " ".join(f"[{p[0]},{p[1]}]" for p in records or () if p is not None and None not in p)


def numbers(values: Iterable[Any] | None) -> str:
    return ", ".join(text(v) for v in values or () if v is not None)


def at(conn_id: Any, correlation_id: Any) -> str:
    return f"(conn {text(conn_id)}, correlation id {text(correlation_id)})"


def acted(rule: str | None, action: str | None) -> str | None:
    """'duplicated by rule 'x'' and the like; None when no rule acted."""
    if rule is None:
        return None
    if action in _ACTED:
        before, after = _ACTED[action]
        return f"{before}{rule}{after}"
    return f"handled by rule '{rule}' (action {action if action is not None else '?'})"


def acted_and(rule: str | None, action: str | None) -> str:
    """acted(...) followed by ' and ', or nothing."""
    phrase = acted(rule, action)
    return f"{phrase} and " if phrase else ""


def commit_or_abort(commit: bool | None) -> str:
    return "commit" if commit else "abort"


def delivered_in(hazard: str | None, broker_txn: Any) -> str:
    if hazard == "stale_end_txn":
        return f"delivered while broker txn {text(broker_txn)} was open"
    return f"delivered in broker txn {text(broker_txn)}" + (f" ({hazard})" if hazard is not None else "")


def end_txn(end: Mapping[str, Any]) -> str:
    """'the EndTxn(commit) of client txn 4, duplicated by rule 'r' and delivered
    while broker txn 5 was open (conn 8, correlation id 15)' for one EndTxn
    (kproxy_spark.wire.log_pass.END_TXN_ATTRIBUTION)."""
    phrase = f"the EndTxn({commit_or_abort(end.get('end_txn_commit'))}) of client txn {text(end.get('txn_client'))}"
    how = acted(end.get("rule"), end.get("action"))
    if end.get("hazard") is not None:
        phrase += ", " + (f"{how} and " if how else "") + delivered_in(end["hazard"], end.get("txn_broker"))
    elif how:
        phrase += f", {how}"
    return f"{phrase} {at(end.get('conn_id'), end.get('correlation_id'))}"


def rules_involved(rules: Iterable[str | None] | None) -> str:
    named = [f"'{r}'" for r in rules or () if r is not None]
    return f"; fault rules involved: {', '.join(named)}" if named else ""


def end_txn_cause(stale: list | None, deciding: list | None, rules: list | None, with_deciding: bool = True) -> str:
    """'; cause: <the stale EndTxns>' or, when no EndTxn with a hazard decided
    the records, what did (the deciding EndTxns, when `with_deciding`, and the
    rules involved)."""
    if stale:
        return "; cause: " + "; and ".join(end_txn(e) for e in stale)
    told = "; no EndTxn with a hazard decided them"
    if with_deciding and deciding:
        told += " (they were decided by " + "; and ".join(end_txn(e) for e in deciding) + ")"
    return told + rules_involved(rules)


def client_outcome(type_: str | None, error_text: str | None, f: str | None = "txn") -> str:
    """What the client said of an op: committed (acknowledged, for a plain
    send), aborted, failed, or unknown."""
    if type_ == "ok":
        return "client committed" if f == "txn" else "client acknowledged"
    given = error_text if error_text is not None else "no error given"
    if type_ == "fail":
        return "client aborted" if error_text == "aborted" else f"client failed: {given}"
    return f"client outcome unknown: {given}"
