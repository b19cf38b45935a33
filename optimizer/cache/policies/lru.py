"""LRU: evict the least recently used block.

Semantics (libCacheSim ``LRU.c``): a hit moves the block to the head of one queue; a miss
inserts it at the head; eviction takes the tail. No parameters.
"""

from __future__ import annotations

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import M_HEAD, M_TAIL
from kvtier.cache.lists import push_head_nb, unlink_nb
from kvtier.cache.nb_state import TierArrays

# Admission, eviction and removal are FIFO's: one queue, insert at the head, evict the tail.
# LRU differs only in what a hit does.
from kvtier.cache.policies.base import admit_nb, check, configure  # noqa: F401
from kvtier.cache.policies.fifo import Reference as FifoReference
from kvtier.cache.policies.fifo import evict_nb, insert_nb, remove_nb  # noqa: F401

# Read by numba as compile-time constants (kvtier.cache.hooks) and by the tier's setup.
ADMIT_FIRST = False  # admit a missed block first, then evict while over capacity
REMOVE_ABSENT = False  # remove_nb runs for a block that is not resident too
USES_HEAP = False  # keeps the priority heap (prio, stamp, heap, hpos per block)
USES_COST = False  # reads the per-block recompute cost


@njit(cache=True, nogil=True, _nrt=False)
def hit_nb(tier: TierArrays, b: int) -> None:
    meta, blk = tier.meta, tier.blk
    unlink_nb(meta, M_HEAD, M_TAIL, blk, b)
    push_head_nb(meta, M_HEAD, M_TAIL, blk, b)


class Reference(FifoReference):
    """Oldest first in ``order``; a hit moves the block to the end (newest)."""

    def hit(self, b: int) -> None:
        self.order.move_to_end(b)
