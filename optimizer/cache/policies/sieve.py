"""Sieve: a FIFO queue with a visited bit and a hand that sweeps from old to new.

Semantics (libCacheSim ``Sieve.c``): a miss inserts the block at the head with its visited bit
clear; a hit sets the bit. To evict, the hand starts where it stopped last time (at the tail
the first time, or after it ran past the head), clears set bits while moving toward the head
(wrapping to the tail), and evicts the first block whose bit is clear; the hand then rests on
that block's newer neighbour (none if it was the head, which means "start at the tail"). Removing
the block under the hand moves the hand to its newer neighbour. No parameters.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtier.cache.enums import (
    L_FREQ,
    L_PRV,
    L_WHERE,
    M_HAND,
    M_HEAD,
    M_TAIL,
    NIL,
    W_ABSENT,
    W_MAIN,
)
from kvtier.cache.lists import push_head_nb, unlink_nb

NAME = "sieve"
DEFAULTS: dict[str, float] = {}
DOC = "FIFO with a visited bit; the hand clears bits from old to new and evicts the first clear"


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
    blk[b, L_FREQ] = 1


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
    blk[b, L_FREQ] = 0
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
    v = meta[M_HAND]
    if v == NIL:
        v = meta[M_TAIL]
    while blk[v, L_FREQ] > 0:
        blk[v, L_FREQ] -= 1
        v = blk[v, L_PRV]
        if v == NIL:
            v = meta[M_TAIL]
    meta[M_HAND] = blk[v, L_PRV]
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
    if meta[M_HAND] == b:
        meta[M_HAND] = blk[b, L_PRV]
    unlink_nb(meta, M_HEAD, M_TAIL, blk, b)
    blk[b, L_WHERE] = W_ABSENT
    blk[b, L_FREQ] = 0
