"""The executable specification of the cache engine: plain Python, readable, slow.

The numba engine (:mod:`kvtier.cache.nb`) must give identical per-request hits to this
module on every trace. Nothing here is optimised: policies keep their order in Python lists and
dicts and find victims by scanning, so each rule can be read off the code.

One tier is :class:`RefTier`: ``access(b)`` is the core loop (look up; on a miss admit, evict
until one more block fits, insert) and each policy supplies ``hit``, ``insert``, ``evict`` and
``remove``. Block sizes are 1; capacities are in blocks.
"""

from __future__ import annotations

from collections import OrderedDict

import numpy as np

from kvtier.cache.policies import PolicySpec, parse_policy
from kvtier.cache.policies.s3fifo import sizes as s3fifo_sizes
from kvtier.trace.blocked import BlockedTrace


class _Lru:
    """Oldest first in ``order``; a hit moves the block to the end (newest)."""

    def __init__(self) -> None:
        self.order: OrderedDict[int, None] = OrderedDict()

    def contains(self, b: int) -> bool:
        return b in self.order

    def hit(self, b: int) -> None:
        self.order.move_to_end(b)

    def insert(self, b: int, ghost_hit: bool) -> bool:
        self.order[b] = None
        return True

    def evict(self) -> int | None:
        return self.order.popitem(last=False)[0]

    def remove(self, b: int) -> None:
        self.order.pop(b, None)


class _Fifo(_Lru):
    def hit(self, b: int) -> None:
        pass


class _Lfu:
    """Victim: smallest (frequency, time of last access)."""

    def __init__(self) -> None:
        self.freq: dict[int, int] = {}
        self.last: dict[int, int] = {}
        self.clock = 0

    def contains(self, b: int) -> bool:
        return b in self.freq

    def hit(self, b: int) -> None:
        self.freq[b] += 1
        self.last[b] = self.clock

    def insert(self, b: int, ghost_hit: bool) -> bool:
        self.freq[b] = 1
        self.last[b] = self.clock
        return True

    def evict(self) -> int | None:
        victim = min(self.freq, key=lambda b: (self.freq[b], self.last[b]))
        self.remove(victim)
        return victim

    def remove(self, b: int) -> None:
        self.freq.pop(b, None)
        self.last.pop(b, None)


class _Gdsf:
    """H = L + cost * freq; victim: smallest (H, time of last access); L = H of the victim."""

    def __init__(self, cost: np.ndarray) -> None:
        self.cost = cost
        self.inflation = 0.0
        self.freq: dict[int, int] = {}
        self.h: dict[int, float] = {}
        self.last: dict[int, int] = {}
        self.clock = 0

    def contains(self, b: int) -> bool:
        return b in self.freq

    def hit(self, b: int) -> None:
        self.freq[b] += 1
        self.h[b] = self.inflation + float(self.cost[b]) * self.freq[b]
        self.last[b] = self.clock

    def insert(self, b: int, ghost_hit: bool) -> bool:
        self.freq[b] = 1
        self.h[b] = self.inflation + float(self.cost[b]) * 1
        self.last[b] = self.clock
        return True

    def evict(self) -> int | None:
        victim = min(self.h, key=lambda b: (self.h[b], self.last[b]))
        self.inflation = self.h[victim]
        self.remove(victim)
        return victim

    def remove(self, b: int) -> None:
        self.freq.pop(b, None)
        self.h.pop(b, None)
        self.last.pop(b, None)


class _Sieve:
    """``queue`` from oldest (index 0) to newest; the hand walks toward newer blocks."""

    def __init__(self) -> None:
        self.queue: list[int] = []
        self.visited: dict[int, bool] = {}
        self.hand: int | None = None  # None: start at the oldest block

    def contains(self, b: int) -> bool:
        return b in self.visited

    def hit(self, b: int) -> None:
        self.visited[b] = True

    def insert(self, b: int, ghost_hit: bool) -> bool:
        self.queue.append(b)
        self.visited[b] = False
        return True

    def _newer(self, i: int) -> int | None:
        return self.queue[i + 1] if i + 1 < len(self.queue) else None

    def evict(self) -> int | None:
        i = 0 if self.hand is None else self.queue.index(self.hand)
        while self.visited[self.queue[i]]:
            self.visited[self.queue[i]] = False
            i = i + 1 if i + 1 < len(self.queue) else 0
        victim = self.queue[i]
        self.hand = self._newer(i)
        self.queue.pop(i)
        del self.visited[victim]
        return victim

    def remove(self, b: int) -> None:
        if b not in self.visited:
            return
        i = self.queue.index(b)
        if self.hand == b:
            self.hand = self._newer(i)
        self.queue.pop(i)
        del self.visited[b]


class _S3Fifo:
    """Small and main FIFOs (oldest first) with counters, and a ghost FIFO of ids."""

    def __init__(self, spec: PolicySpec, capacity: int) -> None:
        self.small_cap, self.main_cap, self.ghost_cap = s3fifo_sizes(
            capacity, spec.param("small"), spec.param("ghost")
        )
        self.threshold = int(spec.param("threshold"))
        self.small: list[int] = []
        self.main: list[int] = []
        self.ghost: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.freq: dict[int, int] = {}
        self.has_evicted = False

    def contains(self, b: int) -> bool:
        return b in self.freq

    def hit(self, b: int) -> None:
        self.freq[b] += 1

    def ghost_check(self, b: int) -> bool:
        """On a miss: a ghost id leaves the ghost and the block will go to main."""
        return self.ghost.pop(b, False) is None

    def can_admit(self) -> bool:
        return self.small_cap >= 1

    def insert(self, b: int, ghost_hit: bool) -> bool:
        if not ghost_hit:
            if self.small_cap <= 1:  # libCacheSim: obj_size >= small size -> not inserted
                return False
            if not self.has_evicted and len(self.small) >= self.small_cap:
                ghost_hit = True  # before the first eviction a full small FIFO spills to main
        (self.main if ghost_hit else self.small).append(b)
        self.freq[b] = 0
        return True

    def _to_ghost(self, b: int) -> None:
        if self.ghost_cap <= 0:
            return
        while len(self.ghost) + 1 > self.ghost_cap:
            self.ghost.popitem(last=False)
        self.ghost[b] = None

    def evict(self) -> int | None:
        self.has_evicted = True
        if len(self.main) > self.main_cap or not self.small:
            while self.main:
                b = self.main.pop(0)
                if self.freq[b] >= 1:
                    self.main.append(b)
                    self.freq[b] = min(self.freq[b], 3) - 1
                else:
                    del self.freq[b]
                    return b
            return None
        while self.small:
            b = self.small.pop(0)
            if self.freq[b] >= self.threshold:
                self.main.append(b)
                self.freq[b] = 0
            else:
                del self.freq[b]
                self._to_ghost(b)
                return b
        return None

    def remove(self, b: int) -> None:
        self.ghost.pop(b, None)
        if b in self.freq:
            del self.freq[b]
            (self.small if b in self.small else self.main).remove(b)


class RefTier:
    """One tier: capacity in blocks and a policy. The core loop lives in :meth:`access`."""

    def __init__(
        self, policy: str | PolicySpec, capacity: int, cost: np.ndarray | None = None
    ) -> None:
        self.spec = parse_policy(policy)
        self.capacity = int(capacity)
        base = self.spec.base
        if base == "lru":
            self.impl: object = _Lru()
        elif base == "fifo":
            self.impl = _Fifo()
        elif base == "lfu":
            self.impl = _Lfu()
        elif base == "gdsf":
            self.impl = _Gdsf(cost if cost is not None else _Ones())
        elif base == "sieve":
            self.impl = _Sieve()
        else:
            self.impl = _S3Fifo(self.spec, self.capacity)
        self.size = 0
        self.clock = 0

    def contains(self, b: int) -> bool:
        return self.impl.contains(b)  # type: ignore[attr-defined]

    def access(self, b: int) -> tuple[bool, int]:
        """(hit, evicted block or -1): look up; on a miss admit, evict until it fits, insert."""
        impl = self.impl
        self.clock += 1
        if hasattr(impl, "clock"):
            impl.clock = self.clock  # type: ignore[attr-defined]
        if impl.contains(b):  # type: ignore[attr-defined]
            impl.hit(b)  # type: ignore[attr-defined]
            return True, -1
        ghost_hit = False
        if isinstance(impl, _S3Fifo):
            ghost_hit = impl.ghost_check(b)
            if not impl.can_admit():
                return False, -1
        if self.capacity < 1:
            return False, -1
        victim = -1
        if isinstance(impl, _Gdsf):  # admit first; the new block may be the victim
            impl.insert(b, ghost_hit)
            self.size += 1
            while self.size > self.capacity:
                victim = impl.evict()
                self.size -= 1
            return False, victim
        while self.size + 1 > self.capacity:
            v = impl.evict()  # type: ignore[attr-defined]
            if v is not None:
                victim = v
                self.size -= 1
        if impl.insert(b, ghost_hit):  # type: ignore[attr-defined]
            self.size += 1
        return False, victim

    def remove(self, b: int) -> bool:
        resident = self.contains(b)
        self.impl.remove(b)  # type: ignore[attr-defined]
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
