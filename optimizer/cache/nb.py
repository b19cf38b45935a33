"""The shared tier loop (numba): look up, admit, evict until it fits, insert.

Policies only provide primitives (``hit_nb``, ``insert_nb``, ``evict_nb``, ``remove_nb`` in
``kvtier.cache.policies``); capacity rules live here, once. A tier's state is the tuple
built by :func:`kvtier.cache.state.TierState.arrays`::

    (meta, fmeta, blk, prio, stamp, heap, hpos, cost)

Nothing here checks bounds: the Python wrappers check every block id and array before a call.
Capacities are in blocks and every block has size 1.

Performance notes (measured on the 2-core VM, see docs/benchmarks.md): every cache kernel is
compiled with ``_nrt=False`` because none of them allocates, and with numba's reference counting
on, the incref/decref of the eleven state arrays at each primitive call made an access about ten
times slower. The batch kernels branch on the policy once and inline a loop specialised to it
(``_replay_loop_nb(LRU, ...)``), so LLVM drops the other policies' code from the hot loop;
dispatching per access cost another factor of about three. Flat LRU and FIFO replays from an
empty tier do not come here: :mod:`kvtier.cache.ring` runs them without link rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtier.cache.enums import (
    FIFO,
    GDSF,
    L_WHERE,
    LFU,
    LRU,
    M_CAPACITY,
    M_CLOCK,
    M_N_EVICTIONS,
    M_POLICY,
    M_SIZE,
    NIL,
    PREFIX,
    S3FIFO,
    SIEVE,
    W_MAIN,
    W_SMALL,
)
from kvtier.cache.policies import fifo, gdsf, lfu, lru, s3fifo, sieve


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def contains_nb(
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
    """Is block ``b`` resident? Changes nothing (a ghost entry is not residency)."""
    w = blk[b, L_WHERE]
    return w == W_MAIN or w == W_SMALL  # noqa: SIM109 - two compares, no tuple, in numba


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _hit_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    pol: int,
    b: int,
) -> None:
    if pol == LRU:
        lru.hit_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    elif pol == FIFO:
        fifo.hit_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    elif pol == LFU:
        lfu.hit_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    elif pol == S3FIFO:
        s3fifo.hit_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    elif pol == SIEVE:
        sieve.hit_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    else:
        gdsf.hit_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _evict_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    pol: int,
) -> int:
    if pol == LRU:
        return lru.evict_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost)
    elif pol == FIFO:
        return fifo.evict_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost)
    elif pol == LFU:
        return lfu.evict_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost)
    elif pol == S3FIFO:
        return s3fifo.evict_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost)
    elif pol == SIEVE:
        return sieve.evict_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost)
    return gdsf.evict_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _insert_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    pol: int,
    b: int,
    ghost_hit: int,
) -> bool:
    if pol == LRU:
        return lru.insert_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    elif pol == FIFO:
        return fifo.insert_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    elif pol == LFU:
        return lfu.insert_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    elif pol == S3FIFO:
        return s3fifo.insert_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b, ghost_hit)
    elif pol == SIEVE:
        return sieve.insert_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    return gdsf.insert_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _access_nb(
    pol: int,
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    b: int,
) -> tuple[bool, int]:
    """Access block ``b``: a hit updates the policy, a miss admits it.

    Returns ``(hit, evicted)``: ``evicted`` is the block that left the tier to make room
    (NIL if none; with unit-size blocks at most one leaves per access), which a caller with a
    tier below uses for write-back. Under GDSF the evicted block can be ``b`` itself: it was
    admitted and lost to every resident block.
    """
    meta[M_CLOCK] += 1
    if contains_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b):
        _hit_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, pol, b)
        return True, NIL
    ghost_hit = 0
    if pol == S3FIFO:
        ghost_hit = s3fifo.ghost_check_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
        if not s3fifo.can_admit_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost):
            return False, NIL
    if meta[M_CAPACITY] < 1:
        return False, NIL
    victim = NIL
    if pol == GDSF:
        # GreedyDual admits first and then evicts the minimum, which may be the new block
        # itself (libCacheSim GDSF_get).
        gdsf.insert_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
        meta[M_SIZE] += 1
        while meta[M_SIZE] > meta[M_CAPACITY]:
            victim = gdsf.evict_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost)
            meta[M_SIZE] -= 1
            meta[M_N_EVICTIONS] += 1
        return False, victim
    while meta[M_SIZE] + 1 > meta[M_CAPACITY]:
        v = _evict_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, pol)
        if v != NIL:
            victim = v
            meta[M_SIZE] -= 1
            meta[M_N_EVICTIONS] += 1
    if _insert_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, pol, b, ghost_hit):
        meta[M_SIZE] += 1
    return False, victim


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
) -> bool:
    """Drop block ``b`` from the tier (and from S3-FIFO's ghost); True if it was resident."""
    pol = meta[M_POLICY]
    resident = contains_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    if pol == S3FIFO:
        s3fifo.remove_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    elif resident:
        if pol == LRU:
            lru.remove_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
        elif pol == FIFO:
            fifo.remove_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
        elif pol == LFU:
            lfu.remove_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
        elif pol == SIEVE:
            sieve.remove_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
        else:
            gdsf.remove_nb(meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)
    if resident:
        meta[M_SIZE] -= 1
    return resident


@njit(cache=True, nogil=True, _nrt=False)
def access_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    b: int,
) -> tuple[bool, int]:
    """Access block ``b``: a hit updates the policy, a miss admits it.

    Returns ``(hit, evicted)``: ``evicted`` is the block that left the tier to make room
    (NIL if none; with unit-size blocks at most one leaves per access), which a caller with a
    tier below uses for write-back. Under GDSF the evicted block can be ``b`` itself: it was
    admitted and lost to every resident block.
    """
    return _access_nb(meta[M_POLICY], meta, fmeta, blk, prio, stamp, heap, hpos, cost, b)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _replay_loop_nb(
    pol: int,
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    offsets: np.ndarray,
    ids: np.ndarray,
    semantics: int,
    hits_out: np.ndarray,
) -> None:
    n = len(offsets) - 1
    for r in range(n):
        lo = offsets[r]
        hi = offsets[r + 1]
        h = 0
        if semantics == PREFIX:
            while lo + h < hi and contains_nb(
                meta, fmeta, blk, prio, stamp, heap, hpos, cost, ids[lo + h]
            ):
                h += 1
            for j in range(hi - 1, lo - 1, -1):
                _access_nb(pol, meta, fmeta, blk, prio, stamp, heap, hpos, cost, ids[j])
        else:
            for j in range(lo, hi):
                hit, _ = _access_nb(pol, meta, fmeta, blk, prio, stamp, heap, hpos, cost, ids[j])
                if hit:
                    h += 1
        hits_out[r] = h


@njit(cache=True, nogil=True, _nrt=False)
def replay_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    offsets: np.ndarray,
    ids: np.ndarray,
    semantics: int,
    hits_out: np.ndarray,
) -> None:
    """Replay requests ``offsets``/``ids`` (CSR) through one tier; hit blocks per request.

    PREFIX: the hits of a request are its longest run of resident blocks from block 0, looked
    up before anything changes; then every block is accessed from the last to the first, so a
    prefix is touched last and outlives its tail under recency policies. FLAT: each block is
    accessed in prompt order and every hit counts. The policy is fixed per call, so each
    branch below inlines a loop specialised to one policy.
    """
    pol = meta[M_POLICY]
    if pol == LRU:
        _replay_loop_nb(
            LRU,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            offsets,
            ids,
            semantics,
            hits_out,
        )
    elif pol == FIFO:
        _replay_loop_nb(
            FIFO,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            offsets,
            ids,
            semantics,
            hits_out,
        )
    elif pol == LFU:
        _replay_loop_nb(
            LFU,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            offsets,
            ids,
            semantics,
            hits_out,
        )
    elif pol == S3FIFO:
        _replay_loop_nb(
            S3FIFO,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            offsets,
            ids,
            semantics,
            hits_out,
        )
    elif pol == SIEVE:
        _replay_loop_nb(
            SIEVE,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            offsets,
            ids,
            semantics,
            hits_out,
        )
    else:
        _replay_loop_nb(
            GDSF,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            offsets,
            ids,
            semantics,
            hits_out,
        )


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _access_many_loop_nb(
    pol: int,
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    ids: np.ndarray,
    hit_out: np.ndarray,
    evicted_out: np.ndarray,
) -> None:
    for j in range(len(ids)):
        hit, v = _access_nb(pol, meta, fmeta, blk, prio, stamp, heap, hpos, cost, ids[j])
        hit_out[j] = hit
        evicted_out[j] = v


@njit(cache=True, nogil=True, _nrt=False)
def access_many_nb(
    meta: np.ndarray,
    fmeta: np.ndarray,
    blk: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    cost: np.ndarray,
    ids: np.ndarray,
    hit_out: np.ndarray,
    evicted_out: np.ndarray,
) -> None:
    """Access ``ids`` in order (flat), recording each hit flag and evicted block."""
    pol = meta[M_POLICY]
    if pol == LRU:
        _access_many_loop_nb(
            LRU,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            ids,
            hit_out,
            evicted_out,
        )
    elif pol == FIFO:
        _access_many_loop_nb(
            FIFO,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            ids,
            hit_out,
            evicted_out,
        )
    elif pol == LFU:
        _access_many_loop_nb(
            LFU,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            ids,
            hit_out,
            evicted_out,
        )
    elif pol == S3FIFO:
        _access_many_loop_nb(
            S3FIFO,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            ids,
            hit_out,
            evicted_out,
        )
    elif pol == SIEVE:
        _access_many_loop_nb(
            SIEVE,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            ids,
            hit_out,
            evicted_out,
        )
    else:
        _access_many_loop_nb(
            GDSF,
            meta,
            fmeta,
            blk,
            prio,
            stamp,
            heap,
            hpos,
            cost,
            ids,
            hit_out,
            evicted_out,
        )
