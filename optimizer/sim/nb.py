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

from typing import NamedTuple

import numpy as np
from numba import njit

from kvtier.cache.prefetch import prefetch
from kvtier.sim.nb_tiers import (
    LinkState,
    TierParams,
    TierPools,
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


class Requests(NamedTuple):
    """The trace as the kernel reads it (read-only; :class:`BlockedTrace` checked it)."""

    arrival: np.ndarray  # f8 (n,)
    input_tokens: np.ndarray  # i8 (n,)
    output_tokens: np.ndarray  # i8 (n,)
    block_offsets: np.ndarray  # i8 (n + 1,): request i's full prompt blocks are refs boff[i]:..
    block_ids: np.ndarray  # i4 (refs,)
    shared: np.ndarray  # i4 (refs,): map index of a block read more than once, else -1
    total_blocks: np.ndarray  # i8 (n,): HBM blocks reserved at admission


class Params(NamedTuple):
    """The serving scalars of ``SimConfig`` and the early-stop bounds of ``SloCheck``."""

    n_instances: int
    capacity: int  # HBM slots per instance
    ring_len: int  # entries of each free ring (engine.free_ring_length: 2 * capacity + AHEAD)
    block_tokens: int
    token_budget: int  # max_num_batched_tokens
    max_seqs: int  # max_num_seqs
    router: int  # ROUND_ROBIN, LEAST_LOADED, PREFIX_AFFINITY
    affinity_overload: int
    n_shared: int  # blocks read more than once (map entries per instance), >= 1
    timing: np.ndarray  # f8 (7,): iteration_time parameters (SimConfig.timing_params)
    slo_on: bool
    slo_thresholds: np.ndarray  # f8 (4,): mean, p99, p999 TTFT bounds, p99 TPOT bound
    slo_limits: np.ndarray  # i8 (3,): over-limits for p99, p999 TTFT and p99 TPOT


class HbmPools(NamedTuple):
    """Every instance's HBM slots, prefix-cache map and free ring (arrays the caller keeps).

    The map comes all zero and is left all zero; the other arrays are set by the kernel.
    """

    slot_of: np.ndarray  # i4 (n_instances * n_shared,): cached block -> slot + 1
    records: np.ndarray  # i4 (4 * n_instances * capacity,): POS, MAP, REF, BLOCK per slot
    stamps: np.ndarray  # i8 (n_instances * capacity,): admission stamps (distinct hit slots)
    rings: np.ndarray  # i4 ((n_instances + 1) * ring_len,): free rings, then a scratch ring
    slots: np.ndarray  # i4 (sum of total_blocks,): each request's slots, in order


class Outputs(NamedTuple):
    """What a replay returns per request and per instance (filled by the caller first)."""

    first_token: np.ndarray  # f8 (n,), NaN-filled
    finish: np.ndarray  # f8 (n,), NaN-filled
    hit_blocks: np.ndarray  # i8 (n,): prefix blocks found in HBM at admission
    instance: np.ndarray  # i8 (n,), -1-filled (stays -1 for a rejected request)
    busy_s: np.ndarray  # f8 (n_instances,), zero
    load_s: np.ndarray  # f8 (n,), zero: seconds from admission to the last loaded block
    loaded_blocks: np.ndarray  # i8 (n, n_tiers), zero: blocks loaded from each lower tier
    stats: np.ndarray  # f8 (3,): n_iterations, early_stopped, end time


class RequestState(NamedTuple):
    """Per-request progress (the reference's ``Request`` fields)."""

    slot_off: np.ndarray  # i8 (n + 1,): request i's slots are slots[slot_off[i]:slot_off[i+1]]
    kv: np.ndarray  # i8: tokens whose KV is computed (hits and loads included)
    generated: np.ndarray  # i8
    registered: np.ndarray  # i8: prompt blocks [0, registered) are cached or were offered
    computed_from: np.ndarray  # i8: prompt blocks from here on are computed
    ready: np.ndarray  # f8: its prefill may start once loaded blocks have arrived
    next_waiting: np.ndarray  # i8: the next request in its instance's queue, -1 at the tail


class InstanceState(NamedTuple):
    """Per-instance queues, running set, iteration and free-ring state (``Instance``)."""

    q_head: np.ndarray  # i8 (n_instances,): waiting queue, a list through next_waiting
    q_tail: np.ndarray
    q_len: np.ndarray
    running: np.ndarray  # i8 (n_instances, max_seqs): running requests, admission order
    n_running: np.ndarray
    sched_q: np.ndarray  # i8 (n_instances, max_seqs): tokens of each scheduled request
    sched_pos: np.ndarray  # i8 (n_instances, max_seqs): its position in ``running``
    n_sched: np.ndarray
    busy: np.ndarray  # bool: in an iteration
    busy_until: np.ndarray  # f8: when the iteration ends
    wake: np.ndarray  # f8: while idle, when a loading request becomes ready
    act: np.ndarray  # i8: instances that act at this event, in index order
    # decode steps run ahead of the event loop (0: none pending) and what they started from,
    # so that an early stop can count only the steps begun before it (skip_back_nb)
    seg_steps: np.ndarray
    seg_t0: np.ndarray
    seg_busy: np.ndarray
    seg_attn: np.ndarray
    seg_kv: np.ndarray
    seg_m: np.ndarray
    # free ring of instance k: head index, entries (live and stale) from the head, free slots
    ring_head: np.ndarray
    ring_count: np.ndarray
    free_len: np.ndarray


class Buffers(NamedTuple):
    """Scratch of one admission or iteration end: found slots, lower-tier sources, blocks."""

    found: np.ndarray  # i4 (longest prompt + 1,): the HBM slots of a request's prefix
    src: np.ndarray  # i4: source tier of each block found below HBM
    counts: np.ndarray  # i8 (n_tiers + 1,): blocks per tier
    path: np.ndarray  # i8 (4,): links of one transfer
    hitbuf: np.ndarray  # i4: HBM hits reaching their k-th sighting
    evbuf: np.ndarray  # i4 (capacity + 1,): blocks one admission evicted from HBM
    wbuf: np.ndarray  # i4: blocks one iteration computed


# Fields of the replay-wide counters (``Tally.ints``): the round-robin turn, iterations begun,
# the admission stamp, and the SLO counts (rejected, TTFT over the p99 and p99.9 bounds, TPOT
# over its bound), as :class:`kvtier.sim.result.SloTracker` keeps them.
C_RR, C_ITER, C_STAMP, C_REJECTED, C_OVER_P99, C_OVER_P999, C_OVER_TPOT = range(7)


class Tally(NamedTuple):
    """Replay-wide counters the steps update (arrays, so that a step can change them)."""

    ints: np.ndarray  # i8 (7,): fields C_*
    ttft_sum: np.ndarray  # f8 (1,): summed TTFT so far (the SLO's mean bound)


@njit(cache=True, nogil=True, inline="always")
def next_event_nb(rq: Requests, ist: InstanceState, nx: int, prm: Params) -> float:
    """The next instant: an arrival, an iteration's end or an idle instance's wake-up."""
    t_arr = rq.arrival[nx] if nx < rq.arrival.shape[0] else np.inf
    t_end = np.inf
    for k in range(prm.n_instances):
        if ist.busy[k]:
            if ist.busy_until[k] < t_end:
                t_end = ist.busy_until[k]
        elif ist.wake[k] < t_end:
            t_end = ist.wake[k]
    return t_arr if t_arr < t_end else t_end


@njit(cache=True, nogil=True, inline="always")
def first_token_nb(i: int, now: float, rq: Requests, prm: Params, out: Outputs, ty: Tally) -> None:
    """Request ``i``'s prompt is complete: its first token at ``now`` (SLO counts)."""
    out.first_token[i] = now
    if prm.slo_on:
        ttft = now - rq.arrival[i]
        ty.ttft_sum[0] += ttft
        if ttft > prm.slo_thresholds[1]:
            ty.ints[C_OVER_P99] += 1
        if ttft > prm.slo_thresholds[2]:
            ty.ints[C_OVER_P999] += 1


@njit(cache=True, nogil=True, inline="always")
def finish_nb(
    k: int,
    i: int,
    now: float,
    rq: Requests,
    rs: RequestState,
    ist: InstanceState,
    pool: HbmPools,
    prm: Params,
    out: Outputs,
    ty: Tally,
) -> None:
    """Request ``i`` emitted its last token: record it, count its TPOT, free its slots."""
    out.finish[i] = now
    if prm.slo_on:
        d = rq.output_tokens[i] - 1
        if d < 1:
            d = 1
        if (now - out.first_token[i]) / d > prm.slo_thresholds[3]:
            ty.ints[C_OVER_TPOT] += 1
    _release_nb(
        pool.records, pool.rings, pool.slots, ist.ring_head, ist.ring_count, ist.free_len, k,
        prm.ring_len, rs.slot_off[i], rs.slot_off[i + 1],
    )  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def end_iteration_nb(
    k: int,
    now: float,
    rq: Requests,
    rs: RequestState,
    ist: InstanceState,
    pool: HbmPools,
    ts: TierPools,
    tp: TierParams,
    lk: LinkState,
    prm: Params,
    out: Outputs,
    ty: Tally,
    buf: Buffers,
) -> None:
    """Instance ``k``'s iteration ends: KV grows, full blocks register, tokens are emitted."""
    boff = rq.block_offsets
    base = k * prm.n_shared
    n_done = 0
    nw = 0
    for idx in range(ist.n_sched[k]):
        pos = ist.sched_pos[k, idx]
        i = ist.running[k, pos]
        q = ist.sched_q[k, idx]
        was_prefill = rs.kv[i] < rq.input_tokens[i]
        rs.kv[i] += q
        nb = boff[i + 1] - boff[i]
        full = rs.kv[i] // prm.block_tokens
        if full > nb:
            full = nb
        if full > rs.registered[i]:
            w_from = rs.computed_from[i] if tp.n_tiers > 0 else full  # computed: to lower tiers
            nw = _register_nb(
                pool.records, pool.slot_of, pool.slots, rq.block_ids, rq.shared, base, boff[i],
                rs.slot_off[i], rs.registered[i], full, buf.wbuf, nw, w_from,
            )  # fmt: skip
            rs.registered[i] = full
        done = False
        if was_prefill:
            if rs.kv[i] == rq.input_tokens[i]:
                rs.generated[i] = 1
                first_token_nb(i, now, rq, prm, out, ty)
                if rq.output_tokens[i] <= 1:
                    done = True
        else:
            rs.generated[i] += 1
            if rs.generated[i] >= rq.output_tokens[i]:
                done = True
        if done:
            finish_nb(k, i, now, rq, rs, ist, pool, prm, out, ty)
            n_done += 1
            ist.running[k, pos] = -1
    if n_done:
        w = 0
        for pos in range(ist.n_running[k]):
            if ist.running[k, pos] >= 0:
                ist.running[k, w] = ist.running[k, pos]
                w += 1
        ist.n_running[k] = w
    ist.n_sched[k] = 0
    ist.seg_steps[k] = 0
    ist.busy[k] = False
    if nw > 0:  # (a call passes every tier array: skip it when there is nothing)
        computed_nb(ts, tp, lk, k, now, buf.wbuf, np.int64(nw), buf.path)


@njit(cache=True, nogil=True, inline="always")
def slo_missed_nb(prm: Params, ty: Tally, n: int) -> bool:
    """Is the SLO certainly missed already? (``SloTracker.missed``.)"""
    c = ty.ints
    return (
        c[C_REJECTED] > 0
        or ty.ttft_sum[0] / n > prm.slo_thresholds[0]
        or c[C_OVER_P99] >= prm.slo_limits[0]
        or c[C_OVER_P999] >= prm.slo_limits[1]
        or c[C_OVER_TPOT] >= prm.slo_limits[2]
    )


@njit(cache=True, nogil=True)
def skip_back_nb(k: int, now: float, ist: InstanceState, out: Outputs, timing: np.ndarray) -> int:
    """Undo instance ``k``'s decode steps that start at or after an early stop at ``now``.

    Step by step, a replay stopped at ``now`` has begun (counted, and added to the busy time)
    exactly the steps that started before ``now``. The steps run ahead are recomputed from
    their first one with the same operations, so the busy time is the same float as step by
    step. Returns the number of steps to take off the iteration count.
    """
    m = ist.seg_m[k]
    attn = ist.seg_attn[k]
    kv_read = ist.seg_kv[k]
    t = ist.seg_t0[k]
    busy = ist.seg_busy[k]
    begun = 0
    while begun < ist.seg_steps[k] and t < now:
        dt = step_time_nb(m, attn, kv_read, timing)
        busy += dt
        t += dt
        begun += 1
        attn += 2 * m
        kv_read += m
    out.busy_s[k] = busy
    return ist.seg_steps[k] - begun


@njit(cache=True, nogil=True)
def stop_early_nb(now: float, ist: InstanceState, prm: Params, out: Outputs, ty: Tally) -> None:
    """Stop at ``now``: take back the decode steps run ahead that begin at or after it."""
    for k in range(prm.n_instances):
        if ist.seg_steps[k] > 0:
            ty.ints[C_ITER] -= skip_back_nb(k, now, ist, out, prm.timing)


@njit(cache=True, nogil=True, inline="always")
def route_nb(
    i: int, rq: Requests, ist: InstanceState, pool: HbmPools, prm: Params, ty: Tally, buf: Buffers
) -> int:
    """The instance request ``i`` joins (load = waiting + running requests)."""
    n_inst = prm.n_instances
    if prm.router == ROUND_ROBIN:
        k = ty.ints[C_RR] % n_inst
        ty.ints[C_RR] += 1
        return k
    if prm.router == LEAST_LOADED:
        k = 0
        best_load = ist.q_len[0] + ist.n_running[0]
        for kk in range(1, n_inst):
            ld = ist.q_len[kk] + ist.n_running[kk]
            if ld < best_load:
                best_load = ld
                k = kk
        return k
    # prefix affinity: the most HBM-resident prefix blocks among instances not overloaded
    boff = rq.block_offsets
    min_load = ist.q_len[0] + ist.n_running[0]
    for kk in range(1, n_inst):
        ld = ist.q_len[kk] + ist.n_running[kk]
        if ld < min_load:
            min_load = ld
    limit = min_load + prm.affinity_overload
    hcap = (rq.input_tokens[i] - 1) // prm.block_tokens
    nb = boff[i + 1] - boff[i]
    if nb < hcap:
        hcap = nb
    k = -1
    best_hits = -1
    best_load = 0
    if hcap > 0 and rq.shared[boff[i]] >= 0:
        # each instance's first look-up misses: let the misses overlap
        for kk in range(n_inst):
            prefetch(pool.slot_of, kk * prm.n_shared + rq.shared[boff[i]])
    for kk in range(n_inst):
        ld = ist.q_len[kk] + ist.n_running[kk]
        if ld > limit:
            continue
        h = _lookup_nb(pool.slot_of, kk * prm.n_shared, rq.shared, boff[i], hcap, buf.found)
        if h > best_hits or (h == best_hits and ld < best_load):
            k = kk
            best_hits = h
            best_load = ld
    return k


@njit(cache=True, nogil=True, inline="always")
def arrive_nb(
    i: int,
    rq: Requests,
    rs: RequestState,
    ist: InstanceState,
    pool: HbmPools,
    prm: Params,
    out: Outputs,
    ty: Tally,
    buf: Buffers,
) -> None:
    """Request ``i`` arrives: rejected if it can never fit, else routed to a waiting queue."""
    if rq.total_blocks[i] > prm.capacity:
        ty.ints[C_REJECTED] += 1
        return
    k = route_nb(i, rq, ist, pool, prm, ty, buf)
    out.instance[i] = k
    if ist.q_tail[k] < 0:
        ist.q_head[k] = i
    else:
        rs.next_waiting[ist.q_tail[k]] = i
    ist.q_tail[k] = i
    ist.q_len[k] += 1


@njit(cache=True, nogil=True, inline="always")
def admit_nb(
    k: int,
    i: int,
    now: float,
    rq: Requests,
    rs: RequestState,
    ist: InstanceState,
    pool: HbmPools,
    ts: TierPools,
    tp: TierParams,
    lk: LinkState,
    prm: Params,
    out: Outputs,
    ty: Tally,
    buf: Buffers,
) -> bool:
    """Admit request ``i`` on instance ``k`` if its fresh slots fit: look up its prefix (HBM,
    then the lower tiers), load, pin the hits and take the rest from the free ring."""
    boff = rq.block_offsets
    B = prm.block_tokens
    base = k * prm.n_shared
    nb = boff[i + 1] - boff[i]
    hcap = (rq.input_tokens[i] - 1) // B
    if nb < hcap:
        hcap = nb
    h = _lookup_nb(pool.slot_of, base, rq.shared, boff[i], hcap, buf.found)
    need = rq.total_blocks[i] - h
    ty.ints[C_STAMP] += 1
    stamp = ty.ints[C_STAMP]
    pinned_free = 0  # distinct hit slots now in the free ring
    for j in range(h):
        s = buf.found[u64(j)]
        if pool.records[u64(4 * s + REF)] == 0 and pool.stamps[u64(s)] != stamp:
            pool.stamps[u64(s)] = stamp
            pinned_free += 1
    if need > ist.free_len[k] - pinned_free:
        return False
    loaded = 0
    rs.ready[i] = now
    if tp.n_tiers > 0:
        n_src = lookup_nb(ts, tp, k, rq.block_ids, boff[i], h, hcap, buf.src)
        loaded = choose_nb(tp, lk, k, now, buf.src, n_src, h, B, buf.counts, prm.timing, buf.path)
        if loaded > 0:
            rs.ready[i] = load_nb(
                ts, tp, lk, k, now, rq.block_ids, boff[i], h, buf.src, loaded, buf.counts,
                buf.path,
            )  # fmt: skip
            out.load_s[i] = rs.ready[i] - now
            for t in range(tp.n_tiers):  # load_nb counted the loaded blocks per source tier
                out.loaded_blocks[i, t] = buf.counts[t]
        if tp.write_policy == WRITE_SELECTIVE:  # only it reads the sightings
            sighted_nb(ts, tp, lk, k, now, rq.block_ids, boff[i], nb, h, buf.hitbuf, buf.path)
    # pin the hits
    so = rs.slot_off[i]
    sl = pool.records
    for j in range(h):
        s = buf.found[u64(j)]
        c = sl[u64(4 * s + REF)]
        if c == 0:
            sl[u64(4 * s + POS)] = -1  # its ring entry is now stale
            ist.free_len[k] -= 1
        sl[u64(4 * s + REF)] = c + 1
        pool.slots[u64(so + j)] = s
    # take the other slots from the free ring's head
    r, left, ne = _take_nb(
        sl, pool.rings, pool.slot_of, pool.slots, buf.evbuf, k * prm.ring_len, prm.ring_len,
        base, so, h, rq.total_blocks[i], ist.ring_head[k], ist.ring_count[k],
    )  # fmt: skip
    ist.free_len[k] -= rq.total_blocks[i] - h
    ist.ring_head[k] = r
    ist.ring_count[k] = left
    if ne > 0 and tp.n_tiers > 0:
        hbm_evicted_nb(ts, tp, lk, k, now, buf.evbuf, np.int64(ne), buf.path)
    rs.kv[i] = (h + loaded) * B
    rs.registered[i] = h
    rs.computed_from[i] = h + loaded
    out.hit_blocks[i] = h
    return True


@njit(cache=True, nogil=True, inline="always")
def run_ahead_nb(
    k: int,
    now: float,
    t_next: float,
    m: int,
    steps_left: int,
    dt: float,
    attn: int,
    kv_read: int,
    rs: RequestState,
    ist: InstanceState,
    prm: Params,
    out: Outputs,
    ty: Tally,
) -> tuple[float, float]:
    """Run a decode-only batch's steps ahead of the event loop; (last step's start, its time).

    With every running request in the batch and decoding, until one of them finishes or the
    next request arrives (``t_next``) its steps change nothing another instance or the router
    sees, and each step's sums grow by a fixed amount. The reference runs them as iterations
    one by one (``start_iteration`` / ``end_iteration``); the times here are computed by the
    same operations in the same order (see :func:`skip_back_nb`). No reference counterpart.
    """
    t = now
    ist.seg_t0[k] = now
    ist.seg_m[k] = m
    ist.seg_busy[k] = out.busy_s[k]
    ist.seg_attn[k] = attn
    ist.seg_kv[k] = kv_read
    s = 0
    while s < steps_left - 1 and t + dt < t_next:
        out.busy_s[k] += dt
        t += dt
        s += 1
        attn += 2 * m
        kv_read += m
        dt = step_time_nb(m, attn, kv_read, prm.timing)
    if s > 0:
        for idx in range(m):
            i = ist.running[k, ist.sched_pos[k, idx]]
            rs.kv[i] += s
            rs.generated[i] += s
        ty.ints[C_ITER] += s
    ist.seg_steps[k] = s + 1 if s > 0 else 0
    return t, dt


@njit(cache=True, nogil=True, inline="always")
def start_iteration_nb(
    k: int,
    now: float,
    t_next: float,
    rq: Requests,
    rs: RequestState,
    ist: InstanceState,
    pool: HbmPools,
    ts: TierPools,
    tp: TierParams,
    lk: LinkState,
    prm: Params,
    out: Outputs,
    ty: Tally,
    buf: Buffers,
) -> None:
    """Idle instance ``k`` schedules an iteration: running requests take their tokens, then
    admissions (FCFS) take prefill chunks; with nothing to run it waits for a load."""
    inp = rq.input_tokens
    boff = rq.block_offsets
    budget = prm.token_budget
    m = 0
    # the iteration's sums (tokens, attention, KV read) as requests are scheduled
    tokens = 0
    attn = 0
    kv_read = 0
    # decode steps before the first of the batch finishes (0: not a decode-only batch)
    steps_left = np.int64(1) << 62
    last_ready = now  # the latest load end among running requests (load_wait = batch)
    for pos in range(ist.n_running[k]):
        i = ist.running[k, pos]
        if rs.ready[i] > now:
            if rs.ready[i] > last_ready:
                last_ready = rs.ready[i]
            continue
        if budget == 0:
            continue
        if rs.kv[i] < inp[i]:
            q = inp[i] - rs.kv[i]
            if q > budget:
                q = budget
            steps_left = 0
        else:
            q = 1
            if rs.registered[i] < boff[i + 1] - boff[i]:
                steps_left = 0
            elif rq.output_tokens[i] - rs.generated[i] < steps_left:
                steps_left = rq.output_tokens[i] - rs.generated[i]
        ist.sched_pos[k, m] = pos
        ist.sched_q[k, m] = q
        budget -= q
        m += 1
        tokens += q
        attn += q * (2 * rs.kv[i] + q)
        kv_read += rs.kv[i] + q
    while budget > 0 and ist.q_len[k] > 0 and ist.n_running[k] < prm.max_seqs:
        i = ist.q_head[k]
        if not admit_nb(k, i, now, rq, rs, ist, pool, ts, tp, lk, prm, out, ty, buf):
            break
        ist.q_head[k] = rs.next_waiting[i]
        if ist.q_head[k] < 0:
            ist.q_tail[k] = -1
        ist.q_len[k] -= 1
        pos = ist.n_running[k]
        ist.running[k, pos] = i
        ist.n_running[k] += 1
        steps_left = 0
        if rs.ready[i] > now:
            if rs.ready[i] > last_ready:
                last_ready = rs.ready[i]
            continue
        q = inp[i] - rs.kv[i]
        if q > budget:
            q = budget
        ist.sched_pos[k, m] = pos
        ist.sched_q[k, m] = q
        budget -= q
        m += 1
        tokens += q
        attn += q * (2 * rs.kv[i] + q)
        kv_read += rs.kv[i] + q
    if tp.batch_waits and last_ready > now:
        # the batch waits for every load (load_wait = batch): idle until the last one
        ist.wake[k] = last_ready
        return
    if m == 0:
        # every running request is loading: idle until the first one is ready
        w = np.inf
        for pos in range(ist.n_running[k]):
            if rs.ready[ist.running[k, pos]] < w:
                w = rs.ready[ist.running[k, pos]]
        ist.wake[k] = w
        return
    ist.wake[k] = np.inf
    dt = step_time_nb(tokens, attn, kv_read, prm.timing)
    t = now
    if m == ist.n_running[k] and steps_left > 1:
        t, dt = run_ahead_nb(
            k, now, t_next, m, steps_left, dt, attn, kv_read, rs, ist, prm, out, ty
        )
    ist.n_sched[k] = m
    ist.busy[k] = True
    ist.busy_until[k] = t + dt
    out.busy_s[k] += dt
    ty.ints[C_ITER] += 1


@njit(cache=True, nogil=True)
def simulate_nb(
    rq: Requests,
    prm: Params,
    pool: HbmPools,
    ts: TierPools,
    tp: TierParams,
    lk: LinkState,
    out: Outputs,
) -> None:
    """Replay every request; write per-request times and counters into ``out``.

    One kernel call runs the whole replay so the event loop never returns to Python. The
    loop is the reference's (:func:`kvtier.sim.reference.simulate_reference`) step for step:
    at each event, iteration ends (``end_iteration_nb``), the early-stop test, arrivals
    (``arrive_nb``: reject or ``route_nb``), then iteration starts (``start_iteration_nb``,
    which calls ``admit_nb``). Each step is inlined into this loop (``inline="always"``): a
    call would pass every state array as machine words, at every event. All state is local
    arrays sized from the inputs, which the wrapper has validated.
    """
    n = rq.arrival.shape[0]
    n_inst = prm.n_instances
    cap = prm.capacity
    R = prm.ring_len
    max_seqs = prm.max_seqs
    slot_off = np.zeros(n + 1, dtype=np.int64)
    for i in range(n):
        slot_off[i + 1] = slot_off[i] + rq.total_blocks[i]
    rs = RequestState(
        slot_off,
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.float64),
        np.full(n, -1, dtype=np.int64),
    )
    ist = InstanceState(
        np.full(n_inst, -1, dtype=np.int64),
        np.full(n_inst, -1, dtype=np.int64),
        np.zeros(n_inst, dtype=np.int64),
        np.empty((n_inst, max_seqs), dtype=np.int64),
        np.zeros(n_inst, dtype=np.int64),
        np.zeros((n_inst, max_seqs), dtype=np.int64),
        np.zeros((n_inst, max_seqs), dtype=np.int64),
        np.zeros(n_inst, dtype=np.int64),
        np.zeros(n_inst, dtype=np.bool_),
        np.zeros(n_inst, dtype=np.float64),
        np.full(n_inst, np.inf),
        np.empty(n_inst, dtype=np.int64),
        np.zeros(n_inst, dtype=np.int64),
        np.zeros(n_inst, dtype=np.float64),
        np.zeros(n_inst, dtype=np.float64),
        np.zeros(n_inst, dtype=np.int64),
        np.zeros(n_inst, dtype=np.int64),
        np.zeros(n_inst, dtype=np.int64),
        np.zeros(n_inst, dtype=np.int64),
        np.full(n_inst, cap, dtype=np.int64),
        np.full(n_inst, cap, dtype=np.int64),
    )
    # HBM pools, possibly kept from an earlier replay, are set here. Entries of a ring past
    # its live ones name slot 0 of the instance, so the allocation loop's look-ahead always
    # reads a slot record.
    for k in range(n_inst):
        for r in range(R):
            pool.rings[k * R + r] = k * cap + (r if r < cap else 0)
    for k in range(n_inst):
        for x in range(cap):
            g = k * cap + x
            pool.records[4 * g + POS] = x
            pool.records[4 * g + MAP] = -1
            pool.records[4 * g + REF] = 0
            pool.records[4 * g + BLOCK] = -1
            pool.stamps[g] = -1
    max_nb = 0
    for i in range(n):
        if rq.block_offsets[i + 1] - rq.block_offsets[i] > max_nb:
            max_nb = rq.block_offsets[i + 1] - rq.block_offsets[i]
    buf = Buffers(
        np.empty(max_nb + 1, dtype=np.int32),
        np.empty(max_nb + 1, dtype=np.int32),
        np.zeros(tp.n_tiers + 1, dtype=np.int64),
        np.full(4, -1, dtype=np.int64),
        np.empty(max_nb + 1, dtype=np.int32),
        np.empty(cap + 1, dtype=np.int32),
        np.empty(prm.token_budget // prm.block_tokens + max_seqs + 2, dtype=np.int32),
    )
    ty = Tally(np.zeros(7, dtype=np.int64), np.zeros(1, dtype=np.float64))
    nx = 0
    early = False
    now = 0.0
    while True:
        now = next_event_nb(rq, ist, nx, prm)
        if now == np.inf:
            break
        # Which instances act is found first in a loop of its own (handling one changes no
        # other instance's state), so the scan over every instance at every event does not
        # carry the large body's per-instance pointers.
        n_act = 0
        for k in range(n_inst):
            if ist.busy[k] and ist.busy_until[k] == now:
                ist.act[n_act] = k
                n_act += 1
        for a in range(n_act):
            end_iteration_nb(ist.act[a], now, rq, rs, ist, pool, ts, tp, lk, prm, out, ty, buf)
        if prm.slo_on and slo_missed_nb(prm, ty, n):
            early = True
            stop_early_nb(now, ist, prm, out, ty)
            break
        while nx < n and rq.arrival[nx] == now:
            arrive_nb(nx, rq, rs, ist, pool, prm, out, ty, buf)
            nx += 1
        n_act = 0
        for k in range(n_inst):
            if not ist.busy[k] and (ist.n_running[k] > 0 or ist.q_len[k] > 0):
                ist.act[n_act] = k
                n_act += 1
        t_next = rq.arrival[nx] if nx < n else np.inf
        for a in range(n_act):
            start_iteration_nb(
                ist.act[a], now, t_next, rq, rs, ist, pool, ts, tp, lk, prm, out, ty, buf
            )

    # Leave the map all zero again so the caller can reuse it for the next replay: every
    # non-zero entry is named by the MAP field of the slot it holds, so clearing those entries
    # costs one pass over the slots instead of one over the whole map.
    for x in range(n_inst * cap):
        mx = pool.records[4 * x + MAP]
        if mx >= 0:
            pool.slot_of[(x // cap) * prm.n_shared + mx] = 0
    out.stats[0] = ty.ints[C_ITER]
    out.stats[1] = 1.0 if early else 0.0
    out.stats[2] = now
