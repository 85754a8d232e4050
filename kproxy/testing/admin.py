"""A small client for a running proxy's admin API (docs/rules.md, "Admin API"), for tests.

    admin = AdminClient("127.0.0.1:19080")
    with admin.rule({"id": "slow-commit", "match": {"api": "EndTxn"}, "action": {"type": "delay", "ms": 200}}):
        ...  # the rule applies to every connection, already open or not, from its next request on
    admin.rules()  # [{"id": ..., "counters": {"matched": n, "applied": n}, ...}]

A rule is a dict as in a rule file's YAML. The proxy validates it; a rule
it refuses raises AdminError with the proxy's own message (file and field).
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, Self
from urllib.parse import quote

import httpx

_generated_ids = itertools.count(1)


class AdminError(RuntimeError):
    """The admin API refused a call (`status` is its HTTP status), or could not be reached (`status` None)."""

    def __init__(self, message: str, status: int | None = None) -> None:
        super().__init__(message)
        self.status = status


class AdminClient:
    """The admin API at `address` (HOST:PORT or an http:// URL); `token` or `token_file` for a proxy with one."""

    def __init__(self, address: str, *, token: str | None = None, token_file: Path | str | None = None,
                 timeout: float = 10.0) -> None:
        self.url = address.rstrip("/") if "://" in address else f"http://{address}"
        if token is None and token_file is not None:
            from kproxy.io.admin_token import read_token

            token = read_token(Path(token_file))
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._http = httpx.Client(base_url=self.url, headers=headers, timeout=timeout)

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"AdminClient({self.url!r})"

    # -- the rules API ---------------------------------------------------------------

    def rules(self) -> list[dict[str, Any]]:
        """The proxy's rules in order, each with its `counters` (`matched`, `applied`)."""
        return list(self._call("GET", "/rules")["rules"])

    def phase(self) -> str | None:
        """The schedule phase active now (None without a schedule)."""
        return self._call("GET", "/rules").get("phase")

    def get_rule(self, rule_id: str) -> dict[str, Any]:
        """One rule with its counters; AdminError (status 404) when there is none of that id."""
        for rule in self.rules():
            if rule["id"] == rule_id:
                return rule
        raise AdminError(f"no rule {rule_id!r}", 404)

    def add_rule(self, rule: Mapping[str, Any]) -> dict[str, Any]:
        """Add a rule, or replace the one with its id; returns it as the proxy took it.

        Without an `id` one is made up (`test-rule-N`)."""
        body = dict(rule)
        rule_id = str(body.get("id") or f"test-rule-{next(_generated_ids)}")
        body["id"] = rule_id
        return self._call("PUT", f"/rules/{rule_id}", body)

    def remove_rule(self, rule_id: str) -> None:
        self._call("DELETE", f"/rules/{rule_id}")

    def enable_rule(self, rule_id: str) -> dict[str, Any]:
        return self._call("POST", f"/rules/{rule_id}/enable")

    def disable_rule(self, rule_id: str) -> dict[str, Any]:
        return self._call("POST", f"/rules/{rule_id}/disable")

    def reset(self) -> None:
        """Zero every rule's counters and restart its seeded random stream."""
        self._call("POST", "/rules/reset")

    @contextlib.contextmanager
    def rule(self, rule: Mapping[str, Any]) -> Iterator[dict[str, Any]]:
        """The rule in force for the `with` block, removed at its end (also when the block raises)."""
        added = self.add_rule(rule)
        try:
            yield added
        finally:
            with contextlib.suppress(AdminError):  # the block may have removed it itself
                self.remove_rule(added["id"])

    # -- the rest of the admin API -----------------------------------------------------

    def txns(self) -> dict[str, Any]:
        """The transaction tracker: producers with their synthetic transaction numbers, hazards, guard."""
        return self._call("GET", "/txns")

    def health(self) -> dict[str, Any]:
        return self._call("GET", "/healthz")

    def _call(self, method: str, path: str, body: Any = None) -> Any:
        try:
            response = self._http.request(method, quote(path), json=body)
        except httpx.HTTPError as exc:
            raise AdminError(f"cannot reach the admin API at {self.url}: {exc}") from exc
        try:
            answer = response.json()
        except ValueError:
            answer = None
        if response.status_code >= 400:
            message = answer.get("error") if isinstance(answer, dict) else None
            raise AdminError(message or f"{method} {path}: HTTP {response.status_code} {response.text.strip()}",
                             response.status_code)
        return answer
