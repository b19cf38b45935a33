"""FIFO: evict the block that was inserted first.

Semantics (libCacheSim ``FIFO.c``): a hit changes nothing; a miss inserts the block at the head;
eviction takes the tail. No parameters.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import L_WHERE, M_HEAD, M_TAIL, W_ABSENT, W_MAIN
from kvtier.cache.lists import push_head_nb, unlink_nb
from kvtier.cache.nb_state import TierArrays
from kvtier.cache.policies.base import ReferenceBase, admit_nb, check, configure  # noqa: F401

# Read by numba as compile-time constants (kvtier.cache.hooks) and by the tier's setup.
ADMIT_FIRST = False  # admit a missed block first, then evict while over capacity
REMOVE_ABSENT = False  # remove_nb runs for a block that is not resident too
USES_HEAP = False  # keeps the priority heap (prio, stamp, heap, hpos per block)
USES_COST = False  # reads the per-block recompute cost


@njit(cache=True, nogil=True, _nrt=False)
def hit_nb(tier: TierArrays, b: int) -> None:
    pass


@njit(cache=True, nogil=True, _nrt=False)
def insert_nb(tier: TierArrays, b: int, flag: int) -> bool:
    meta, blk = tier.meta, tier.blk
    blk[b, L_WHERE] = W_MAIN
    push_head_nb(meta, M_HEAD, M_TAIL, blk, b)
    return True


@njit(cache=True, nogil=True, _nrt=False)
def evict_nb(tier: TierArrays) -> int:
    meta, blk = tier.meta, tier.blk
    v = meta[M_TAIL]
    unlink_nb(meta, M_HEAD, M_TAIL, blk, v)
    blk[v, L_WHERE] = W_ABSENT
    return v


@njit(cache=True, nogil=True, _nrt=False)
def remove_nb(tier: TierArrays, b: int) -> None:
    meta, blk = tier.meta, tier.blk
    unlink_nb(meta, M_HEAD, M_TAIL, blk, b)
    blk[b, L_WHERE] = W_ABSENT


class Reference(ReferenceBase):
    """Oldest first in ``order``; a hit changes nothing."""

    def __init__(self, params: Mapping[str, float], capacity: int, cost: Any) -> None:
        self.order: OrderedDict[int, None] = OrderedDict()

    def contains(self, b: int) -> bool:
        return b in self.order

    def hit(self, b: int) -> None:
        pass

    def insert(self, b: int, ghost_hit: bool) -> bool:
        self.order[b] = None
        return True

    def evict(self) -> int | None:
        return self.order.popitem(last=False)[0]

    def remove(self, b: int) -> None:
        self.order.pop(b, None)
