"""Sieve: a FIFO queue with a visited bit and a hand that sweeps from old to new.

Semantics (libCacheSim ``Sieve.c``): a miss inserts the block at the head with its visited bit
clear; a hit sets the bit. To evict, the hand starts where it stopped last time (at the tail
the first time, or after it ran past the head), clears set bits while moving toward the head
(wrapping to the tail), and evicts the first block whose bit is clear; the hand then rests on
that block's newer neighbour (none if it was the head, which means "start at the tail"). Removing
the block under the hand moves the hand to its newer neighbour. No parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import L_FREQ, L_PRV, L_WHERE, M_HAND, M_HEAD, M_TAIL, NIL, W_ABSENT, W_MAIN
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
    blk = tier.blk
    blk[b, L_FREQ] = 1


@njit(cache=True, nogil=True, _nrt=False)
def insert_nb(tier: TierArrays, b: int, flag: int) -> bool:
    meta, blk = tier.meta, tier.blk
    blk[b, L_WHERE] = W_MAIN
    blk[b, L_FREQ] = 0
    push_head_nb(meta, M_HEAD, M_TAIL, blk, b)
    return True


@njit(cache=True, nogil=True, _nrt=False)
def evict_nb(tier: TierArrays) -> int:
    meta, blk = tier.meta, tier.blk
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
def remove_nb(tier: TierArrays, b: int) -> None:
    meta, blk = tier.meta, tier.blk
    if meta[M_HAND] == b:
        meta[M_HAND] = blk[b, L_PRV]
    unlink_nb(meta, M_HEAD, M_TAIL, blk, b)
    blk[b, L_WHERE] = W_ABSENT
    blk[b, L_FREQ] = 0


class Reference(ReferenceBase):
    """``queue`` from oldest (index 0) to newest; the hand walks toward newer blocks."""

    def __init__(self, params: Mapping[str, float], capacity: int, cost: Any) -> None:
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
