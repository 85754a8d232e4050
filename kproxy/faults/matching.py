"""A rule compiled for matching: its static match fields, parsed once.

"Static" fields are those decided by the frame alone (api, version,
direction, ids, topics, partitions, committed, transaction number). Counting
(nth, every, after), probability, limits and schedules are the engine's job,
because they depend on history and time.
"""

from __future__ import annotations

from dataclasses import dataclass

from kproxy.faults.actions import ACTIONS, ActionSpec
from kproxy.faults.apis import SASL_APIS
from kproxy.faults.fieldspecs import VersionRange, parse_apis, parse_partitions, parse_txn_number, parse_versions
from kproxy.faults.globs import GlobMatcher, compile_glob
from kproxy.faults.model import Rule
from kproxy.faults.view import ExchangeView


@dataclass(frozen=True)
class CompiledRule:
    rule: Rule
    spec: ActionSpec
    apis: frozenset[int] | None
    versions: tuple[VersionRange, ...] | None
    partitions: frozenset[int] | None
    txn_numbers: tuple[int, int | None] | None
    # Compiled when the rule is loaded, so matching a frame never compiles.
    client_id: GlobMatcher | None
    transactional_id: GlobMatcher | None
    topic: GlobMatcher | None
    # True if matching reads facts only a decoded body gives.
    needs_body: bool

    @classmethod
    def compile(cls, rule: Rule) -> "CompiledRule":
        m = rule.match
        return cls(
            rule=rule,
            spec=ACTIONS[rule.action.type],
            apis=None if m.api is None else parse_apis(m.api),
            versions=None if m.versions is None else parse_versions(m.versions),
            partitions=None if m.partition is None else parse_partitions(m.partition),
            txn_numbers=None if m.txn_number is None else parse_txn_number(m.txn_number),
            client_id=None if m.client_id is None else compile_glob(m.client_id),
            transactional_id=None if m.transactional_id is None else compile_glob(m.transactional_id),
            topic=None if m.topic is None else compile_glob(m.topic),
            needs_body=any(v is not None for v in (m.topic, m.partition, m.transactional_id, m.committed, m.txn_number)),
        )

    @property
    def id(self) -> str:
        return self.rule.id

    def covers(self, api_key: int, direction: str) -> bool:
        """Could this rule match some frame of this API and direction?"""
        if self.rule.match.direction != direction:
            return False
        return api_key not in SASL_APIS if self.apis is None else api_key in self.apis

    def matches(self, view: ExchangeView) -> bool:
        m = self.rule.match
        if not self.covers(view.api_key, view.direction):
            return False
        if self.versions is not None and not any(
            low <= view.api_version and (high is None or view.api_version <= high) for low, high in self.versions
        ):
            return False
        if self.client_id is not None and (view.client_id is None or not self.client_id(view.client_id)):
            return False
        if self.transactional_id is not None and (
            view.transactional_id is None or not self.transactional_id(view.transactional_id)
        ):
            return False
        if m.committed is not None and view.committed is not m.committed:
            return False
        if self.txn_numbers is not None:
            low, high = self.txn_numbers
            if view.txn_number is None or view.txn_number < low or (high is not None and view.txn_number > high):
                return False
        if self.topic is not None or self.partitions is not None:
            if view.topics is None or not any(self._topic_matches(t, ps) for t, ps in view.topics):
                return False
        return True

    def _topic_matches(self, topic: str, partitions: tuple[int, ...]) -> bool:
        if self.topic is not None and not self.topic(topic):
            return False
        return self.partitions is None or any(p in self.partitions for p in partitions)
