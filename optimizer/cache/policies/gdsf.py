"""GDSF (GreedyDual-Size-Frequency): cost-aware eviction with inflation.

Semantics (libCacheSim ``cpp/GDSF.cpp`` as built in the ``libcachesim`` 0.3 wheels, with the
recompute cost made explicit): every resident block has priority ``H = L + cost[b] * freq /
size``; an inserted block has ``freq = 1``, a hit adds 1 and recomputes ``H`` with the current
``L``. A missed block is admitted *first* (with the current ``L``) and then the tier evicts
while it is over capacity, so the new block competes and may itself be the victim (its stamp is
the newest, so only when its ``H`` is strictly the smallest). The victim has the smallest ``H``,
ties going to the smaller virtual time of the last access (``abstractRank.hpp``); evicting it
sets ``L`` to its ``H``, so blocks that stop being used age relative to new ones. (An older
libCacheSim evicted before inserting, and set ``L`` before computing the new block's ``H``.) All
blocks of a tier have the same size (``B`` tokens), so ``size`` is 1 block and ``cost[b]``
carries the recompute seconds saved per block (docs/design.md 4.3: seconds saved x frequency /
bytes). libCacheSim has no cost and uses ``1e6 / obj_size``; with unit costs the two orderings
are identical, because all priorities are then integers held exactly in float64. No parameters;
costs come from an array.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import F_INFLATION, L_FREQ, L_WHERE, M_CLOCK, W_ABSENT, W_MAIN
from kvtier.cache.heap import heap_pop_nb, heap_push_nb, heap_update_nb
from kvtier.cache.nb_state import TierArrays
from kvtier.cache.policies.base import ReferenceBase, admit_nb, check, configure  # noqa: F401

# Removal is LFU's: take the block out of the heap and forget its count.
from kvtier.cache.policies.lfu import remove_nb  # noqa: F401

# Read by numba as compile-time constants (kvtier.cache.hooks) and by the tier's setup.
ADMIT_FIRST = True  # admit a missed block first, then evict while over capacity
REMOVE_ABSENT = False  # remove_nb runs for a block that is not resident too
USES_HEAP = True  # keeps the priority heap (prio, stamp, heap, hpos per block)
USES_COST = True  # reads the per-block recompute cost


@njit(cache=True, nogil=True, _nrt=False)
def hit_nb(tier: TierArrays, b: int) -> None:
    tier.blk[b, L_FREQ] += 1
    tier.prio[b] = tier.fmeta[F_INFLATION] + tier.cost[b] * tier.blk[b, L_FREQ]
    tier.stamp[b] = tier.meta[M_CLOCK]
    heap_update_nb(tier.meta, tier.heap, tier.hpos, tier.prio, tier.stamp, b)


@njit(cache=True, nogil=True, _nrt=False)
def insert_nb(tier: TierArrays, b: int, flag: int) -> bool:
    tier.blk[b, L_WHERE] = W_MAIN
    tier.blk[b, L_FREQ] = 1
    tier.prio[b] = tier.fmeta[F_INFLATION] + tier.cost[b] * 1
    tier.stamp[b] = tier.meta[M_CLOCK]
    heap_push_nb(tier.meta, tier.heap, tier.hpos, tier.prio, tier.stamp, b)
    return True


@njit(cache=True, nogil=True, _nrt=False)
def evict_nb(tier: TierArrays) -> int:
    v = heap_pop_nb(tier.meta, tier.heap, tier.hpos, tier.prio, tier.stamp)
    tier.fmeta[F_INFLATION] = tier.prio[v]
    tier.blk[v, L_WHERE] = W_ABSENT
    tier.blk[v, L_FREQ] = 0
    return v


class Reference(ReferenceBase):
    """H = L + cost * freq; victim: smallest (H, time of last access); L = H of the victim."""

    def __init__(self, params: Mapping[str, float], capacity: int, cost: Any) -> None:
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
