"""FIFO: evict the block that was inserted first.

Semantics (libCacheSim ``FIFO.c``): a hit changes nothing; a miss inserts the block at the head;
eviction takes the tail. No parameters.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtier.cache.enums import L_WHERE, M_HEAD, M_TAIL, W_ABSENT, W_MAIN
from kvtier.cache.lists import push_head_nb, unlink_nb

NAME = "fifo"
DEFAULTS: dict[str, float] = {}
DOC = "first in, first out; hits do not reorder"


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
    pass


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
