"""The shared tier loop (numba): look up, admit, evict until it fits, insert.

Policies only provide primitives (``hit_nb``, ``insert_nb``, ``evict_nb``, ``remove_nb`` in
``optimizer.sim.cache.policies``); capacity rules live here, once. A tier's state is the tuple
built by :func:`optimizer.sim.cache.state.TierState.arrays`::

    (meta, fmeta, where, prv, nxt, freq, prio, stamp, heap, hpos, cost)

Nothing here checks bounds: the Python wrappers check every block id and array before a call.
Capacities are in blocks and every block has size 1.
"""

from __future__ import annotations

from numba import njit

from optimizer.sim.cache.enums import (
    FIFO,
    GDSF,
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
from optimizer.sim.cache.policies import fifo, gdsf, lfu, lru, s3fifo, sieve


@njit(cache=True, nogil=True)
def contains_nb(st, b):  # noqa: ANN001, ANN201
    """Is block ``b`` resident? Changes nothing (a ghost entry is not residency)."""
    w = st[2][b]
    return w == W_MAIN or w == W_SMALL  # noqa: SIM109 - two compares, no tuple, in numba


@njit(cache=True, nogil=True)
def _hit_nb(st, pol, b):  # noqa: ANN001, ANN201
    if pol == LRU:
        lru.hit_nb(st, b)
    elif pol == FIFO:
        fifo.hit_nb(st, b)
    elif pol == LFU:
        lfu.hit_nb(st, b)
    elif pol == S3FIFO:
        s3fifo.hit_nb(st, b)
    elif pol == SIEVE:
        sieve.hit_nb(st, b)
    else:
        gdsf.hit_nb(st, b)


@njit(cache=True, nogil=True)
def _evict_nb(st, pol):  # noqa: ANN001, ANN201
    if pol == LRU:
        return lru.evict_nb(st)
    elif pol == FIFO:
        return fifo.evict_nb(st)
    elif pol == LFU:
        return lfu.evict_nb(st)
    elif pol == S3FIFO:
        return s3fifo.evict_nb(st)
    elif pol == SIEVE:
        return sieve.evict_nb(st)
    return gdsf.evict_nb(st)


@njit(cache=True, nogil=True)
def _insert_nb(st, pol, b, ghost_hit):  # noqa: ANN001, ANN201
    if pol == LRU:
        return lru.insert_nb(st, b)
    elif pol == FIFO:
        return fifo.insert_nb(st, b)
    elif pol == LFU:
        return lfu.insert_nb(st, b)
    elif pol == S3FIFO:
        return s3fifo.insert_nb(st, b, ghost_hit)
    elif pol == SIEVE:
        return sieve.insert_nb(st, b)
    return gdsf.insert_nb(st, b)


@njit(cache=True, nogil=True)
def access_nb(st, b):  # noqa: ANN001, ANN201
    """Access block ``b``: a hit updates the policy, a miss admits it.

    Returns ``(hit, evicted)``: ``evicted`` is the block that left the tier to make room
    (NIL if none; with unit-size blocks at most one leaves per access), which a caller with a
    tier below uses for write-back. Under GDSF the evicted block can be ``b`` itself: it was
    admitted and lost to every resident block.
    """
    meta = st[0]
    pol = meta[M_POLICY]
    meta[M_CLOCK] += 1
    if contains_nb(st, b):
        _hit_nb(st, pol, b)
        return True, NIL
    ghost_hit = 0
    if pol == S3FIFO:
        ghost_hit = s3fifo.ghost_check_nb(st, b)
        if not s3fifo.can_admit_nb(st):
            return False, NIL
    if meta[M_CAPACITY] < 1:
        return False, NIL
    victim = NIL
    if pol == GDSF:
        # GreedyDual admits first and then evicts the minimum, which may be the new block
        # itself (libCacheSim GDSF_get).
        gdsf.insert_nb(st, b)
        meta[M_SIZE] += 1
        while meta[M_SIZE] > meta[M_CAPACITY]:
            victim = gdsf.evict_nb(st)
            meta[M_SIZE] -= 1
            meta[M_N_EVICTIONS] += 1
        return False, victim
    while meta[M_SIZE] + 1 > meta[M_CAPACITY]:
        v = _evict_nb(st, pol)
        if v != NIL:
            victim = v
            meta[M_SIZE] -= 1
            meta[M_N_EVICTIONS] += 1
    if _insert_nb(st, pol, b, ghost_hit):
        meta[M_SIZE] += 1
    return False, victim


@njit(cache=True, nogil=True)
def remove_nb(st, b):  # noqa: ANN001, ANN201
    """Drop block ``b`` from the tier (and from S3-FIFO's ghost); True if it was resident."""
    meta = st[0]
    pol = meta[M_POLICY]
    resident = contains_nb(st, b)
    if pol == S3FIFO:
        s3fifo.remove_nb(st, b)
    elif resident:
        if pol == LRU:
            lru.remove_nb(st, b)
        elif pol == FIFO:
            fifo.remove_nb(st, b)
        elif pol == LFU:
            lfu.remove_nb(st, b)
        elif pol == SIEVE:
            sieve.remove_nb(st, b)
        else:
            gdsf.remove_nb(st, b)
    if resident:
        meta[M_SIZE] -= 1
    return resident


@njit(cache=True, nogil=True)
def replay_nb(st, offsets, ids, semantics, hits_out):  # noqa: ANN001, ANN201
    """Replay requests ``offsets``/``ids`` (CSR) through one tier; hit blocks per request.

    PREFIX: the hits of a request are its longest run of resident blocks from block 0, looked
    up before anything changes; then every block is accessed from the last to the first, so a
    prefix is touched last and outlives its tail under recency policies. FLAT: each block is
    accessed in prompt order and every hit counts.
    """
    n = len(offsets) - 1
    for r in range(n):
        lo = offsets[r]
        hi = offsets[r + 1]
        h = 0
        if semantics == PREFIX:
            while lo + h < hi and contains_nb(st, ids[lo + h]):
                h += 1
            for j in range(hi - 1, lo - 1, -1):
                access_nb(st, ids[j])
        else:
            for j in range(lo, hi):
                hit, _ = access_nb(st, ids[j])
                if hit:
                    h += 1
        hits_out[r] = h


@njit(cache=True, nogil=True)
def access_many_nb(st, ids, hit_out, evicted_out):  # noqa: ANN001, ANN201
    """Access ``ids`` in order (flat), recording each hit flag and evicted block."""
    for j in range(len(ids)):
        hit, v = access_nb(st, ids[j])
        hit_out[j] = hit
        evicted_out[j] = v
