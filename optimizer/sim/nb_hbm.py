"""The HBM pools' primitives in the numba engine: slot records, free rings, the prefix-cache map.

Each runs once per request's run of blocks (taking, registering and releasing slots;
look-ups) and is handed the pools' tuple (:class:`kvtier.sim.nb_state.HbmPools`), the run's
bounds (:class:`Run`) and the few other arrays it uses; see :mod:`kvtier.sim.nb` for the layout
(slot records, the per-instance free ring and the map) and why indices are unsigned.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.prefetch import prefetch
from kvtier.sim.nb_state import INNER, HbmPools, InstanceState, Requests

# Fields of a slot record in ``sl`` (int32, 4 per slot, one cache line holds 4 slots): every
# pool operation on a slot touches one record instead of several arrays. POS is the slot's
# index in its instance's free ring while it is free (-1 while pinned); BLOCK the block it
# caches (-1: none, an anonymous slot); MAP the block's map index while the map names this
# slot (-1 otherwise: no block, or a block read only once).
POS, MAP, REF, BLOCK = 0, 1, 2, 3
# BLOCK of a slot holding a full block of generated tokens: cached (released to the ring's tail)
# under a hash no prompt names, so never looked up, never evicted into a lower tier
# (:func:`hbm_cache_generated_nb`)
GENERATED = -2
# Entries between prefetching a slot record (ring or request order) and using it: far enough
# for a miss to arrive meanwhile. The ring (2 * capacity + AHEAD entries) is longer than AHEAD,
# which the allocation loop's wrap of ``r + AHEAD`` relies on.
AHEAD = 16
# An index numba takes as is (no wrap-around of negative values): see the module docstring.
u64 = np.uint64


class Run(NamedTuple):
    """A request's run of slots, ``slots[so + j0:so + j1]`` (its blocks ``j0:j1``)."""

    so: int
    j0: int
    j1: int


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_compact_nb(
    sl: np.ndarray, ring: np.ndarray, rh: np.ndarray, rn: np.ndarray, k: int, R: int
) -> None:
    """Drop the stale entries of instance ``k``'s full free ring, keeping the order.

    At most ``capacity`` entries are live (one per free slot) and the ring has room for
    ``2 * capacity + AHEAD``, so a compaction frees more than half the ring: its cost is
    amortised over at least as many pushes. It is rare (stale entries come only from pinning
    free slots that hold a cached block), so it is a call of its own, off the hot loops.
    """
    o = k * R
    e = ring.shape[0] - R  # scratch area after the last instance's ring
    h = rh[k]
    m = 0
    for t in range(rn[k]):
        r = h + t
        if r >= R:
            r -= R
        s = ring[o + r]
        if sl[4 * s + POS] == r:
            ring[e + m] = s
            m += 1
    for t in range(m):
        s = ring[e + t]
        ring[o + t] = s
        sl[4 * s + POS] = t
    rh[k] = 0
    rn[k] = m


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_lookup_nb(
    slot_of: np.ndarray, base: int, shared: np.ndarray, start: int, cap: int, found: np.ndarray,
    sw_off: int, need: int,
) -> int:  # fmt: skip
    """Leading blocks of references ``start:start+cap`` cached in the map at offset ``base``.

    Their slots go to ``found[0:h]`` (room for the longest prompt), saving a second look-up.
    A block read only once (``shared`` -1) is never cached for another request: a miss. With
    ``need`` > 0 (sliding-window layers, vLLM's hybrid manager) the hit is cut back to the
    longest prefix whose last ``need`` blocks' sliding-window copies are in the map at offset
    ``base + sw_off`` (a run from block 0 shorter than ``need`` counts): the reference's
    ``HbmPool.lookup``.
    """
    h = 0
    while h < cap:
        m = shared[u64(start + h)]
        if m < 0:
            break
        s1 = slot_of[u64(base + m)]
        if s1 == 0:
            break
        found[u64(h)] = s1 - 1
        h += 1
    if need == 0:
        return h
    run = 0
    for i in range(h - 1, -1, -1):
        if slot_of[u64(base + sw_off + shared[u64(start + i)])] != 0:
            run += 1
            if run >= need:
                return i + run
        else:
            run = 0
    return run


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_take_nb(
    pool: HbmPools, evbuf: np.ndarray, o: int, R: int, base: int, run: Run, r: int, left: int
) -> tuple[int, int, int]:
    """Take the slots of ``run`` from the head of the free ring at ``pool.rings[o:o + R]``.

    ``r`` is the ring's head and ``left`` its entry count; stale entries (free slots a request
    has pinned since) are skipped. A block cached in a taken slot is evicted: its map entry
    (map offset ``base``) is cleared and its id goes to ``evbuf``. Returns the new head, the
    new entry count and the number of evicted blocks. The records of later entries are
    prefetched so that their misses overlap. (Clearing a map entry is a store, which does not
    wait for its line; prefetching those entries too, which needs the record of a slot taken
    later, made replays slower.)
    """
    sl = pool.records
    ring = pool.rings
    slot_of = pool.slot_of
    slots = pool.slots
    so = run.so
    ne = 0
    for j in range(run.j0, run.j1):
        while True:
            t = r + AHEAD
            if t >= R:
                t -= R
            prefetch(sl, 4 * ring[u64(o + t)])
            s = ring[u64(o + r)]
            live = sl[u64(4 * s + POS)] == r
            r += 1
            if r == R:
                r = 0
            left -= 1
            if live:
                break
        sl[u64(4 * s + POS)] = -1
        old = sl[u64(4 * s + BLOCK)]
        if old != -1:
            mo = sl[u64(4 * s + MAP)]
            if mo >= 0:
                slot_of[u64(base + mo)] = 0
                sl[u64(4 * s + MAP)] = -1
            sl[u64(4 * s + BLOCK)] = -1
            if old >= 0:  # a generated block goes nowhere
                evbuf[u64(ne)] = old
                ne += 1
        sl[u64(4 * s + REF)] = 1
        slots[u64(so + j)] = s
    return r, left, ne


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_register_nb(
    pool: HbmPools, rq: Requests, base: int, ref0: int, run: Run, wbuf: np.ndarray, nw: int,
    w_from: int,
) -> int:  # fmt: skip
    """Cache a request's newly computed blocks ``run.j0:run.j1`` in their slots.

    Block ``j`` is reference ``ref0 + j`` and sits in slot ``slots[run.so + j]``. A block read
    more than once goes into the map (offset ``base``) unless another slot already holds it
    (then this slot stays anonymous); a block read once is only recorded in its slot. Blocks
    from ``w_from`` on are appended to ``wbuf`` for the lower tiers; returns the new length.
    """
    sl = pool.records
    slot_of = pool.slot_of
    slots = pool.slots
    block_ids = rq.block_ids
    shared = rq.shared
    slot0 = run.so
    for j in range(run.j0, run.j1):
        b = block_ids[u64(ref0 + j)]
        mi = shared[u64(ref0 + j)]
        if mi < 0:  # read by no other request: cached, never looked up
            sl[u64(4 * slots[u64(slot0 + j)] + BLOCK)] = b
        elif slot_of[u64(base + mi)] == 0:
            s = slots[u64(slot0 + j)]
            slot_of[u64(base + mi)] = s + 1
            sl[u64(4 * s + BLOCK)] = b
            sl[u64(4 * s + MAP)] = mi
        if j >= w_from:
            wbuf[u64(nw)] = b
            nw += 1
    return nw


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_cache_generated_nb(sl: np.ndarray, slots: np.ndarray, j0: int, j1: int) -> None:
    """Mark a finished request's full blocks of generated tokens, ``slots[j0:j1]``, cached.

    vLLM V1 hashes and caches them as it does a prompt's (``Request.append_output_token_ids``
    extends ``block_hashes``; ``KVCacheManager.allocate_slots`` caches up to
    ``request.num_tokens``), so when the request ends they join the free ring's tail, where an
    anonymous slot would go to its head (the reference's ``HbmPool.cache_generated``)."""
    for j in range(j0, j1):
        s = slots[u64(j)]
        if sl[u64(4 * s + BLOCK)] == -1:
            sl[u64(4 * s + BLOCK)] = GENERATED


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_release_nb(
    pool: HbmPools, rh: np.ndarray, rn: np.ndarray, free_len: np.ndarray, k: int, R: int,
    j0: int, j1: int,
) -> None:  # fmt: skip
    """Unpin a finished request's slots ``slots[j0:j1]`` on instance ``k``, tail-first.

    A slot no longer pinned joins the free ring: at the tail if it caches a block (the least
    recently used are taken first), at the head if it is anonymous (reused before any cached
    block is evicted).
    """
    sl = pool.records
    ring = pool.rings
    slots = pool.slots
    head = rh[k]
    count = rn[k]
    free = free_len[k]
    o = k * R
    for j in range(j1 - 1, j0 - 1, -1):
        if j - AHEAD >= j0:
            prefetch(sl, 4 * slots[u64(j - AHEAD)])
        s = slots[u64(j)]
        c = sl[u64(4 * s + REF)] - 1
        sl[u64(4 * s + REF)] = c
        if c == 0:
            free += 1
            if count == R:
                rh[k] = head
                rn[k] = count
                hbm_compact_nb(sl, ring, rh, rn, k, R)
                head = rh[k]
                count = rn[k]
            if sl[u64(4 * s + BLOCK)] == -1:  # anonymous: to the head
                head -= 1
                if head < 0:
                    head += R
                r = head
            else:  # to the tail
                r = head + count
                if r >= R:
                    r -= R
            ring[u64(o + r)] = s
            sl[u64(4 * s + POS)] = r
            count += 1
    rh[k] = head
    rn[k] = count
    free_len[k] = free


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_churn_nb(
    pool: HbmPools, ist: InstanceState, evbuf: np.ndarray, k: int, R: int, base: int, n: int,
    name: int,
) -> int:  # fmt: skip
    """vLLM's hybrid KV cache manager: ``n`` sliding-window copies of a block left the window
    on instance ``k`` (at most one per free slot). Each takes the live slot at the free ring's
    head (evicting its block as :func:`hbm_take_nb` does: the map entry at offset ``base`` is
    cleared, a prompt block's id goes to ``evbuf``) and, cached (``GENERATED``), goes back to
    the ring's tail; the first is entered in the map at ``base + name`` unless that entry is
    set (``name`` -1: none, a generated token's block or one read once). Returns the number
    of evicted blocks (the reference's ``HbmPool.churn``). Each take drops at least one entry
    and each return adds one, so the ring never needs compacting."""
    sl = pool.records
    ring = pool.rings
    slot_of = pool.slot_of
    o = k * R
    r = ist.ring_head[k]
    left = ist.ring_count[k]
    if n > ist.free_len[k]:
        n = ist.free_len[k]
    ne = 0
    for x in range(n):
        while True:
            s = ring[u64(o + r)]
            live = sl[u64(4 * s + POS)] == r
            r += 1
            if r == R:
                r = 0
            left -= 1
            if live:
                break
        old = sl[u64(4 * s + BLOCK)]
        if old != -1:
            mo = sl[u64(4 * s + MAP)]
            if mo >= 0:
                slot_of[u64(base + mo)] = 0
                sl[u64(4 * s + MAP)] = -1
            if old >= 0:
                evbuf[u64(ne)] = old
                ne += 1
        sl[u64(4 * s + BLOCK)] = GENERATED
        if x == 0 and name >= 0 and slot_of[u64(base + name)] == 0:
            slot_of[u64(base + name)] = s + 1
            sl[u64(4 * s + MAP)] = name
        t = r + left
        if t >= R:
            t -= R
        ring[u64(o + t)] = s
        sl[u64(4 * s + POS)] = t
        left += 1
    ist.ring_head[k] = r
    ist.ring_count[k] = left
    return ne


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hbm_touch_nb(pool: HbmPools, ist: InstanceState, k: int, R: int, s: int) -> None:
    """Move free slot ``s`` of instance ``k`` to its free ring's tail (a hit touched the
    sliding-window copy it holds: the reference's ``HbmPool.touch_sw``); its old entry goes
    stale."""
    sl = pool.records
    if sl[u64(4 * s + REF)] != 0 or sl[u64(4 * s + POS)] < 0:
        return
    if ist.ring_count[k] == R:
        hbm_compact_nb(sl, pool.rings, ist.ring_head, ist.ring_count, k, R)
    t = ist.ring_head[k] + ist.ring_count[k]
    if t >= R:
        t -= R
    pool.rings[u64(k * R + t)] = s
    sl[u64(4 * s + POS)] = t
    ist.ring_count[k] += 1
