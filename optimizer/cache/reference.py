"""The executable specification of the cache engine: plain Python, readable, slow.

The numba engine (:mod:`kvtier.cache.nb`) must give identical per-request hits to this
module on every trace. Nothing here is optimised: policies keep their order in Python lists and
dicts and find victims by scanning, so each rule can be read off the code.

One tier is :class:`RefTier`: ``access(b)`` is the core loop (look up; on a miss admit, evict
until one more block fits, insert) and each policy's module supplies a ``Reference`` class with
``hit``, ``admit``, ``insert``, ``evict`` and ``remove`` (``kvtier.cache.policies.base``), the
specification its numba hooks beside it must match. Block sizes are 1; capacities are in blocks.
"""

from __future__ import annotations

import numpy as np

from kvtier.cache.policies import PolicySpec, parse_policy
from kvtier.trace.blocked import BlockedTrace


class RefTier:
    """One tier: capacity in blocks and a policy. The core loop lives in :meth:`access`."""

    def __init__(
        self, policy: str | PolicySpec, capacity: int, cost: np.ndarray | None = None
    ) -> None:
        self.spec = parse_policy(policy)
        self.capacity = int(capacity)
        self.module = self.spec.module
        self.impl = self.module.Reference(
            dict(self.spec.params), self.capacity, cost if cost is not None else _Ones()
        )
        self.size = 0
        self.clock = 0

    def contains(self, b: int) -> bool:
        return self.impl.contains(b)

    def access(self, b: int) -> tuple[bool, int]:
        """(hit, evicted block or -1): look up; on a miss admit, evict until it fits, insert."""
        impl = self.impl
        self.clock += 1
        impl.clock = self.clock
        if impl.contains(b):
            impl.hit(b)
            return True, -1
        flag = impl.admit(b)
        if flag < 0 or self.capacity < 1:
            return False, -1
        victim = -1
        if self.module.ADMIT_FIRST:  # admit first; the new block may be the victim
            if impl.insert(b, bool(flag)):
                self.size += 1
            while self.size > self.capacity:
                victim = impl.evict()
                self.size -= 1
            return False, victim
        while self.size + 1 > self.capacity:
            v = impl.evict()
            if v is not None:
                victim = v
                self.size -= 1
        if impl.insert(b, bool(flag)):
            self.size += 1
        return False, victim

    def evict_one(self) -> int:
        """Evict the block the policy chooses next (a batch eviction's victims, one by one:
        :mod:`kvtier.cache.watermark`); the tier must hold a block."""
        while True:
            v = self.impl.evict()
            if v is not None and v >= 0:
                self.size -= 1
                return v

    def remove(self, b: int) -> bool:
        resident = self.contains(b)
        self.impl.remove(b)
        if resident:
            self.size -= 1
        return resident


class _Ones:
    def __getitem__(self, b: int) -> float:
        return 1.0


def replay_reference(
    trace: BlockedTrace,
    policy: str | PolicySpec,
    capacity: int,
    *,
    flat: bool = False,
    cost: np.ndarray | None = None,
) -> list[int]:
    """Hit blocks of every request (warm-up included), by the rules of docs/design.md 4.3.

    Prefix: look up the blocks in order and count the longest resident run from block 0; then
    access every block from the last to the first. Flat: access each block in order and count
    every hit.
    """
    tier = RefTier(policy, capacity, cost)
    out: list[int] = []
    for r in range(trace.n_requests):
        blocks = [int(b) for b in trace.request_blocks(r)]
        if flat:
            out.append(sum(tier.access(b)[0] for b in blocks))
            continue
        hits = 0
        while hits < len(blocks) and tier.contains(blocks[hits]):
            hits += 1
        for b in reversed(blocks):
            tier.access(b)
        out.append(hits)
    return out


def lru_hits_by_capacity(
    trace: BlockedTrace, capacities: list[int], *, flat: bool = False, first_measured: int = 0
) -> list[int]:
    """LRU hit blocks of the measured requests at each capacity, one reference replay each."""
    return [sum(replay_reference(trace, "lru", c, flat=flat)[first_measured:]) for c in capacities]
