"""Keys, their topic-partitions, their values, and their rotation.

Every key is one topic-partition, so the history can be joined to wire traces
by (topic, partition). With `partitions_per_topic = 1` (the default) each key
has its own topic `<prefix>-<key>`; with N > 1, key k lives in topic
`<prefix>-<k // N>`, partition `k % N`.

Keys in play are picked with exponential frequency (the first slot twice as
often as the second, and so on) so some keys are hot and contended while
others are cold. After `max_writes_per_key` sends a key is retired and a
fresh key takes its slot, which keeps per-key histories short enough for the
checkers. Topics are created (through the callback) the first time one of
their keys is picked, and each new key is recorded with the process that
brought it in.
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable
from dataclasses import dataclass

TopicPartition = tuple[str, int]


@dataclass(frozen=True)
class KeyLayout:
    prefix: str
    partitions_per_topic: int

    def topic_partition(self, key: int) -> TopicPartition:
        n = self.partitions_per_topic
        return (f"{self.prefix}-{key // n}", key % n)


class KeySpace:
    """The keys in play, shared by all workers (one lock: picks are cheap)."""

    def __init__(
        self,
        layout: KeyLayout,
        key_count: int,
        max_writes_per_key: int,
        create_topic: Callable[[str, int], None],
        record_create: Callable[[int, int, str, int], None],
    ) -> None:
        self.layout = layout
        self.max_writes = max_writes_per_key
        self._create_topic = create_topic
        self._record_create = record_create
        self._lock = threading.Lock()
        self._slots = list(range(key_count))
        self._next_key = key_count
        self._writes: dict[int, int] = {}
        self._topics: set[str] = set()
        self._keys: dict[int, TopicPartition] = {}

    @staticmethod
    def _weights(n: int) -> list[float]:
        return [2.0 ** -i for i in range(n)]

    def _introduce(self, key: int, process: int) -> None:
        if key in self._keys:
            return
        topic, partition = self.layout.topic_partition(key)
        if topic not in self._topics:
            self._create_topic(topic, self.layout.partitions_per_topic)
            self._topics.add(topic)
        self._keys[key] = (topic, partition)
        self._record_create(process, key, topic, partition)

    def next_send(self, rng: random.Random, process: int) -> tuple[int, int]:
        """A (key, value) pair for a new send; values count up from 0 per key, so they are unique."""
        with self._lock:
            slot = rng.choices(range(len(self._slots)), weights=self._weights(len(self._slots)))[0]
            key = self._slots[slot]
            self._introduce(key, process)
            value = self._writes.get(key, 0)
            self._writes[key] = value + 1
            if value + 1 >= self.max_writes:
                self._slots[slot] = self._next_key
                self._next_key += 1
            return key, value

    def read_set(self, rng: random.Random, process: int) -> list[int]:
        """A random non-empty subset of the keys in play, to assign or subscribe to."""
        with self._lock:
            size = rng.randint(1, len(self._slots))
            keys = sorted(rng.sample(self._slots, size))
            for key in keys:
                self._introduce(key, process)
            return keys

    def topic_partition(self, key: int) -> TopicPartition:
        return self.layout.topic_partition(key)

    def key_of(self, topic: str, partition: int) -> int | None:
        """The key a topic-partition stands for, if it belongs to this run."""
        prefix = self.layout.prefix + "-"
        if not topic.startswith(prefix):
            return None
        try:
            index = int(topic[len(prefix):])
        except ValueError:
            return None
        return index * self.layout.partitions_per_topic + partition

    def known_keys(self) -> dict[int, TopicPartition]:
        with self._lock:
            return dict(self._keys)
