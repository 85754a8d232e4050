"""A tiny deterministic pseudo-random generator (SplitMix64).

The fault engine must give the same decisions for the same seed and the same
sequence of requests, on every platform and Python version, and the sans-IO
layers may not import `random` (house rule 1). SplitMix64 is a few lines, has
a full 2**64 period and passes BigCrush, which is plenty for coin flips and
jitter. It is not for cryptography.

Each rule gets its own stream, derived from the engine seed and the rule id,
so adding, removing or editing one rule never shifts the draws of another.
"""

from __future__ import annotations

import hashlib

_MASK64 = (1 << 64) - 1


class SplitMix64:
    """A seeded stream of 64-bit integers and floats in [0, 1)."""

    __slots__ = ("_state",)

    def __init__(self, seed: int) -> None:
        self._state = seed & _MASK64

    def next_u64(self) -> int:
        self._state = (self._state + 0x9E3779B97F4A7C15) & _MASK64
        z = self._state
        z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
        z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK64
        return z ^ (z >> 31)

    def random(self) -> float:
        """A float in [0, 1) with 53 bits of precision (like `random.random`)."""
        return (self.next_u64() >> 11) * (1.0 / (1 << 53))


def stream_seed(seed: int, name: str) -> int:
    """Derive an independent stream seed from the engine seed and a name.

    `hash(str)` is salted per process, so a stable digest is used instead.
    """
    digest = hashlib.blake2b(name.encode(), digest_size=8, key=(seed & _MASK64).to_bytes(8, "little")).digest()
    return int.from_bytes(digest, "little")
