"""LRU: evict the least recently used block.

Semantics (libCacheSim ``LRU.c``): a hit moves the block to the head of one queue; a miss
inserts it at the head; eviction takes the tail. No parameters.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtier.cache.enums import M_HEAD, M_TAIL
from kvtier.cache.lists import push_head_nb, unlink_nb

# Admission, eviction and removal are FIFO's: one queue, insert at the head, evict the tail.
# LRU differs only in what a hit does.
from kvtier.cache.policies.fifo import evict_nb, insert_nb, remove_nb  # noqa: F401

NAME = "lru"
DEFAULTS: dict[str, float] = {}
DOC = "least recently used; a hit moves the block to the head, eviction takes the tail"


@njit(cache=True, nogil=True, _nrt=False)
def hit_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    b: int,
) -> None:
    unlink_nb(meta, M_HEAD, M_TAIL, blk, b)
    push_head_nb(meta, M_HEAD, M_TAIL, blk, b)
