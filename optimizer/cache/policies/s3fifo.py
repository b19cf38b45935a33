"""S3-FIFO: a small probationary FIFO, a main FIFO with a 2-bit clock, and a ghost FIFO.

Semantics (libCacheSim ``S3FIFO.c``, the December 2024 version that the ``libcachesim`` 0.3
wheels build). With capacity ``C`` blocks: small FIFO ``S = int(C * small)``, main FIFO
``M = C - S``, ghost FIFO ``G = int(C * ghost)`` ids (float products truncated, as in C).

- Hit (block in small or main): its counter ``freq`` goes up by 1 (not capped here).
- Miss: if the id is in the ghost, it leaves the ghost and the block goes to main. Otherwise it
  goes to small, except that before the first eviction a full small FIFO sends new blocks to
  main. A block is admitted only if ``S >= 1``; libCacheSim also refuses to put a block into
  small unless ``1 < S`` (``obj_size >= small size`` returns without inserting, after making
  room), so with ``S <= 1`` only ghost hits could be admitted and the cache stays empty: the
  smallest useful capacity at ``small=0.1`` is 20 blocks. kvtier keeps this for parity.
- Inserted blocks start with ``freq = 0``.
- Evict (until ``small + main`` fits): if main holds more than ``M`` blocks or small is empty,
  take main's tail: with ``freq >= 1`` it goes back to main's head with
  ``freq = min(freq, 3) - 1``, else it is evicted. Otherwise take small's tail: with
  ``freq >= threshold`` it moves to main's head (``freq = 0``), else it is evicted and its id
  enters the ghost head (the ghost drops its own tail when it holds ``G`` ids); repeat until one
  block left small as an eviction or small is empty.

Parameters: ``small`` (0.1), ``ghost`` (0.9), ``threshold`` (2): libCacheSim's defaults.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import (
    L_FREQ,
    L_WHERE,
    M_GHEAD,
    M_GHOST_CAP,
    M_GTAIL,
    M_HAS_EVICTED,
    M_HEAD,
    M_MAIN_CAP,
    M_N_GHOST,
    M_N_MAIN,
    M_N_SMALL,
    M_SHEAD,
    M_SMALL_CAP,
    M_STAIL,
    M_TAIL,
    M_THRESHOLD,
    NIL,
    W_ABSENT,
    W_GHOST,
    W_MAIN,
    W_SMALL,
)
from kvtier.cache.lists import push_head_nb, unlink_nb
from kvtier.cache.nb_state import TierArrays
from kvtier.cache.policies.base import ReferenceBase
from kvtier.errors import InputError

# Read by numba as compile-time constants (kvtier.cache.hooks) and by the tier's setup.
ADMIT_FIRST = False  # admit a missed block first, then evict while over capacity
REMOVE_ABSENT = True  # remove_nb runs for a block that is not resident too
USES_HEAP = False  # keeps the priority heap (prio, stamp, heap, hpos per block)
USES_COST = False  # reads the per-block recompute cost


MAX_GHOST = 1e3  # ghost ids per cached block (libCacheSim's default: 0.9)
MAX_THRESHOLD = 1 << 30


def sizes(capacity: int, small: float, ghost: float) -> tuple[int, int, int]:
    """(small, main, ghost) sizes in blocks, computed as libCacheSim's ``S3FIFO_init`` does."""
    s = int(capacity * small)
    return s, capacity - s, int(capacity * ghost)


def check(params: Mapping[str, float]) -> None:
    """Refuse parameters libCacheSim would not run with."""
    if not 0.0 <= params["small"] < 1.0:
        raise InputError(f"s3fifo: 0 <= small < 1 must hold, but got small={params['small']}")
    # Upper bounds keep the sizes within the 64-bit counts the kernels hold (NaN fails each).
    if not 0.0 <= params["ghost"] <= MAX_GHOST:
        raise InputError(
            f"s3fifo: 0 <= ghost <= {MAX_GHOST:g} must hold, but got ghost={params['ghost']}"
        )
    t = params["threshold"]
    if not (1 <= t <= MAX_THRESHOLD and t == int(t)):
        raise InputError(
            f"s3fifo: threshold must be an integer in [1, 2^30], but got threshold={t}"
        )


def configure(meta: np.ndarray, params: Mapping[str, float], capacity: int) -> None:
    """FIFO sizes and the move-to-main threshold into the tier's ``meta`` slots."""
    s, m, g = sizes(capacity, params["small"], params["ghost"])
    meta[M_SMALL_CAP] = s
    meta[M_MAIN_CAP] = m
    meta[M_GHOST_CAP] = g
    meta[M_THRESHOLD] = int(params["threshold"])


@njit(cache=True, nogil=True, _nrt=False)
def hit_nb(tier: TierArrays, b: int) -> None:
    blk = tier.blk
    blk[b, L_FREQ] += 1


@njit(cache=True, nogil=True, _nrt=False)
def ghost_check_nb(tier: TierArrays, b: int) -> int:
    """On a miss: drop ``b`` from the ghost; return 1 if it was there (then it goes to main)."""
    meta, blk = tier.meta, tier.blk
    if blk[b, L_WHERE] == W_GHOST:
        unlink_nb(meta, M_GHEAD, M_GTAIL, blk, b)
        meta[M_N_GHOST] -= 1
        blk[b, L_WHERE] = W_ABSENT
        return 1
    return 0


@njit(cache=True, nogil=True, _nrt=False)
def can_admit_nb(tier: TierArrays) -> bool:
    meta = tier.meta
    return meta[M_SMALL_CAP] >= 1


@njit(cache=True, nogil=True, _nrt=False)
def admit_nb(tier: TierArrays, b: int) -> int:
    """On a miss: -1 when no block can enter (no small FIFO), else 1 for a ghost hit (the block
    goes to main), 0 otherwise. The ghost entry is dropped either way."""
    ghost_hit = ghost_check_nb(tier, b)
    if not can_admit_nb(tier):
        return -1
    return ghost_hit


@njit(cache=True, nogil=True, _nrt=False)
def insert_nb(tier: TierArrays, b: int, flag: int) -> bool:
    meta, blk = tier.meta, tier.blk
    ghost_hit = flag
    if ghost_hit == 0:
        if meta[M_SMALL_CAP] <= 1:
            return False
        if meta[M_HAS_EVICTED] == 0 and meta[M_N_SMALL] >= meta[M_SMALL_CAP]:
            ghost_hit = 1  # before the first eviction a full small FIFO sends blocks to main
    if ghost_hit != 0:
        push_head_nb(meta, M_HEAD, M_TAIL, blk, b)
        blk[b, L_WHERE] = W_MAIN
        meta[M_N_MAIN] += 1
    else:
        push_head_nb(meta, M_SHEAD, M_STAIL, blk, b)
        blk[b, L_WHERE] = W_SMALL
        meta[M_N_SMALL] += 1
    blk[b, L_FREQ] = 0
    return True


@njit(cache=True, nogil=True, _nrt=False)
def _ghost_add_nb(tier: TierArrays, b: int) -> None:
    meta, blk = tier.meta, tier.blk
    if meta[M_GHOST_CAP] <= 0:
        blk[b, L_WHERE] = W_ABSENT
        return
    while meta[M_N_GHOST] + 1 > meta[M_GHOST_CAP]:
        g = meta[M_GTAIL]
        unlink_nb(meta, M_GHEAD, M_GTAIL, blk, g)
        blk[g, L_WHERE] = W_ABSENT
        meta[M_N_GHOST] -= 1
    push_head_nb(meta, M_GHEAD, M_GTAIL, blk, b)
    blk[b, L_WHERE] = W_GHOST
    meta[M_N_GHOST] += 1


@njit(cache=True, nogil=True, _nrt=False)
def _evict_main_nb(tier: TierArrays) -> int:
    meta, blk = tier.meta, tier.blk
    while meta[M_N_MAIN] > 0:
        v = meta[M_TAIL]
        unlink_nb(meta, M_HEAD, M_TAIL, blk, v)
        f = blk[v, L_FREQ]
        if f >= 1:
            push_head_nb(meta, M_HEAD, M_TAIL, blk, v)
            blk[v, L_FREQ] = min(f, 3) - 1
        else:
            meta[M_N_MAIN] -= 1
            blk[v, L_WHERE] = W_ABSENT
            return v
    return NIL


@njit(cache=True, nogil=True, _nrt=False)
def _evict_small_nb(tier: TierArrays) -> int:
    meta, blk = tier.meta, tier.blk
    while meta[M_N_SMALL] > 0:
        v = meta[M_STAIL]
        unlink_nb(meta, M_SHEAD, M_STAIL, blk, v)
        meta[M_N_SMALL] -= 1
        if blk[v, L_FREQ] >= meta[M_THRESHOLD]:
            push_head_nb(meta, M_HEAD, M_TAIL, blk, v)
            blk[v, L_WHERE] = W_MAIN
            meta[M_N_MAIN] += 1
            blk[v, L_FREQ] = 0
        else:
            blk[v, L_FREQ] = 0
            _ghost_add_nb(tier, v)
            return v
    return NIL


@njit(cache=True, nogil=True, _nrt=False)
def evict_nb(tier: TierArrays) -> int:
    """One eviction step; returns the evicted block, or NIL if small emptied into main."""
    meta = tier.meta
    meta[M_HAS_EVICTED] = 1
    if meta[M_N_MAIN] > meta[M_MAIN_CAP] or meta[M_N_SMALL] == 0:
        return _evict_main_nb(tier)
    return _evict_small_nb(tier)


@njit(cache=True, nogil=True, _nrt=False)
def remove_nb(tier: TierArrays, b: int) -> None:
    meta, blk = tier.meta, tier.blk
    w = blk[b, L_WHERE]
    if w == W_SMALL:
        unlink_nb(meta, M_SHEAD, M_STAIL, blk, b)
        meta[M_N_SMALL] -= 1
    elif w == W_MAIN:
        unlink_nb(meta, M_HEAD, M_TAIL, blk, b)
        meta[M_N_MAIN] -= 1
    elif w == W_GHOST:
        unlink_nb(meta, M_GHEAD, M_GTAIL, blk, b)
        meta[M_N_GHOST] -= 1
    blk[b, L_WHERE] = W_ABSENT
    blk[b, L_FREQ] = 0


class Reference(ReferenceBase):
    """Small and main FIFOs (oldest first) with counters, and a ghost FIFO of ids."""

    def __init__(self, params: Mapping[str, float], capacity: int, cost: Any) -> None:
        self.small_cap, self.main_cap, self.ghost_cap = sizes(
            capacity, params["small"], params["ghost"]
        )
        self.threshold = int(params["threshold"])
        self.small: list[int] = []
        self.main: list[int] = []
        self.ghost: OrderedDict[int, None] = OrderedDict()  # oldest first
        self.freq: dict[int, int] = {}
        self.has_evicted = False

    def contains(self, b: int) -> bool:
        return b in self.freq

    def hit(self, b: int) -> None:
        self.freq[b] += 1

    def admit(self, b: int) -> int:
        """On a miss: a ghost id leaves the ghost (the block will go to main); nothing enters
        without a small FIFO."""
        ghost_hit = self.ghost.pop(b, False) is None
        return -1 if self.small_cap < 1 else int(ghost_hit)

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
