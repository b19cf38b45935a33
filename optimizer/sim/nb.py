"""Numba kernels of the serving simulator: the same rules as :mod:`kvtier.sim.reference`.

Everything is flat arrays indexed by request, instance or global slot (``k * capacity + s``).
The per-instance prefix-cache map is ``slot_of[k * n_shared + shared[ref]]``, holding the slot
plus one (0 when not cached). It covers only blocks that more than one reference reads
(``BlockedTrace.shared_blocks``): a block read once is never looked up by another request, so
registering or evicting it need not touch the map (the slot still holds it, for the free
queue's order and the lower tiers). The wrapper allocates the map with ``numpy.zeros``
(calloc: lazily zeroed pages, unlike an allocation inside a kernel, which numba fills eagerly),
so a first replay pays only for the pages its instances touch. The kernel clears the entries
it set before it returns, so the wrapper keeps the map for the next replay of the same shape
instead of faulting in fresh zeroed pages each time.
The free queue of instance ``k`` is a ring of slot ids, ``ring[k * R:(k + 1) * R]`` with
``R = 2 * capacity + AHEAD`` entries (any ``R > max(capacity, AHEAD)`` is correct; a short
ring only compacts more often), read from its head: a freed slot is written at the tail (or just
before the head), and a free slot that a request pins is not moved but marked (its record's
``POS`` no longer names its ring entry), so the entry is skipped when the head reaches it; a
full ring is compacted. Allocation thus reads slot ids in sequence and can prefetch the
records of the slots it will take next, instead of walking a linked list in which each record
names the next one (a dependent miss per slot). The order of the queue is the same as that of
the reference's OrderedDict.

Most iterations of a replay are decode steps that nothing else observes: when every running
request of an instance is decoding (none prefilling or loading), the instance runs those steps
in a tight loop up to the next arrival or to the step in which the first of them finishes,
instead of as one event each. The step times are the same floats as step by step (the same
formula on the same integer sums, added in the same order), and meanwhile nothing another
instance or the router reads changes; admission, if its queue is blocked, stays blocked until a
finish. An early stop in the middle takes back the steps begun after it (``skip_back_nb``).

The kernels do no bounds checks: :mod:`kvtier.sim.engine` validates every array before the
call. The loops that run once per block (taking, registering and releasing slots; look-ups;
pins) index with unsigned integers (``u64``): numba then leaves out the wrap-around of negative
indices, a compare and select per access that took about a fifth of a replay. Every such index
is non-negative by construction. Those loops are functions of their own, each called for a
request's run of blocks and handed only the arrays it uses: numba reference-counts every array
passed to a call, which cost more than the work itself when the ring's pushes were helpers
called once per slot. The semantics are in the docstring of :mod:`kvtier.sim.reference`.
Lower tiers are kernels in :mod:`kvtier.sim.nb_tiers`, called at the same hooks as the
reference's ``LowerTiers`` and only when there is work for them (each call hands over every
tier array).
"""

from __future__ import annotations

import numpy as np
from numba import njit

from kvtier.cache.prefetch import prefetch
from kvtier.sim.nb_tiers import (
    choose_nb,
    computed_nb,
    hbm_evicted_nb,
    load_nb,
    lookup_nb,
    sighted_nb,
)
from kvtier.sim.tiers import WRITE_SELECTIVE
from kvtier.sim.timing import iteration_time

iteration_time_nb = njit(cache=True, nogil=True)(iteration_time)


@njit(cache=True, nogil=True, inline="always")
def step_time_nb(tokens: int, attn: int, kv_read: int, tparams: np.ndarray) -> float:
    """:func:`iteration_time` with the packed parameters of ``SimConfig.timing_params``."""
    return iteration_time_nb(
        tokens,
        attn,
        kv_read,
        tparams[0],
        tparams[1],
        tparams[2],
        tparams[3],
        tparams[4],
        tparams[5],
        tparams[6],
    )


ROUND_ROBIN, LEAST_LOADED, PREFIX_AFFINITY = 0, 1, 2
# Fields of a slot record in ``sl`` (int32, 4 per slot, one cache line holds 4 slots): every
# pool operation on a slot touches one record instead of several arrays. POS is the slot's
# index in its instance's free ring while it is free (-1 while pinned); BLOCK the block it
# caches (-1: none, an anonymous slot); MAP the block's map index while the map names this
# slot (-1 otherwise: no block, or a block read only once).
POS, MAP, REF, BLOCK = 0, 1, 2, 3
# Entries between prefetching a slot record (ring or request order) and using it: far enough
# for a miss to arrive meanwhile. The ring (2 * capacity + AHEAD entries) is longer than AHEAD,
# which the allocation loop's wrap of ``r + AHEAD`` relies on.
AHEAD = 16
# An index numba takes as is (no wrap-around of negative values): see the module docstring.
u64 = np.uint64


@njit(cache=True, nogil=True)
def _compact_nb(
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


@njit(cache=True, nogil=True)
def _lookup_nb(
    slot_of: np.ndarray, base: int, shared: np.ndarray, start: int, cap: int, found: np.ndarray
) -> int:
    """Leading blocks of references ``start:start+cap`` cached in the map at offset ``base``.

    Their slots go to ``found[0:h]`` (room for the longest prompt), saving a second look-up.
    A block read only once (``shared`` -1) is never cached for another request: a miss.
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
    return h


@njit(cache=True, nogil=True)
def _take_nb(
    sl: np.ndarray,
    ring: np.ndarray,
    slot_of: np.ndarray,
    slots: np.ndarray,
    evbuf: np.ndarray,
    o: int,
    R: int,
    base: int,
    so: int,
    j0: int,
    j1: int,
    r: int,
    left: int,
) -> tuple[int, int, int]:
    """Take slots ``slots[so + j0:so + j1]`` from the head of the free ring at ``ring[o:o + R]``.

    ``r`` is the ring's head and ``left`` its entry count; stale entries (free slots a request
    has pinned since) are skipped. A block cached in a taken slot is evicted: its map entry
    (map offset ``base``) is cleared and its id goes to ``evbuf``. Returns the new head, the
    new entry count and the number of evicted blocks. The records of later entries are
    prefetched so that their misses overlap. (Clearing a map entry is a store, which does not
    wait for its line; prefetching those entries too, which needs the record of a slot taken
    later, made replays slower.)
    """
    ne = 0
    for j in range(j0, j1):
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
            evbuf[u64(ne)] = old
            ne += 1
        sl[u64(4 * s + REF)] = 1
        slots[u64(so + j)] = s
    return r, left, ne


@njit(cache=True, nogil=True)
def _register_nb(
    sl: np.ndarray,
    slot_of: np.ndarray,
    slots: np.ndarray,
    block_ids: np.ndarray,
    shared: np.ndarray,
    base: int,
    ref0: int,
    slot0: int,
    j0: int,
    j1: int,
    wbuf: np.ndarray,
    nw: int,
    w_from: int,
) -> int:
    """Cache a request's newly computed blocks ``j0:j1`` in their slots.

    Block ``j`` is reference ``ref0 + j`` and sits in slot ``slots[slot0 + j]``. A block read
    more than once goes into the map (offset ``base``) unless another slot already holds it
    (then this slot stays anonymous); a block read once is only recorded in its slot. Blocks
    from ``w_from`` on are appended to ``wbuf`` for the lower tiers; returns the new length.
    """
    for j in range(j0, j1):
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


@njit(cache=True, nogil=True)
def _release_nb(
    sl: np.ndarray,
    ring: np.ndarray,
    slots: np.ndarray,
    rh: np.ndarray,
    rn: np.ndarray,
    free_len: np.ndarray,
    k: int,
    R: int,
    j0: int,
    j1: int,
) -> None:
    """Unpin a finished request's slots ``slots[j0:j1]`` on instance ``k``, tail-first.

    A slot no longer pinned joins the free ring: at the tail if it caches a block (the least
    recently used are taken first), at the head if it is anonymous (reused before any cached
    block is evicted).
    """
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
                _compact_nb(sl, ring, rh, rn, k, R)
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


@njit(cache=True, nogil=True)
def skip_back_nb(
    k: int,
    now: float,
    seg_steps: np.ndarray,
    seg_t0: np.ndarray,
    seg_busy: np.ndarray,
    seg_attn: np.ndarray,
    seg_kv: np.ndarray,
    seg_m: np.ndarray,
    busy_time: np.ndarray,
    tparams: np.ndarray,
) -> int:
    """Undo instance ``k``'s decode steps that start at or after an early stop at ``now``.

    Step by step, a replay stopped at ``now`` has begun (counted, and added to the busy time)
    exactly the steps that started before ``now``. The steps run ahead are recomputed from
    their first one with the same operations, so the busy time is the same float as step by
    step. Returns the number of steps to take off the iteration count.
    """
    m = seg_m[k]
    attn = seg_attn[k]
    kv_read = seg_kv[k]
    t = seg_t0[k]
    busy = seg_busy[k]
    begun = 0
    while begun < seg_steps[k] and t < now:
        dt = step_time_nb(m, attn, kv_read, tparams)
        busy += dt
        t += dt
        begun += 1
        attn += 2 * m
        kv_read += m
    busy_time[k] = busy
    return seg_steps[k] - begun


@njit(cache=True, nogil=True)
def simulate_nb(
    arrival: np.ndarray,  # f8 (n,)
    inp: np.ndarray,  # i8 (n,)
    out: np.ndarray,  # i8 (n,)
    boff: np.ndarray,  # i8 (n+1,)
    block_ids: np.ndarray,  # i4 (refs,)
    shared: np.ndarray,  # i4 (refs,): map index of a block read more than once, else -1
    n_shared: int,  # blocks read more than once (map entries per instance), >= 1
    total_blocks: np.ndarray,  # i8 (n,)
    n_inst: int,
    cap: int,  # HBM slots per instance
    R: int,  # entries of each instance's free ring (engine.free_ring_length: 2 * cap + AHEAD)
    B: int,
    budget_max: int,
    max_seqs: int,
    router: int,
    overload: int,
    tparams: np.ndarray,  # f8 (7,) iteration_time parameters
    slo_on: bool,
    slo_thr: np.ndarray,  # f8 (4,) mean, p99, p999 TTFT bounds, p99 TPOT bound
    slo_lim: np.ndarray,  # i8 (3,) over-limits for p99, p999, tpot p99
    first: np.ndarray,  # out f8 (n,) NaN-filled
    finish: np.ndarray,  # out f8 (n,) NaN-filled
    hits_out: np.ndarray,  # out i8 (n,)
    inst_of: np.ndarray,  # out i8 (n,) -1-filled
    busy_time: np.ndarray,  # out f8 (n_inst,)
    stats: np.ndarray,  # out f8 (3,): n_iterations, early_stopped, end time
    slot_of: np.ndarray,  # scratch i4 (n_inst * n_shared,), all zero; all zero on return
    n_tiers: int,  # lower tiers (0: HBM only; the tier arguments are then placeholders)
    ts: tuple,  # stacked cache-engine state of every lower-tier pool (see nb_tiers)
    tp: tuple,  # lower-tier parameters (see nb_tiers)
    lk: tuple,  # link and tier counters (see nb_tiers)
    sightings: np.ndarray,  # scratch i8 (n_blocks,), zero
    load_s: np.ndarray,  # out f8 (n,) zero-filled: seconds from admission to loaded
    slots: np.ndarray,  # scratch i4 (sum of total_blocks,): each request's slots, in order
    sl: np.ndarray,  # scratch i4 (4 * n_inst * cap,): slot records, set here
    stamp: np.ndarray,  # scratch i8 (n_inst * cap,): admission stamps, set here
    ring: np.ndarray,  # scratch i4 ((n_inst + 1) * R,): free rings, set here
) -> None:
    """Replay every request; write per-request times and counters into the output arrays.

    One kernel call runs the whole replay so the event loop never returns to Python; all
    state is local arrays sized from the inputs, which the wrapper has validated.
    """
    n = arrival.shape[0]
    n_slots = n_inst * cap
    # per-request state
    slot_off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        slot_off[i + 1] = slot_off[i] + total_blocks[i]
    kv = np.zeros(n, dtype=np.int64)
    gen = np.zeros(n, dtype=np.int64)
    reg = np.zeros(n, dtype=np.int64)
    comp_from = np.zeros(n, dtype=np.int64)
    ready = np.zeros(n, dtype=np.float64)
    qnext = np.full(n, -1, dtype=np.int64)
    # per-instance state
    q_head = np.full(n_inst, -1, dtype=np.int64)
    q_tail = np.full(n_inst, -1, dtype=np.int64)
    q_len = np.zeros(n_inst, dtype=np.int64)
    run = np.empty((n_inst, max_seqs), dtype=np.int64)
    run_len = np.zeros(n_inst, dtype=np.int64)
    sched_q = np.zeros((n_inst, max_seqs), dtype=np.int64)
    sched_pos = np.zeros((n_inst, max_seqs), dtype=np.int64)
    wake = np.full(n_inst, np.inf)
    n_sched = np.zeros(n_inst, dtype=np.int64)
    busy = np.zeros(n_inst, dtype=np.bool_)
    busy_until = np.zeros(n_inst, dtype=np.float64)
    act = np.empty(n_inst, dtype=np.int64)  # instances that act at this event, in index order
    # the decode steps an instance ran ahead of the event loop (0: none pending) and what they
    # started from, so that an early stop can count only the steps begun before it
    seg_steps = np.zeros(n_inst, dtype=np.int64)
    seg_t0 = np.zeros(n_inst, dtype=np.float64)
    seg_busy = np.zeros(n_inst, dtype=np.float64)
    seg_attn = np.zeros(n_inst, dtype=np.int64)
    seg_kv = np.zeros(n_inst, dtype=np.int64)
    seg_m = np.zeros(n_inst, dtype=np.int64)
    # HBM pools. The slot records, stamps and free rings come from the caller, possibly
    # kept from an earlier replay (faulting in fresh pages cost more than the replay of a
    # small trace), and are set here. Free rings: instance k's at ring[k * R:(k + 1) * R], head
    # index rh[k], rn[k] entries (live and stale) from the head on; a compaction scratch area
    # after the last one. Entries past the live ones name slot 0 of the instance, so the
    # allocation loop's look-ahead always reads a slot record.
    rh = np.zeros(n_inst, dtype=np.int64)
    rn = np.full(n_inst, cap, dtype=np.int64)
    for k in range(n_inst):
        for r in range(R):
            ring[k * R + r] = k * cap + (r if r < cap else 0)
    for k in range(n_inst):
        for x in range(cap):
            g = k * cap + x
            sl[4 * g + POS] = x
            sl[4 * g + MAP] = -1
            sl[4 * g + REF] = 0
            sl[4 * g + BLOCK] = -1
            stamp[g] = -1
    free_len = np.full(n_inst, cap, dtype=np.int64)
    max_nb = 0
    for i in range(n):
        if boff[i + 1] - boff[i] > max_nb:
            max_nb = boff[i + 1] - boff[i]
    found = np.empty(max_nb + 1, dtype=np.int32)
    # lower-tier scratch: sources of found blocks, per-tier counts, a link path, block buffers
    src = np.empty(max_nb + 1, dtype=np.int32)
    counts = np.zeros(n_tiers + 1, dtype=np.int64)
    path = np.full(4, -1, dtype=np.int64)
    hitbuf = np.empty(max_nb + 1, dtype=np.int32)
    evbuf = np.empty(cap + 1, dtype=np.int32)
    wbuf = np.empty(budget_max // B + max_seqs + 2, dtype=np.int32)
    selective = n_tiers > 0 and tp[11][0] == WRITE_SELECTIVE
    batch_waits = n_tiers > 0 and tp[11][6] == 1
    comp = np.empty(3, dtype=np.float64)
    comp[0] = tparams[0]
    comp[1] = tparams[1]
    comp[2] = tparams[2]
    # SLO tracking
    sum_ttft = 0.0
    over0 = 0
    over1 = 0
    over2 = 0
    n_rej = 0
    rr = 0
    nx = 0
    n_iter = 0
    early = False
    now = 0.0
    stamp_ctr = 0

    while True:
        t_arr = arrival[nx] if nx < n else np.inf
        t_end = np.inf
        for k in range(n_inst):
            if busy[k]:
                if busy_until[k] < t_end:
                    t_end = busy_until[k]
            elif wake[k] < t_end:
                t_end = wake[k]
        now = t_arr if t_arr < t_end else t_end
        if now == np.inf:
            break
        # ---- iteration ends, instances in index order. Which instances act is found first in
        # a loop of its own (handling one changes no other instance's state), so the scan over
        # every instance at every event does not carry the large body's per-instance pointers.
        n_act = 0
        for k in range(n_inst):
            if busy[k] and busy_until[k] == now:
                act[n_act] = k
                n_act += 1
        for a in range(n_act):
            k = act[a]
            base = k * n_shared
            m = n_sched[k]
            n_done = 0
            nw = 0
            for idx in range(m):
                pos = sched_pos[k, idx]
                i = run[k, pos]
                q = sched_q[k, idx]
                was_prefill = kv[i] < inp[i]
                kv[i] += q
                nb = boff[i + 1] - boff[i]
                full = kv[i] // B
                if full > nb:
                    full = nb
                if full > reg[i]:
                    w_from = comp_from[i] if n_tiers > 0 else full  # computed: to lower tiers
                    nw = _register_nb(
                        sl, slot_of, slots, block_ids, shared, base, boff[i], slot_off[i],
                        reg[i], full, wbuf, nw, w_from,
                    )  # fmt: skip
                    reg[i] = full
                done = False
                if was_prefill:
                    if kv[i] == inp[i]:
                        gen[i] = 1
                        first[i] = now
                        if slo_on:
                            ttft = now - arrival[i]
                            sum_ttft += ttft
                            if ttft > slo_thr[1]:
                                over0 += 1
                            if ttft > slo_thr[2]:
                                over1 += 1
                        if out[i] <= 1:
                            done = True
                else:
                    gen[i] += 1
                    if gen[i] >= out[i]:
                        done = True
                if done:
                    finish[i] = now
                    n_done += 1
                    if slo_on:
                        d = out[i] - 1
                        if d < 1:
                            d = 1
                        if (now - first[i]) / d > slo_thr[3]:
                            over2 += 1
                    _release_nb(
                        sl, ring, slots, rh, rn, free_len, k, R, slot_off[i], slot_off[i + 1]
                    )
                    run[k, pos] = -1
            if n_done:
                w = 0
                for pos in range(run_len[k]):
                    if run[k, pos] >= 0:
                        run[k, w] = run[k, pos]
                        w += 1
                run_len[k] = w
            n_sched[k] = 0
            seg_steps[k] = 0
            busy[k] = False
            if nw > 0:  # (a call passes every tier array: skip it when there is nothing)
                computed_nb(ts, tp, lk, n_tiers, k, now, wbuf, np.int64(nw), sightings, path)
        if slo_on and (
            n_rej > 0
            or sum_ttft / n > slo_thr[0]
            or over0 >= slo_lim[0]
            or over1 >= slo_lim[1]
            or over2 >= slo_lim[2]
        ):
            early = True
            for k in range(n_inst):
                if seg_steps[k] > 0:
                    n_iter -= skip_back_nb(
                        k, now, seg_steps, seg_t0, seg_busy, seg_attn, seg_kv, seg_m, busy_time,
                        tparams,
                    )  # fmt: skip
            break
        # ---- arrivals at this instant, in trace order
        while nx < n and arrival[nx] == now:
            i = nx
            nx += 1
            if total_blocks[i] > cap:
                n_rej += 1
                continue
            if router == ROUND_ROBIN:
                k = rr % n_inst
                rr += 1
            elif router == LEAST_LOADED:
                k = 0
                best_load = q_len[0] + run_len[0]
                for kk in range(1, n_inst):
                    ld = q_len[kk] + run_len[kk]
                    if ld < best_load:
                        best_load = ld
                        k = kk
            else:
                min_load = q_len[0] + run_len[0]
                for kk in range(1, n_inst):
                    ld = q_len[kk] + run_len[kk]
                    if ld < min_load:
                        min_load = ld
                limit = min_load + overload
                hcap = (inp[i] - 1) // B
                nb = boff[i + 1] - boff[i]
                if nb < hcap:
                    hcap = nb
                k = -1
                best_hits = -1
                best_load = 0
                if hcap > 0 and shared[boff[i]] >= 0:
                    # each instance's first look-up misses: let the misses overlap
                    for kk in range(n_inst):
                        prefetch(slot_of, kk * n_shared + shared[boff[i]])
                for kk in range(n_inst):
                    ld = q_len[kk] + run_len[kk]
                    if ld > limit:
                        continue
                    h = _lookup_nb(slot_of, kk * n_shared, shared, boff[i], hcap, found)
                    if h > best_hits or (h == best_hits and ld < best_load):
                        k = kk
                        best_hits = h
                        best_load = ld
            inst_of[i] = k
            if q_tail[k] < 0:
                q_head[k] = i
            else:
                qnext[q_tail[k]] = i
            q_tail[k] = i
            q_len[k] += 1
        # ---- idle instances with work start an iteration (found first, as above)
        n_act = 0
        for k in range(n_inst):
            if not busy[k] and (run_len[k] > 0 or q_len[k] > 0):
                act[n_act] = k
                n_act += 1
        for a in range(n_act):
            k = act[a]
            base = k * n_shared
            budget = budget_max
            m = 0
            # the iteration's sums (tokens, attention, KV read) as requests are scheduled
            tokens = 0
            attn = 0
            kv_read = 0
            # decode steps before the first of the batch finishes (0: not a decode-only batch)
            steps_left = np.int64(1) << 62
            last_ready = now  # the latest load end among running requests (load_wait = batch)
            for pos in range(run_len[k]):
                i = run[k, pos]
                if ready[i] > now:
                    if ready[i] > last_ready:
                        last_ready = ready[i]
                    continue
                if budget == 0:
                    continue
                if kv[i] < inp[i]:
                    q = inp[i] - kv[i]
                    if q > budget:
                        q = budget
                    steps_left = 0
                else:
                    q = 1
                    if reg[i] < boff[i + 1] - boff[i]:
                        steps_left = 0
                    elif out[i] - gen[i] < steps_left:
                        steps_left = out[i] - gen[i]
                sched_pos[k, m] = pos
                sched_q[k, m] = q
                budget -= q
                m += 1
                tokens += q
                attn += q * (2 * kv[i] + q)
                kv_read += kv[i] + q
            while budget > 0 and q_len[k] > 0 and run_len[k] < max_seqs:
                i = q_head[k]
                nb = boff[i + 1] - boff[i]
                hcap = (inp[i] - 1) // B
                if nb < hcap:
                    hcap = nb
                h = _lookup_nb(slot_of, base, shared, boff[i], hcap, found)
                need = total_blocks[i] - h
                stamp_ctr += 1
                pinned_free = 0
                for j in range(h):
                    s = found[u64(j)]
                    if sl[u64(4 * s + REF)] == 0 and stamp[u64(s)] != stamp_ctr:
                        stamp[u64(s)] = stamp_ctr
                        pinned_free += 1
                if need > free_len[k] - pinned_free:
                    break
                loaded = 0
                ready[i] = now
                if n_tiers > 0:
                    n_src = lookup_nb(ts, tp, n_tiers, k, block_ids, boff[i], h, hcap, src)
                    loaded = choose_nb(
                        tp, lk, n_tiers, k, now, src, n_src, h, B, counts, comp, path
                    )
                    if loaded > 0:
                        ready[i] = load_nb(
                            ts,
                            tp,
                            lk,
                            n_tiers,
                            k,
                            now,
                            block_ids,
                            boff[i],
                            h,
                            src,
                            loaded,
                            counts,
                            path,
                        )
                        load_s[i] = ready[i] - now
                    if selective:  # only write_through_selective reads the sightings
                        sighted_nb(
                            ts, tp, lk, n_tiers, k, now, block_ids, boff[i], nb, h, sightings,
                            hitbuf, path,
                        )  # fmt: skip
                # admit: pin the hits, allocate the rest
                so = slot_off[i]
                for j in range(h):
                    s = found[u64(j)]
                    c = sl[u64(4 * s + REF)]
                    if c == 0:
                        sl[u64(4 * s + POS)] = -1  # its ring entry is now stale
                        free_len[k] -= 1
                    sl[u64(4 * s + REF)] = c + 1
                    slots[u64(so + j)] = s
                # take the other slots from the free ring's head
                r, left, ne = _take_nb(
                    sl, ring, slot_of, slots, evbuf, k * R, R, base, so, h, total_blocks[i],
                    rh[k], rn[k],
                )  # fmt: skip
                free_len[k] -= total_blocks[i] - h
                rh[k] = r
                rn[k] = left
                if ne > 0 and n_tiers > 0:
                    hbm_evicted_nb(ts, tp, lk, n_tiers, k, now, evbuf, np.int64(ne), path)
                kv[i] = (h + loaded) * B
                reg[i] = h
                comp_from[i] = h + loaded
                hits_out[i] = h
                q_head[k] = qnext[i]
                if q_head[k] < 0:
                    q_tail[k] = -1
                q_len[k] -= 1
                pos = run_len[k]
                run[k, pos] = i
                run_len[k] += 1
                steps_left = 0
                if ready[i] > now:
                    if ready[i] > last_ready:
                        last_ready = ready[i]
                    continue
                q = inp[i] - kv[i]
                if q > budget:
                    q = budget
                sched_pos[k, m] = pos
                sched_q[k, m] = q
                budget -= q
                m += 1
                tokens += q
                attn += q * (2 * kv[i] + q)
                kv_read += kv[i] + q
            if batch_waits and last_ready > now:
                # the batch waits for every load (load_wait = batch): idle until the last one
                wake[k] = last_ready
                continue
            if m == 0:
                # every running request is loading: idle until the first one is ready
                w = np.inf
                for pos in range(run_len[k]):
                    if ready[run[k, pos]] < w:
                        w = ready[run[k, pos]]
                wake[k] = w
                continue
            wake[k] = np.inf
            dt = step_time_nb(tokens, attn, kv_read, tparams)
            t = now
            if m == run_len[k] and steps_left > 1:
                # A decode-only batch with every running request in it: until one of them
                # finishes or the next request arrives, its steps change nothing another
                # instance or the router sees, and each step's sums grow by a fixed amount.
                # Run those steps here instead of as events; the times are computed by the
                # same operations in the same order as step by step (see skip_back_nb).
                t_next = arrival[nx] if nx < n else np.inf
                seg_t0[k] = now
                seg_m[k] = m
                seg_busy[k] = busy_time[k]
                seg_attn[k] = attn
                seg_kv[k] = kv_read
                s = 0
                while s < steps_left - 1 and t + dt < t_next:
                    busy_time[k] += dt
                    t += dt
                    s += 1
                    attn += 2 * m
                    kv_read += m
                    dt = step_time_nb(m, attn, kv_read, tparams)
                if s > 0:
                    for idx in range(m):
                        i = run[k, sched_pos[k, idx]]
                        kv[i] += s
                        gen[i] += s
                    n_iter += s
                seg_steps[k] = s + 1 if s > 0 else 0
            n_sched[k] = m
            busy[k] = True
            busy_until[k] = t + dt
            busy_time[k] += dt
            n_iter += 1

    # Leave the map all zero again so the caller can reuse it for the next replay: every
    # non-zero entry is named by the MAP field of the slot it holds, so clearing those entries
    # costs one pass over the slots instead of one over the whole map.
    for x in range(n_slots):
        mx = sl[4 * x + MAP]
        if mx >= 0:
            slot_of[(x // cap) * n_shared + mx] = 0
    stats[0] = n_iter
    stats[1] = 1.0 if early else 0.0
    stats[2] = now
