"""LRU: evict the least recently used block.

Semantics (libCacheSim ``LRU.c``): a hit moves the block to the head of one queue; a miss
inserts it at the head; eviction takes the tail. No parameters.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from optimizer.sim.cache.enums import L_WHERE, M_HEAD, M_TAIL, W_ABSENT, W_MAIN
from optimizer.sim.cache.lists import push_head_nb, unlink_nb

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


@njit(cache=True, nogil=True, _nrt=False)
def insert_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    b: int,
) -> bool:
    blk[b, L_WHERE] = W_MAIN
    push_head_nb(meta, M_HEAD, M_TAIL, blk, b)
    return True


@njit(cache=True, nogil=True, _nrt=False)
def evict_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
) -> int:
    v = meta[M_TAIL]
    unlink_nb(meta, M_HEAD, M_TAIL, blk, v)
    blk[v, L_WHERE] = W_ABSENT
    return v


@njit(cache=True, nogil=True, _nrt=False)
def remove_nb(
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
    blk[b, L_WHERE] = W_ABSENT
