"""LFU: evict the least frequently used block; ties go to the least recently used.

Semantics (libCacheSim ``LFU.c``): an inserted block has frequency 1, each hit adds 1. The
victim is the block with the smallest frequency; among those, the one that entered that
frequency earliest, which is the one whose last access is oldest (libCacheSim appends to the
tail of the frequency bucket on each access and evicts its head). Frequencies are forgotten on
eviction. Implemented as an indexed heap on (frequency, time of last access): O(log n).
No parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import L_FREQ, L_WHERE, M_CLOCK, W_ABSENT, W_MAIN
from kvtier.cache.heap import heap_pop_nb, heap_push_nb, heap_remove_nb, heap_update_nb
from kvtier.cache.nb_state import TierArrays
from kvtier.cache.policies.base import ReferenceBase, admit_nb, check, configure  # noqa: F401

# Read by numba as compile-time constants (kvtier.cache.hooks) and by the tier's setup.
ADMIT_FIRST = False  # admit a missed block first, then evict while over capacity
REMOVE_ABSENT = False  # remove_nb runs for a block that is not resident too
USES_HEAP = True  # keeps the priority heap (prio, stamp, heap, hpos per block)
USES_COST = False  # reads the per-block recompute cost


@njit(cache=True, nogil=True, _nrt=False)
def hit_nb(tier: TierArrays, b: int) -> None:
    tier.blk[b, L_FREQ] += 1
    tier.prio[b] = tier.blk[b, L_FREQ]
    tier.stamp[b] = tier.meta[M_CLOCK]
    heap_update_nb(tier.meta, tier.heap, tier.hpos, tier.prio, tier.stamp, b)


@njit(cache=True, nogil=True, _nrt=False)
def insert_nb(tier: TierArrays, b: int, flag: int) -> bool:
    tier.blk[b, L_WHERE] = W_MAIN
    tier.blk[b, L_FREQ] = 1
    tier.prio[b] = 1.0
    tier.stamp[b] = tier.meta[M_CLOCK]
    heap_push_nb(tier.meta, tier.heap, tier.hpos, tier.prio, tier.stamp, b)
    return True


@njit(cache=True, nogil=True, _nrt=False)
def evict_nb(tier: TierArrays) -> int:
    v = heap_pop_nb(tier.meta, tier.heap, tier.hpos, tier.prio, tier.stamp)
    tier.blk[v, L_WHERE] = W_ABSENT
    tier.blk[v, L_FREQ] = 0
    return v


@njit(cache=True, nogil=True, _nrt=False)
def remove_nb(tier: TierArrays, b: int) -> None:
    heap_remove_nb(tier.meta, tier.heap, tier.hpos, tier.prio, tier.stamp, b)
    tier.blk[b, L_WHERE] = W_ABSENT
    tier.blk[b, L_FREQ] = 0


class Reference(ReferenceBase):
    """Victim: smallest (frequency, time of last access)."""

    def __init__(self, params: Mapping[str, float], capacity: int, cost: Any) -> None:
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
