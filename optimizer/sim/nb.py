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
instance or the router reads changes, and no other instance schedules at those steps' ends (an
idle instance schedules only at its own events, ``ist.wake``); admission, if its queue is
blocked, stays blocked until a finish. An early stop in the middle takes back the steps begun
after it (``skip_back_nb``).

The kernels do no bounds checks: :mod:`kvtier.sim.engine` validates every array before the
call. The loops that run once per block (taking, registering and releasing slots; look-ups;
pins) index with unsigned integers (``u64``): numba then leaves out the wrap-around of negative
indices, a compare and select per access that took about a fifth of a replay. Every such index
is non-negative by construction. Those loops are functions of their own, each called for a
request's run of blocks and handed the HBM pools' tuple and the scalars of the run (a call
passes each array as machine words; :class:`kvtier.sim.nb_hbm.Run` bundles the run's
bounds). The semantics are in the docstring of :mod:`kvtier.sim.reference`.
Lower tiers are kernels in :mod:`kvtier.sim.nb_tiers`, called at the same hooks as the
reference's ``LowerTiers`` and only when there is work for them (each call hands over every
tier array).

State travels as named tuples (:class:`Requests`, :class:`Params`, :class:`HbmPools`,
:class:`Outputs`, and the per-request, per-instance and scratch state below; numba compiles a
``NamedTuple`` as a plain tuple, a field read by name costs nothing). Every kernel that
allocates nothing is compiled without numba's reference counting (``_nrt=False``): with it,
each read of an array field and each array passed to a call is an atomic increment and
decrement, which made the event loop about 1.6 times slower when it first took named tuples.
Only :func:`simulate_nb`, which allocates the state, counts references.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
import kvtier.sim.load_rules.dispatch  # noqa: F401  (its sources, for kvtier.jitcache)
import kvtier.sim.routers.dispatch  # noqa: F401  (its sources, for kvtier.jitcache)
from kvtier.policy.registries import (
    RESERVE,
    VLLM_V0,
    VLLM_V1,
)
from kvtier.sim.fault_step import faults_advance_nb
from kvtier.sim.gen import LOAD_RULE_FAMILY, ROUTER_FAMILY, twin
from kvtier.sim.nb_hbm import (
    BLOCK,
    MAP,
    POS,
    REF,
    Run,
    hbm_cache_generated_nb,
    hbm_churn_nb,
    hbm_lookup_nb,
    hbm_register_nb,
    hbm_release_nb,
    hbm_take_nb,
    hbm_touch_nb,
    u64,
)
from kvtier.sim.nb_loading import (
    issued_nb,
    loading_hit_nb,
    promoted_nb,
    share_loads_nb,
    unmark_loading_nb,
)
from kvtier.sim.nb_prefetch import (
    gated_until_nb,
    hit_lost_nb,
    prefetch_nb,
    prefetched_nb,
    retry_prefetches_nb,
)
from kvtier.sim.nb_state import (
    C_DEFERRED,
    C_EXTRAP,
    C_IN_FLIGHT,
    C_ITER,
    C_LOAD_STALLS,
    C_OVER_P99,
    C_OVER_P999,
    C_OVER_TBT,
    C_OVER_TPOT,
    C_REJECTED,
    C_STALLS,
    C_STAMP,
    INNER,
    IX_HEAD,
    IX_TAIL,
    N_COUNTERS,
    PASS_ALL,
    PASS_DECODE,
    PASS_PREFILL,
    PASS_PREFILL_YIELDS,
    PF_HELD,
    PF_PASSES,
    POLL_AT,
    POLL_BEFORE,
    POLL_ENDED,
    ZERO,
    Buffers,
    HbmPools,
    InstanceState,
    Outputs,
    Params,
    Requests,
    RequestState,
    Sim,
    Tally,
)
from kvtier.sim.nb_tbt import tbt_run_nb, tbt_tail_nb, tbt_token_nb
from kvtier.sim.nb_tiers import (
    LinkState,
    Prefill,
    Refs,
    TierParams,
    TierPools,
    computed_nb,
    generated_nb,
    hbm_evicted_nb,
    layerwise_ready_nb,
    load_nb,
    lookup_nb,
    ops_of_nb,
    refresh_nb,
    sighted_nb,
    window_end_nb,
)
from kvtier.sim.routers.epp_metrics import WIDTH as EPP_MX_WIDTH
from kvtier.sim.routers.epp_metrics import step_ended_nb, step_scheduled_nb
from kvtier.sim.slo import certainly_missed
from kvtier.sim.steptime.jit import (
    prefill_attn_ns_nb,
    prefill_out_of_range_nb,
    step_extrapolated_nb,
    step_time_nb,
)
from kvtier.sim.timing import T_FRONTEND, T_FRONTEND_TOKEN
from kvtier.sim.transfer import pd_transfer

pd_transfer_nb = njit(cache=True, nogil=True, _nrt=False, **INNER)(pd_transfer)
certainly_missed_nb = njit(cache=True, nogil=True, inline="always")(certainly_missed)
# the plug-in families' dispatch (kvtier.sim.gen): the checked-in modules, imported here so
# kvtier.jitcache follows their sources, unless plug-ins from outside the package extend them
route_nb = twin(ROUTER_FAMILY)
choose_nb = twin(LOAD_RULE_FAMILY)


@njit(cache=True, nogil=True, inline="always")
def next_arrival_nb(rq: Requests, nx: int, prm: Params, ty: Tally) -> float:
    """When request ``nx`` is sent: its trace time, or in a closed loop the later of that and
    the moment a slot freed (never while every slot is taken, nor, behind a round barrier,
    while a request of an earlier round is unfinished: the ``nx`` sent less those in flight
    are the finished, rejections included)."""
    if nx >= rq.arrival.shape[0]:
        return np.inf
    a = rq.arrival[nx]
    if prm.concurrency > 0:
        in_flight = ty.ints[C_IN_FLIGHT]
        if in_flight >= prm.concurrency:
            return np.inf
        if prm.round_size > 0 and nx - in_flight < (nx // prm.round_size) * prm.round_size:
            return np.inf
        gate = ty.ttft_sum[1]
        return a if a > gate else gate
    return a


@njit(cache=True, nogil=True, inline="always")
def next_event_nb(rq: Requests, ist: InstanceState, nx: int, prm: Params, ty: Tally) -> float:
    """The next instant: an arrival, an iteration's end or an idle instance's wake-up."""
    busy = ist.busy
    busy_until = ist.busy_until
    wake = ist.wake
    t_arr = next_arrival_nb(rq, nx, prm, ty)
    t_end = np.inf
    for k in range(prm.n_instances):
        if busy[k]:
            if busy_until[k] < t_end:
                t_end = busy_until[k]
        elif wake[k] < t_end:
            t_end = wake[k]
    return t_arr if t_arr < t_end else t_end


@njit(cache=True, nogil=True, inline="always")
def client_sees_nb(now: float, i: int, rq: Requests, prm: Params) -> float:
    """When the client sees what the engine produced for request ``i`` at ``now``: the
    front-end costs later, per request and per prompt token (the reference's
    ``client_sees``)."""
    return now + prm.timing[T_FRONTEND] + prm.timing[T_FRONTEND_TOKEN] * rq.input_tokens[i]


@njit(cache=True, nogil=True, inline="always")
def first_token_nb(i: int, now: float, rq: Requests, prm: Params, out: Outputs, ty: Tally) -> None:
    """Request ``i``'s prompt is complete: its first token at ``now`` (SLO counts)."""
    first_token = out.first_token
    arrival = rq.arrival
    ttft_sum = ty.ttft_sum
    slo_thresholds = prm.slo_thresholds
    ints = ty.ints
    ints[C_LOAD_STALLS] = 0  # the replay progresses
    seen = client_sees_nb(now, i, rq, prm)
    first_token[i] = seen
    if prm.track_tbt:  # its token intervals run from the per-request cost alone
        out.tbt_last[i] = now + prm.timing[T_FRONTEND]
    if prm.slo_on:
        ttft = seen - arrival[i]
        ttft_sum[0] += ttft
        if ttft > slo_thresholds[1]:
            ints[C_OVER_P99] += 1
        if ttft > slo_thresholds[2]:
            ints[C_OVER_P999] += 1


@njit(cache=True, nogil=True, inline="always")
def swa_skipped_nb(prm: Params, tokens: int) -> int:
    """Blocks of a sliding-window group behind the window once ``tokens`` are computed."""
    t = tokens - prm.swa_window + 1
    if t < 0:
        t = 0
    return t // prm.block_tokens


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def swa_churn_nb(sim: Sim, k: int, i: int, lo: int, hi: int, now: float) -> None:
    """The sliding-window copies of request ``i``'s blocks ``lo:hi`` left the window on
    instance ``k`` (the reference's ``swa_churn``): cached into the pool, the last first,
    ``prm.swa_blocks`` pool blocks each, a prompt block's first copy in the map; HBM's
    evictions go to the lower tiers, block by block."""
    prm = sim.prm
    ist = sim.ist
    buf = sim.buf
    rq = sim.rq
    start = rq.block_offsets[i]
    nb = rq.block_offsets[i + 1] - start
    for j in range(hi - 1, lo - 1, -1):
        name = -1
        if j < nb:
            mi = rq.shared[start + j]
            if mi >= 0:
                name = prm.swa_off + mi
        ne = hbm_churn_nb(
            sim.pool, ist, buf.evbuf, k, prm.ring_len, k * prm.n_shared, prm.swa_blocks, name
        )
        if ne > 0 and sim.tp.n_tiers > 0:
            hbm_evicted_nb(sim.ts, sim.tp, sim.lk, k, now, buf.evbuf, np.int64(ne))


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def swa_admitted_nb(sim: Sim, k: int, i: int, h: int, kv0: int, now: float) -> None:
    """Request ``i`` was admitted on instance ``k`` with ``h`` blocks hit and its KV up to
    ``kv0`` tokens hit or being loaded: the hit's sliding-window copies inside the window go
    to the free ring's tail, the loaded blocks' inside it are born (the reference's
    ``swa_admitted``)."""
    prm = sim.prm
    rq = sim.rq
    pool = sim.pool
    start = rq.block_offsets[i]
    base = k * prm.n_shared + prm.swa_off
    lo = swa_skipped_nb(prm, kv0)
    for j in range(lo, h):
        mi = rq.shared[start + j]
        if mi >= 0:
            s1 = pool.slot_of[base + mi]
            if s1 != 0:
                hbm_touch_nb(pool, sim.ist, k, prm.ring_len, s1 - 1)
    swa_churn_nb(sim, k, i, lo if lo > h else h, kv0 // prm.block_tokens, now)


@njit(cache=True, nogil=True, inline="always")
def generated_blocks_nb(sim: Sim, k: int, i: int, now: float) -> None:
    """Finished request ``i``'s full blocks of generated tokens, slots ``input // B`` to
    ``kv // B`` (those ``hbm_cache_generated_nb`` keeps), are copied into the tiers whose
    connector stores them (the reference's ``ReferenceReplay.store_generated``)."""
    tp = sim.tp
    B = sim.prm.block_tokens
    g1 = sim.rs.kv[i] // B
    if g1 > sim.rs.held[i]:
        g1 = sim.rs.held[i]
    cnt = g1 - sim.rq.input_tokens[i] // B
    if cnt > tp.gen_base[i + 1] - tp.gen_base[i]:
        cnt = tp.gen_base[i + 1] - tp.gen_base[i]
    if cnt > 0:
        generated_nb(sim.ts, tp, sim.lk, k, now, i, np.int64(cnt), sim.buf.gbuf)


@njit(cache=True, nogil=True, inline="always")
def finish_nb(sim: Sim, k: int, i: int, now: float) -> None:
    """Request ``i`` emitted its last token: record it, count its TPOT, free its slots."""
    rq = sim.rq
    rs = sim.rs
    ist = sim.ist
    pool = sim.pool
    prm = sim.prm
    out = sim.out
    ty = sim.ty
    finish = out.finish
    output_tokens = rq.output_tokens
    first_token = out.first_token
    slo_thresholds = prm.slo_thresholds
    ints = ty.ints
    ring_head = ist.ring_head
    ring_count = ist.ring_count
    free_len = ist.free_len
    slot_off = rs.slot_off
    seen = client_sees_nb(now, i, rq, prm)  # the whole response
    finish[i] = seen
    ints[C_IN_FLIGHT] -= 1
    ist.active_blocks[k] -= (rq.input_tokens[i] + prm.block_tokens - 1) // prm.block_tokens
    ty.ttft_sum[1] = seen
    if prm.slo_on:
        d = output_tokens[i] - 1
        if d < 1:
            d = 1
        if (seen - first_token[i]) / d > slo_thresholds[3]:
            ints[C_OVER_TPOT] += 1
    if prm.track_tbt:
        tail = tbt_tail_nb(i, out.tbt_heap, out.tbt_off, out.tbt_count)
        out.tbt_tail[i] = tail
        if prm.slo_on and tail > slo_thresholds[4]:
            ints[C_OVER_TBT] += 1
    if prm.swa_blocks > 0:
        # its sliding-window blocks not yet left behind (the reference's ``finish``)
        start = swa_skipped_nb(prm, rs.target[i])
        nb = rq.block_offsets[i + 1] - rq.block_offsets[i]
        if start > nb:
            start = nb
        if start < rs.computed_from[i]:
            start = rs.computed_from[i]
        swa_churn_nb(sim, k, i, start, rs.kv[i] // prm.block_tokens, now)
    if prm.prefix_caching:
        g1 = rs.kv[i] // prm.block_tokens
        if g1 > rs.held[i]:
            g1 = rs.held[i]
        hbm_cache_generated_nb(
            pool.records, pool.slots, slot_off[i] + rq.input_tokens[i] // prm.block_tokens,
            slot_off[i] + g1,
        )  # fmt: skip
    if len(sim.tp.gen_base) > 0:  # a tier's connector stores generated blocks
        generated_blocks_nb(sim, k, i, now)
    hbm_release_nb(
        pool, ring_head, ring_count, free_len, k, prm.ring_len, slot_off[i],
        slot_off[i] + rs.held[i],
    )  # fmt: skip


@njit(cache=True, nogil=True, inline="always")
def end_iteration_nb(sim: Sim, k: int, now: float) -> None:
    """Instance ``k``'s iteration ends: KV grows, full blocks register and are copied down,
    tokens are emitted. When a blocking connector's copies end later, the instance stays busy
    until they do and the tokens are emitted then (a second call, ``ist.saving``)."""
    rq = sim.rq
    rs = sim.rs
    ist = sim.ist
    pool = sim.pool
    ts = sim.ts
    tp = sim.tp
    lk = sim.lk
    prm = sim.prm
    out = sim.out
    ty = sim.ty
    buf = sim.buf
    boff = rq.block_offsets
    n_sched = ist.n_sched
    sched_pos = ist.sched_pos
    running = ist.running
    sched_q = ist.sched_q
    kv = rs.kv
    registered = rs.registered
    computed_from = rs.computed_from
    slot_off = rs.slot_off
    wbuf = buf.wbuf
    generated = rs.generated
    output_tokens = rq.output_tokens
    n_running = ist.n_running
    seg_steps = ist.seg_steps
    busy = ist.busy
    base = k * prm.n_shared
    saving = ist.saving
    busy_until = ist.busy_until
    target = rs.target
    fe = prm.timing[T_FRONTEND]  # a token is seen the front-end cost after its step
    marks = prm.defers_loading_hits or prm.shares_loading_hits
    if saving[k]:
        # the step's blocking stores have finished: its tokens are emitted now
        saving[k] = False
    else:
        nw = np.int64(0)  # (not a literal 0: the callee would compile a second overload)
        for idx in range(n_sched[k]):
            pos = sched_pos[k, idx]
            i = running[k, pos]
            kv[i] += sched_q[k, idx]
            nb = boff[i + 1] - boff[i]
            full = kv[i] // prm.block_tokens
            if full > nb:
                full = nb
            if full > registered[i]:
                w_from = computed_from[i] if tp.n_tiers > 0 else full  # computed: to lower tiers
                nw = hbm_register_nb(
                    pool, rq, base, boff[i], Run(slot_off[i], registered[i], full), wbuf, nw,
                    w_from,
                )  # fmt: skip
                registered[i] = full
            if marks and rs.loading_hi[i] > 0:  # its loaded blocks are in the cache now
                unmark_loading_nb(pool, prm, base, rq.shared, boff[i], rs, i)
            if prm.swa_blocks > 0 and kv[i] - sched_q[k, idx] < target[i]:  # a prefill chunk
                lo = swa_skipped_nb(prm, kv[i] - sched_q[k, idx])
                if lo > nb:
                    lo = nb
                if lo < computed_from[i]:
                    lo = computed_from[i]
                hi = swa_skipped_nb(prm, kv[i])
                if hi > nb:
                    hi = nb
                swa_churn_nb(sim, k, i, lo, hi, now)
        if nw > 0:  # (a call passes every tier array: skip it when there is nothing)
            saved = computed_nb(ts, tp, lk, k, now, wbuf, np.int64(nw))
            if saved > now:
                # a connector that blocks the step (vLLM's wait_for_save): the tokens wait
                saving[k] = True
                busy_until[k] = saved
                return
    n_done = 0
    prefill_step = False
    for idx in range(n_sched[k]):
        pos = sched_pos[k, idx]
        i = running[k, pos]
        if rs.pd_first[i]:
            seen_first_nb(i, rq, rs, prm, out, ty)
        was_prefill = kv[i] - sched_q[k, idx] < target[i]
        prefill_step = prefill_step or was_prefill
        done = False
        first = kv[i] == target[i] and generated[i] == 0
        if was_prefill and first and k < prm.n_prefill and output_tokens[i] > 1:
            hand_off_nb(sim, k, i, now)
            n_done += 1
            running[k, pos] = -1
        elif was_prefill:
            if first:
                generated[i] = 1
                first_token_nb(i, now, rq, prm, out, ty)
                if output_tokens[i] <= 1:
                    done = True
            elif kv[i] == target[i]:  # a preempted request has recomputed its KV
                generated[i] += 1
                ty.ints[C_LOAD_STALLS] = 0  # the replay progresses
                if prm.track_tbt:
                    tbt_token_nb(i, now + fe, out.tbt_heap, out.tbt_off, out.tbt_count,
                                 out.tbt_last)  # fmt: skip
                if generated[i] >= output_tokens[i]:
                    done = True
        else:
            generated[i] += 1
            ty.ints[C_LOAD_STALLS] = 0  # the replay progresses
            if prm.track_tbt:
                tbt_token_nb(i, now + fe, out.tbt_heap, out.tbt_off, out.tbt_count,
                             out.tbt_last)  # fmt: skip
            if generated[i] >= output_tokens[i]:
                done = True
        if done:
            finish_nb(sim, k, i, now)
            n_done += 1
            running[k, pos] = -1
    if n_done:
        w = 0
        for pos in range(n_running[k]):
            if running[k, pos] >= 0:
                running[k, w] = running[k, pos]
                w += 1
        n_running[k] = w
    # a request runs on: its next step was scheduled while this one ran (async scheduling)
    ist.runs_on_at[k] = now if n_sched[k] > n_done else -np.inf
    ist.marks[POLL_ENDED, k] = now
    n_sched[k] = 0
    seg_steps[k] = 0
    busy[k] = False
    if prm.epp_mx_dt > 0.0:  # the step's statistics, as the engine reports them (llmd_epp)
        step_ended_nb(ist.epp_mx, k, now, ist.free_len[k], prefill_step, prm.epp_mx_every)
    # with work left it schedules its next iteration now
    ist.wake[k] = now if n_running[k] > 0 or ist.q_len[k] > 0 else np.inf


@njit(cache=True, nogil=True, inline="always")
def slo_missed_nb(prm: Params, ty: Tally, n: int) -> bool:
    """Is the SLO certainly missed already? (:func:`kvtier.sim.slo.certainly_missed` over the
    tally's counts, as ``SloTracker.missed`` over the reference's.)"""
    c = ty.ints
    return certainly_missed_nb(
        c[C_REJECTED], ty.ttft_sum[0] / n, c[C_OVER_P99], c[C_OVER_P999], c[C_OVER_TPOT],
        c[C_OVER_TBT], prm.slo_thresholds, prm.slo_limits,
    )  # fmt: skip


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def skip_back_nb(
    k: int, now: float, ist: InstanceState, out: Outputs, timing: np.ndarray, ints: np.ndarray
) -> int:
    """Undo instance ``k``'s decode steps that start at or after an early stop at ``now``.

    Step by step, a replay stopped at ``now`` has begun (counted, and added to the busy time)
    exactly the steps that started before ``now``. The steps run ahead are recomputed from
    their first one with the same operations, so the busy time is the same float as step by
    step. Returns the number of steps to take off the iteration count (and takes the steps not
    begun that used extrapolated step times off ``ints[C_EXTRAP]``).
    """
    m = ist.seg_m[k]
    attn = ist.seg_attn[k]
    kv_read = ist.seg_kv[k]
    t = ist.seg_t0[k]
    busy = ist.seg_busy[k]
    begun = 0
    while begun < ist.seg_steps[k] and t < now:
        dt = step_time_nb(m, attn, kv_read, m, kv_read, ZERO, timing)
        busy += dt
        t += dt
        begun += 1
        attn += 2 * m
        kv_read += m
    out.busy_s[k] = busy
    for _ in range(begun, ist.seg_steps[k]):
        ints[C_EXTRAP] -= step_extrapolated_nb(m, m, kv_read, ZERO, timing)
        kv_read += m
    return ist.seg_steps[k] - begun


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def stop_early_nb(now: float, ist: InstanceState, prm: Params, out: Outputs, ty: Tally) -> None:
    """Stop at ``now``: take back the decode steps run ahead that begin at or after it."""
    for k in range(prm.n_instances):
        if ist.seg_steps[k] > 0:
            timing = prm.timings[prm.pool_of[k]]
            ty.ints[C_ITER] -= skip_back_nb(k, now, ist, out, timing, ty.ints)


@njit(cache=True, nogil=True, inline="always")
def arrive_nb(sim: Sim, i: int) -> None:
    """Request ``i`` arrives: rejected if it can never fit, else routed to a waiting queue."""
    rq = sim.rq
    rs = sim.rs
    ist = sim.ist
    prm = sim.prm
    out = sim.out
    ty = sim.ty
    total_blocks = rq.total_blocks
    ints = ty.ints
    instance = out.instance
    q_tail = ist.q_tail
    q_head = ist.q_head
    next_waiting = rs.next_waiting
    q_len = ist.q_len
    if total_blocks[i] > prm.fit_blocks or (
        prm.scheduler == VLLM_V0 and rq.input_tokens[i] > prm.token_budget
    ):  # (vLLM v0 ignores a prompt longer than its token budget)
        ints[C_REJECTED] += 1
        return
    ints[C_IN_FLIGHT] += 1
    k = route_nb(sim, i)
    instance[i] = k
    ist.active_blocks[k] += (rq.input_tokens[i] + prm.block_tokens - 1) // prm.block_tokens
    if q_tail[k] < 0:
        q_head[k] = i
    else:
        next_waiting[q_tail[k]] = i
    q_tail[k] = i
    q_len[k] += 1
    ist.wake[k] = rq.arrival[i]  # its scheduler sees the new request now
    if prm.prefetches_at_arrival:
        prefetch_nb(sim, k, i, rq.arrival[i])


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def admission_gate_nb(prm, tokens, B, h, kv0, need, v0, capacity):  # noqa: ANN001, ANN201
    """The fresh blocks a vllm_v1 admission checks for: its first chunk's ``need``, or under
    vLLM's scheduler_reserve_full_isl (``Params.reserves_full``) those of its whole sequence
    of ``tokens`` less its ``h`` hits when more, the sliding-window group's included: its
    blocks from the window's start after the ``kv0`` tokens hit or loaded, the sequence's
    count capped at ``Params.swa_admission_blocks``, and never more than an idle instance of
    ``capacity`` blocks has beside the hits (the reference's ``admission_gate``)."""
    if prm.reserves_full and not v0:
        blocks = (tokens + B - 1) // B
        full = blocks - h
        if prm.swa_blocks > 0:
            window = blocks
            if 0 < prm.swa_admission_blocks < window:
                window = prm.swa_admission_blocks
            behind = (kv0 - prm.swa_window + 1) // B if kv0 >= prm.swa_window else 0
            if behind < h:
                behind = h
            if window > behind:
                full += prm.swa_blocks * (window - behind)
            if full > capacity - h:
                full = capacity - h  # vLLM sizes its pool so that one request passes
        if full > need:
            return full
    return need


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def chosen_run_nb(sim, k, now, n_src, h, timing, bo):  # noqa: ANN001, ANN201
    """How many of the ``n_src`` blocks found below HBM (from ``h`` on) to load: the load
    rule's choice, cut back, when it stops short of the run, to where the sliding-window
    copies allow (the reference's ``LowerTiers.chosen_run``)."""
    loaded = choose_nb(sim, k, now, n_src, h, timing)
    if sim.tp.win_copies > 0 and 0 < loaded < n_src:
        end = window_end_nb(sim.ts, sim.tp, k, sim.rq.block_ids, bo, h, h + loaded)
        loaded = end - h
    return loaded


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def admit_nb(
    sim: Sim, k: int, i: int, now: float, budget: int, others: bool, issue: float, keep: int
) -> bool:
    """Admit request ``i`` on instance ``k`` if its fresh slots fit: look up its prefix (HBM,
    then the lower tiers), load (starting at ``issue``: ``now``, or with polls_loads when the
    step was decided), pin the hits and take the rest from the free ring (the whole
    footprint, or with vllm_v1 the blocks of its first chunk of ``budget`` tokens, leaving the
    watermark free when ``others`` are scheduled in this iteration, and ``keep`` blocks more:
    prefill_first's running decodes' next blocks; vllm_v0: the blocks of its whole prompt,
    leaving the watermark free when the instance runs anything)."""
    rq = sim.rq
    rs = sim.rs
    ist = sim.ist
    pool = sim.pool
    ts = sim.ts
    tp = sim.tp
    lk = sim.lk
    prm = sim.prm
    out = sim.out
    ty = sim.ty
    buf = sim.buf
    boff = rq.block_offsets
    slot_of = pool.slot_of
    shared = rq.shared
    found = buf.found
    total_blocks = rq.total_blocks
    ints = ty.ints
    sl = pool.records
    stamps = pool.stamps
    free_len = ist.free_len
    ready = rs.ready
    block_ids = rq.block_ids
    src = buf.src
    counts = buf.counts
    timing = prm.timings[prm.pool_of[k]]  # this instance's pool's step times
    load_s = out.load_s
    loaded_blocks = out.loaded_blocks
    hitbuf = buf.hitbuf
    slot_off = rs.slot_off
    slots = pool.slots
    evbuf = buf.evbuf
    ring_head = ist.ring_head
    ring_count = ist.ring_count
    kv = rs.kv
    registered = rs.registered
    computed_from = rs.computed_from
    hit_blocks = out.hit_blocks
    B = prm.block_tokens
    base = k * prm.n_shared
    if rs.handed[i]:
        return admit_handed_nb(sim, k, i, now)
    target = rs.target
    held = rs.held
    grows = prm.scheduler != RESERVE
    v0 = prm.scheduler == VLLM_V0
    nb = boff[i + 1] - boff[i]
    hcap = (target[i] - 1) // B
    if nb < hcap:
        hcap = nb
    h = (
        hbm_lookup_nb(slot_of, base, shared, boff[i], hcap, found, prm.swa_off, prm.swa_need)
        if prm.prefix_caching
        else 0
    )
    n_src = 0
    loaded = 0
    reserve = 0
    if grows:
        # vLLM V1's allocate_slots: the blocks of the tokens this step computes
        if tp.n_tiers > 0:
            n_src = lookup_nb(ts, tp, k, Refs(block_ids, boff[i], h, hcap), src, now)
            if prm.defers_loading_hits and loading_hit_nb(
                pool.loading, base, shared, boff[i] + h, n_src
            ):
                ints[C_DEFERRED] = 1  # another request is loading its hits: skipped
                return False
            loaded = chosen_run_nb(sim, k, now, n_src, h, timing, boff[i])
        kv0 = (h + loaded) * B
        q0 = target[i] - kv0
        if q0 > budget and not v0:
            q0 = budget
        need = (kv0 + q0 + B - 1) // B - h
        if others or (v0 and ist.n_running[k] > 0):
            reserve = prm.watermarks[k]
        reserve += keep
        gate = admission_gate_nb(prm, target[i], B, h, kv0, need, v0, prm.capacities[k])
    else:
        need = gate = total_blocks[i] - h
    ints[C_STAMP] += 1
    stamp = ints[C_STAMP]
    pinned_free = 0  # distinct hit slots now in the free ring
    for j in range(h):
        s = found[u64(j)]
        if sl[u64(4 * s + REF)] == 0 and stamps[u64(s)] != stamp:
            stamps[u64(s)] = stamp
            pinned_free += 1
    if gate + reserve > free_len[k] - pinned_free:
        return False
    ready[i] = now
    rs.polled[i] = False
    if tp.n_tiers > 0:
        if not grows:
            n_src = lookup_nb(ts, tp, k, Refs(block_ids, boff[i], h, hcap), src, now)
            loaded = chosen_run_nb(sim, k, now, n_src, h, timing, boff[i])
        if loaded > 0:
            done_tokens = (h + loaded) * B
            ready[i] = load_nb(
                ts, tp, lk, k, issue, Refs(block_ids, boff[i], h, h + loaded), buf,
                Prefill(target[i] - done_tokens, done_tokens, timing),
            )  # fmt: skip
            rs.polled[i] = prm.polls_loads
            if prm.defers_loading_hits:
                issued_nb(pool, rs, i, base, shared, boff[i], h, h + loaded)
            if out.preemptions[i] == 0:  # the first admission's (the prompt's)
                load_s[i] = ready[i] - issue
                for t in range(tp.n_tiers):  # load_nb counted the loaded blocks per tier
                    loaded_blocks[i, t] = counts[t]
        if tp.counts_sightings:  # only such a write policy reads the sightings
            sighted_nb(ts, tp, lk, k, now, Refs(block_ids, boff[i], np.int64(0), nb), h, hitbuf)
    # pin the hits
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
    r, left, ne = hbm_take_nb(
        pool, evbuf, k * prm.ring_len, prm.ring_len, base, Run(so, h, h + need), ring_head[k],
        ring_count[k],
    )  # fmt: skip
    free_len[k] -= need
    held[i] = h + need
    ring_head[k] = r
    ring_count[k] = left
    if ne > 0 and tp.n_tiers > 0:
        hbm_evicted_nb(ts, tp, lk, k, now, evbuf, np.int64(ne))
    if prm.swa_blocks > 0 and h + loaded > 0:
        swa_admitted_nb(sim, k, i, h, (h + loaded) * B, now)
    kv[i] = (h + loaded) * B
    registered[i] = h
    computed_from[i] = h + loaded
    if prm.shares_loading_hits:
        share_loads_nb(sim, k, i, h, loaded)
    if out.preemptions[i] == 0:  # the first admission's hits (the prompt's)
        hit_blocks[i] = h
    return True


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def admit_handed_nb(sim: Sim, k: int, i: int, now: float) -> bool:
    """Decode instance ``k`` admits request ``i``, whose KV a prefill instance computed: slots
    for its prompt and first decode token (``reserve``: its footprint); with ``pd_trim`` the
    leading blocks cached here are pinned and only the rest is pulled, and the pulled blocks
    are cached at the end of its first iteration here (the reference's ``admit_handed``)."""
    rq = sim.rq
    rs = sim.rs
    ist = sim.ist
    pool = sim.pool
    ts = sim.ts
    tp = sim.tp
    lk = sim.lk
    prm = sim.prm
    out = sim.out
    ty = sim.ty
    buf = sim.buf
    B = prm.block_tokens
    kv0 = rq.input_tokens[i]
    boff = rq.block_offsets
    nb = boff[i + 1] - boff[i]
    sl = pool.records
    found = buf.found
    h = 0
    pinned_free = 0
    if prm.pd_trim and prm.prefix_caching:
        hcap = (kv0 - 1) // B
        if nb < hcap:
            hcap = nb
        h = hbm_lookup_nb(
            pool.slot_of, k * prm.n_shared, rq.shared, boff[i], hcap, found, prm.swa_off,
            prm.swa_need,
        )  # fmt: skip
        ty.ints[C_STAMP] += 1
        stamp = ty.ints[C_STAMP]
        for j in range(h):  # distinct hit slots now in the free ring
            s = found[u64(j)]
            if sl[u64(4 * s + REF)] == 0 and pool.stamps[u64(s)] != stamp:
                pool.stamps[u64(s)] = stamp
                pinned_free += 1
    need = ((kv0 + B) // B if prm.scheduler != RESERVE else rq.total_blocks[i]) - h
    if need > ist.free_len[k] - pinned_free:
        return False
    so = rs.slot_off[i]
    for j in range(h):  # pin the hits
        s = found[u64(j)]
        c = sl[u64(4 * s + REF)]
        if c == 0:
            sl[u64(4 * s + POS)] = -1  # its ring entry is now stale
            ist.free_len[k] -= 1
        sl[u64(4 * s + REF)] = c + 1
        pool.slots[u64(so + j)] = s
    R = prm.ring_len
    r, left, ne = hbm_take_nb(
        pool, buf.evbuf, k * R, R, k * prm.n_shared, Run(so, h, h + need), ist.ring_head[k],
        ist.ring_count[k],
    )  # fmt: skip
    ist.ring_head[k] = r
    ist.ring_count[k] = left
    ist.free_len[k] -= need
    rs.held[i] = h + need
    if ne > 0 and tp.n_tiers > 0:
        hbm_evicted_nb(ts, tp, lk, k, now, buf.evbuf, np.int64(ne))
    if prm.swa_blocks > 0 and h > 0:
        swa_admitted_nb(sim, k, i, h, h * B, now)
    rs.handed[i] = False
    rs.polled[i] = False  # its KV's arrival is not read through the connector poll
    rs.kv[i] = kv0
    rs.target[i] = kv0
    rs.registered[i] = h if prm.pd_trim else nb  # else never cached on the decode side
    rs.computed_from[i] = nb  # pulled, not computed: no copies to lower tiers
    out.decode_hit_blocks[i] = h
    if not prm.pd_layerwise:
        # the decode side pulls the KV past its hit into the blocks it has just allocated
        blocks = (kv0 + B - 1) // B - h
        end = pd_move_nb(ist, lk, prm, out.instance[i], k, now, k, blocks)
        arrived_nb(i, end, rq, rs, ist, prm, out, ty)
    return True


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def pd_move_nb(
    ist: InstanceState, lk: LinkState, prm: Params, p: int, d: int, now: float, worker: int,
    blocks: int,
) -> float:  # fmt: skip
    """Move ``blocks`` blocks of a request's prompt KV from instance ``p`` to ``d`` through the
    P/D connector, on instance ``worker``'s workers; returns when it ends (the reference's
    ``pd_move``)."""
    w = prm.pd_workers
    return pd_transfer_nb(
        now, blocks * prm.pd_block_bytes,
        ops_of_nb(prm.pd_unit, blocks, prm.pd_fragments, prm.pd_coalesce),
        prm.pd_rpc_s, prm.pd_stream_bw, prm.pd_stage_bw, prm.pd_serial, prm.pd_depth,
        prm.pd_lat[p, d], prm.pd_path[p, d], prm.pd_queue[p, d], prm.pd_scale[p, d],
        prm.pd_bw_read, prm.pd_bw_write, prm.pd_duplex, prm.pd_n_links, lk.free, lk.busy,
        lk.moved, ist.pd_wfree, worker * w, w, ist.pd_wbusy,
    )  # fmt: skip


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def arrived_nb(
    i: int,
    end: float,
    rq: Requests,
    rs: RequestState,
    ist: InstanceState,
    prm: Params,
    out: Outputs,
    ty: Tally,
) -> None:
    """Request ``i``'s KV is on its decode instance at ``end`` (the reference's ``arrived``):
    its prefill instance's blocks freed from then on (waking it if idle with work)."""
    if end > rs.ready[i]:
        rs.ready[i] = end
    rs.release_at[i] = end
    p = out.instance[i]
    if not ist.busy[p] and (ist.n_running[p] > 0 or ist.q_len[p] > 0) and end < ist.wake[p]:
        ist.wake[p] = end


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def seen_first_nb(
    i: int, rq: Requests, rs: RequestState, prm: Params, out: Outputs, ty: Tally
) -> None:
    """Handed-over request ``i``'s first iteration on its decode instance has ended: its first
    token was seen at its KV's arrival (the reference's ``seen_first``). That iteration is
    never run ahead: the first token counts in the SLO's early stop at its end."""
    rs.pd_first[i] = False
    first_token_nb(i, rs.ready[i], rq, prm, out, ty)
    out.kv_transfer_s[i] = rs.ready[i] - rs.handed_at[i]


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def release_held_nb(k: int, now: float, rs: RequestState, ist: InstanceState, pool: HbmPools,
                    prm: Params) -> None:  # fmt: skip
    """Prefill instance ``k`` frees the blocks of handed-over requests whose KV has been
    moved by ``now``, in hand-off order (the reference's ``release_held``)."""
    prev = -1
    i = ist.held_head[k]
    while i >= 0:
        nxt = rs.next_held[i]
        if rs.release_at[i] <= now:
            j0 = prm.pd_held_base + rs.slot_off[i]
            hbm_release_nb(
                pool, ist.ring_head, ist.ring_count, ist.free_len, k, prm.ring_len, j0,
                j0 + rs.pf_held[i],
            )  # fmt: skip
            rs.pf_held[i] = 0
            if prev < 0:
                ist.held_head[k] = nxt
            else:
                rs.next_held[prev] = nxt
            if nxt < 0:
                ist.held_tail[k] = prev
        else:
            prev = i
        i = nxt


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hand_off_nb(sim: Sim, k: int, i: int, now: float) -> None:
    """Disaggregated: request ``i``'s prompt is complete on prefill instance ``k``, which holds
    its slots until its KV has been moved; it joins the least loaded decode instance (the
    reference's ``hand_off``)."""
    rq = sim.rq
    rs = sim.rs
    ist = sim.ist
    pool = sim.pool
    prm = sim.prm
    out = sim.out
    ty = sim.ty
    so = rs.slot_off[i]
    hb = prm.pd_held_base + so
    for j in range(rs.held[i]):
        pool.slots[u64(hb + j)] = pool.slots[u64(so + j)]
    rs.pf_held[i] = rs.held[i]
    rs.held[i] = 0
    rs.release_at[i] = np.inf
    rs.handed_at[i] = now
    rs.next_held[i] = -1
    if ist.held_tail[k] < 0:
        ist.held_head[k] = i
    else:
        rs.next_held[ist.held_tail[k]] = i
    ist.held_tail[k] = i
    d = prm.n_prefill
    best = ist.q_len[d] + ist.n_running[d]
    for dd in range(prm.n_prefill + 1, prm.n_instances):
        ld = ist.q_len[dd] + ist.n_running[dd]
        if ld < best:
            best = ld
            d = dd
    rs.generated[i] = 1
    out.decode_instance[i] = d
    rs.handed[i] = True
    rs.pd_first[i] = True
    rs.ready[i] = now
    if prm.pd_layerwise:
        blocks = (rq.input_tokens[i] + prm.block_tokens - 1) // prm.block_tokens
        fin = pd_move_nb(ist, sim.lk, prm, k, d, now, k, blocks)
        arrived_nb(i, layerwise_ready_nb(now, fin, prm.pd_layers, ist.iter_dt[k]), rq, rs, ist,
                   prm, out, ty)  # fmt: skip
    blocks = (rq.input_tokens[i] + prm.block_tokens - 1) // prm.block_tokens
    ist.active_blocks[k] -= blocks
    ist.active_blocks[d] += blocks
    rs.next_waiting[i] = -1
    if ist.q_tail[d] < 0:
        ist.q_head[d] = i
    else:
        rs.next_waiting[ist.q_tail[d]] = i
    ist.q_tail[d] = i
    ist.q_len[d] += 1
    ist.wake[d] = now  # its scheduler sees the handed-over request now


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def grow_nb(sim: Sim, k: int, i: int, tokens: int, now: float) -> bool:
    """vllm_v1: take the slots request ``i`` needs to hold ``tokens`` tokens of KV from the free
    ring's head; False (nothing taken) when too few are free (the reference's ``grow``)."""
    rs = sim.rs
    ist = sim.ist
    pool = sim.pool
    ts = sim.ts
    tp = sim.tp
    lk = sim.lk
    prm = sim.prm
    buf = sim.buf
    B = prm.block_tokens
    held = rs.held
    need = (tokens + B - 1) // B - held[i]
    if need <= 0:
        return True
    if need > ist.free_len[k]:
        return False
    R = prm.ring_len
    r, left, ne = hbm_take_nb(
        pool, buf.evbuf, k * R, R, k * prm.n_shared, Run(rs.slot_off[i], held[i], held[i] + need),
        ist.ring_head[k], ist.ring_count[k],
    )  # fmt: skip
    ist.ring_head[k] = r
    ist.ring_count[k] = left
    ist.free_len[k] -= need
    held[i] += need
    if ne > 0 and tp.n_tiers > 0:
        hbm_evicted_nb(ts, tp, lk, k, now, buf.evbuf, np.int64(ne))
    return True


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def preempt_nb(
    k: int,
    j: int,
    rq: Requests,
    rs: RequestState,
    ist: InstanceState,
    pool: HbmPools,
    prm: Params,
    out: Outputs,
) -> int:
    """Running request ``j`` of instance ``k`` (vllm_v1: the most recently admitted; vllm_v0:
    the most recently admitted whose KV is not still arriving) gives its slots back and
    returns to the head of the queue, to recompute its prompt and generated tokens (the
    reference's ``preempt``); returns it."""
    n = ist.n_running[k] - 1
    i = ist.running[k, j]
    for x in range(j, n):
        ist.running[k, x] = ist.running[k, x + 1]
    ist.n_running[k] = n
    hbm_release_nb(
        pool, ist.ring_head, ist.ring_count, ist.free_len, k, prm.ring_len, rs.slot_off[i],
        rs.slot_off[i] + rs.held[i],
    )  # fmt: skip
    rs.held[i] = 0
    if rs.loading_hi[i] > 0:  # (loaded, not yet run: its blocks are given back uncached)
        unmark_loading_nb(pool, prm, k * prm.n_shared, rq.shared, rq.block_offsets[i], rs, i)
    out.preemptions[i] += 1
    out.preempted_tokens[i] += rs.kv[i]
    rs.target[i] = rq.input_tokens[i] + rs.generated[i]
    rs.kv[i] = 0
    rs.registered[i] = 0
    rs.computed_from[i] = 0
    rs.handed[i] = rs.pd_first[i]  # its KV had not arrived: it is pulled again
    rs.next_waiting[i] = ist.q_head[k]
    ist.q_head[k] = i
    if ist.q_tail[k] < 0:
        ist.q_tail[k] = i
    ist.q_len[k] += 1
    return i


class AheadPlan(NamedTuple):
    """A decode-only batch as :func:`run_ahead_nb` takes it: run until ``t_next`` at most,
    ``m`` requests, ``steps_left`` steps before the first finishes, the first step's time and
    its attention and KV-read sums, and whether a step allocates its new blocks (``alloc``)."""

    t_next: float
    m: int
    steps_left: int
    dt: float
    attn: int
    kv_read: int
    alloc: bool


@njit(cache=True, nogil=True, inline="always")
def run_ahead_nb(
    sim: Sim, k: int, now: float, plan: AheadPlan, keep_free: bool
) -> tuple[float, float]:
    """Run a decode-only batch's steps ahead of the event loop; (last step's start, its time).

    With ``alloc`` (vllm_v1, where HBM's evictions have no effect below), a step in which a
    request starts a new block takes it from the free ring as the reference's ``grow`` does,
    in the same order (step by step, in batch order), and the run stops before a step whose
    blocks are not free (that step preempts, step by step). With ``keep_free`` (vllm_v0, whose
    every decode needs a free block) it stops before a step that would leave none free.

    With every running request in the batch and decoding, until one of them finishes or the
    next request arrives (``t_next``) its steps change nothing another instance or the router
    sees, and each step's sums grow by a fixed amount. The reference runs them as iterations
    one by one (``start_iteration`` / ``end_iteration``); the times here are computed by the
    same operations in the same order (see :func:`skip_back_nb`). No reference counterpart.
    With ``prm.track_tbt`` each step's end (plus the front-end cost) is kept in
    ``buf.tbt_seen`` and, after the loop, each request's intervals to those tokens join its
    longest ones (``tbt_run_nb``: the same subtractions as token by token, one request's
    slice at a time). A handed-over request's first step there is never run ahead.
    """
    t_next, m, steps_left, dt, attn, kv_read, alloc = plan
    rs = sim.rs
    ist = sim.ist
    prm = sim.prm
    out = sim.out
    ty = sim.ty
    pool = sim.pool
    buf = sim.buf
    seg_t0 = ist.seg_t0
    seg_m = ist.seg_m
    seg_busy = ist.seg_busy
    busy_s = out.busy_s
    seg_attn = ist.seg_attn
    seg_kv = ist.seg_kv
    timing = prm.timings[prm.pool_of[k]]  # this instance's pool's step times
    running = ist.running
    sched_pos = ist.sched_pos
    kv = rs.kv
    generated = rs.generated
    ints = ty.ints
    seg_steps = ist.seg_steps
    t = now
    seg_t0[k] = now
    seg_m[k] = m
    seg_busy[k] = busy_s[k]
    seg_attn[k] = attn
    seg_kv[k] = kv_read
    B = prm.block_tokens
    bk_start = buf.bk_start
    bk_req = buf.bk_req
    if alloc:
        # request idx needs a block at the extra steps s with (kv + s) % B == 0
        for r in range(B + 1):
            bk_start[r] = 0
        for idx in range(m):
            bk_start[(B - kv[running[k, sched_pos[k, idx]]] % B) % B + 1] += 1
        for r in range(B):
            bk_start[r + 1] += bk_start[r]
        for idx in range(m):
            r = (B - kv[running[k, sched_pos[k, idx]]] % B) % B
            bk_req[bk_start[r]] = idx
            bk_start[r] += 1
        for r in range(B, 0, -1):  # back to each group's start
            bk_start[r] = bk_start[r - 1]
        bk_start[0] = 0
    s = 0
    records = prm.epp_mx_dt > 0.0  # each step's statistics (llmd_epp), as step by step
    while s < steps_left - 1 and t + dt < t_next:
        free_at_end = ist.free_len[k]  # (this step's blocks taken, not the next one's)
        if alloc:
            r = (s + 1) % B
            e = bk_start[r + 1] - bk_start[r]
            if e > ist.free_len[k] or (keep_free and e >= ist.free_len[k]):
                break  # step by step from here: it may preempt
            for x in range(bk_start[r], bk_start[r + 1]):
                i = running[k, sched_pos[k, bk_req[x]]]
                hr, hl, _ = hbm_take_nb(
                    pool, buf.evbuf, k * prm.ring_len, prm.ring_len, k * prm.n_shared,
                    Run(rs.slot_off[i], rs.held[i], rs.held[i] + 1), ist.ring_head[k],
                    ist.ring_count[k],
                )  # fmt: skip
                ist.ring_head[k] = hr
                ist.ring_count[k] = hl
                rs.held[i] += 1
            ist.free_len[k] -= e
        busy_s[k] += dt
        t += dt
        if records:  # (a decode step)
            step_ended_nb(ist.epp_mx, k, t, free_at_end, False, prm.epp_mx_every)
        if prm.track_tbt:  # every request of the batch emits a token at the step's end
            buf.tbt_seen[s] = t + prm.timing[T_FRONTEND]
        s += 1
        attn += 2 * m
        kv_read += m
        dt = step_time_nb(m, attn, kv_read, m, kv_read, ZERO, timing)
        ints[C_EXTRAP] += step_extrapolated_nb(m, m, kv_read, ZERO, timing)
    if s > 0:
        for idx in range(m):
            i = running[k, sched_pos[k, idx]]
            kv[i] += s
            generated[i] += s
            if prm.track_tbt:
                tbt_run_nb(i, buf.tbt_seen, s, out.tbt_heap, out.tbt_off, out.tbt_count,
                           out.tbt_last)  # fmt: skip
        ints[C_ITER] += s
    seg_steps[k] = s + 1 if s > 0 else 0
    return t, dt


@njit(cache=True, nogil=True, inline="always")
def stalled_nb(sim: Sim, i: int, k: int, now: float) -> None:
    """Request ``i`` preempted itself on instance ``k`` with no other request running there
    whose KV is in place: a stall (the reference's ``stalled``), counted in ``C_STALLS``
    while the instance holds blocks for handed-over requests, else in ``C_LOAD_STALLS``
    (behind requests loading from a lower tier; reset by every token emitted). The first
    stall past the limit (requests x the tokens of the largest instance's blocks) is recorded
    in ``out.stats[4:8]`` and the event loop stops at the end of this event; the wrapper
    raises the reference's error."""
    ints = sim.ty.ints
    c = C_STALLS if sim.ist.held_head[k] >= 0 else C_LOAD_STALLS
    ints[c] += 1
    stats = sim.out.stats
    limit = sim.rq.arrival.shape[0] * sim.prm.capacity * sim.prm.block_tokens
    if ints[c] > limit and stats[4] < 0:
        stats[4] = i
        stats[5] = k
        stats[6] = now
        stats[7] = 1.0 if c == C_LOAD_STALLS else 0.0


@njit(cache=True, nogil=True, inline="always")
def schedule_v0_nb(
    sim: Sim, k: int, now: float, cascade: bool
) -> tuple[int, int, bool, float, float]:
    """vllm_v0: the iteration's requests into ``sched_pos`` / ``sched_q`` (the reference's
    ``schedule_v0``): prompts whole and FCFS, in an iteration of their own; else every running
    request decodes, each needing a free block, preempting from the end; a prompt admitted
    with a lower-tier load (not a handed-over request) takes its uncached tokens from the
    budget and the iteration runs nothing until its last load ends, then the loaded prompts'
    remainder runs with no further admission. Returns the scheduled count, the decode steps
    before the first of the batch finishes (0: not decode-only), whether it preempted, the
    latest load end among running requests and the end of the iteration's last lower-tier
    load (``-inf``: none)."""
    rq = sim.rq
    rs = sim.rs
    ist = sim.ist
    pool = sim.pool
    prm = sim.prm
    out = sim.out
    boff = rq.block_offsets
    n_running = ist.n_running
    running = ist.running
    ready = rs.ready
    kv = rs.kv
    target = rs.target
    registered = rs.registered
    generated = rs.generated
    output_tokens = rq.output_tokens
    sched_pos = ist.sched_pos
    sched_q = ist.sched_q
    q_len = ist.q_len
    q_head = ist.q_head
    q_tail = ist.q_tail
    next_waiting = rs.next_waiting
    budget = prm.token_budget
    last_ready = now
    m = 0
    for pos in range(n_running[k]):  # prompts whose lower-tier loads have ended
        i = running[k, pos]
        if ready[i] > now:
            if ready[i] > last_ready:
                last_ready = ready[i]
            continue
        if kv[i] >= target[i] or budget == 0:
            continue
        q = target[i] - kv[i]
        if m > 0 and q > budget:
            continue
        sched_pos[k, m] = pos
        sched_q[k, m] = q
        m += 1
        budget = budget - q if q < budget else 0
    resumed = m > 0  # the loaded prompts' step: nobody else is admitted to it
    load_end = -np.inf  # the end of the last lower-tier load admitted in this iteration
    while not resumed and budget > 0 and q_len[k] > 0 and n_running[k] < prm.max_seqs:
        i = q_head[k]
        handed = rs.handed[i]  # (admission clears it)
        planned = 1 if handed else target[i]  # a handed-over request: one decode step
        if (m > 0 or load_end > now) and planned > budget:
            break
        if not admit_nb(sim, k, i, now, budget, m > 0, now, ZERO):
            break
        q_head[k] = next_waiting[i]
        if q_head[k] < 0:
            q_tail[k] = -1
        q_len[k] -= 1
        pos = n_running[k]
        running[k, pos] = i
        n_running[k] += 1
        if ready[i] > now:
            if ready[i] > last_ready:
                last_ready = ready[i]
            if not handed:  # its uncached tokens, as if computed in this step
                if ready[i] > load_end:
                    load_end = ready[i]
                u = target[i] - registered[i] * prm.block_tokens
                budget = budget - u if u < budget else 0
            continue
        q = target[i] - kv[i] if kv[i] < target[i] else 1
        sched_pos[k, m] = pos
        sched_q[k, m] = q
        m += 1
        budget = budget - q if q < budget else 0
    if load_end > now:  # the step waits for its loads: its prompts run once they have ended
        return 0, 0, False, last_ready, load_end
    if m > 0:
        return m, 0, False, last_ready, load_end
    steps_left = np.int64(1) << 62
    preempted = False
    pos = -1
    while pos + 1 < n_running[k]:  # (preemptions take requests off its end)
        pos += 1
        i = running[k, pos]
        if ready[i] > now or kv[i] < target[i]:
            continue
        if registered[i] < boff[i + 1] - boff[i] or rs.pd_first[i]:
            steps_left = 0  # (a handed-over request's first step ends at an event)
        elif output_tokens[i] - generated[i] < steps_left:
            steps_left = output_tokens[i] - generated[i]
        ok = True
        fits = (kv[i] + prm.block_tokens) // prm.block_tokens <= rs.held[i]
        while ist.free_len[k] < 1 or not grow_nb(sim, k, i, kv[i] + 1, now):
            # the most recently admitted request whose KV is here (a handed-over request whose
            # KV is still arriving is not yet running in vLLM's sense)
            j = n_running[k] - 1
            while ready[running[k, j]] > now:
                j -= 1
            if running[k, j] == i and fits:
                break  # alone within its blocks it decodes (vLLM would re-admit it forever)
            v = preempt_nb(k, j, rq, rs, ist, pool, prm, out)
            preempted = True
            if v == i:
                if m == 0:
                    stalled_nb(sim, i, k, now)
                ok = False
                break
        if not ok:
            break
        room = rs.held[i] * prm.block_tokens - kv[i]
        if cascade and room < steps_left:
            steps_left = room
        sched_pos[k, m] = pos
        sched_q[k, m] = 1
        m += 1
    return m, steps_left, preempted, last_ready, -np.inf


class StepSums(NamedTuple):
    """The sums an iteration's step time is computed from, grown as requests are scheduled:
    tokens, attention work, KV read; decode requests and their KV; measured prefill attention
    in ns and its lookups beyond the data (:func:`kvtier.sim.timing.step_time`)."""

    tokens: int
    attn: int
    kv_read: int
    n_dec: int
    dec_kv: int
    pf_ns: int
    pf_ext: int


@njit(cache=True, nogil=True, inline="always")
def take_nb(s: StepSums, q: int, kv: int, target: int, timing: np.ndarray) -> StepSums:
    """The sums once a request with ``kv`` of its ``target`` tokens computed takes ``q``
    tokens in this iteration (prefill while ``kv < target``, else a decode step)."""
    tokens = s.tokens + q
    attn = s.attn + q * (2 * kv + q)
    kv_read = s.kv_read + kv + q
    if kv < target:
        pf_ns = s.pf_ns + prefill_attn_ns_nb(q, kv, timing)
        pf_ext = s.pf_ext + prefill_out_of_range_nb(q, kv, timing)
        return StepSums(tokens, attn, kv_read, s.n_dec, s.dec_kv, pf_ns, pf_ext)
    return StepSums(tokens, attn, kv_read, s.n_dec + 1, s.dec_kv + kv + q, s.pf_ns, s.pf_ext)


class Scheduled(NamedTuple):
    """An iteration as it is being scheduled: requests taken (``m``), token budget left, the
    sums, decode steps before the first of a decode-only batch finishes (0: not one), the
    latest load end among running requests (``load_wait = batch``), and whether it preempted."""

    m: int
    budget: int
    sums: StepSums
    steps_left: int
    last_ready: float
    preempted: bool


@njit(cache=True, nogil=True, inline="always")
def schedule_running_nb(
    sim: Sim,
    k: int,
    now: float,
    seen: float,
    loads_seen: float,
    sc: Scheduled,
    cascade: bool,
    phase: int,
) -> Scheduled:
    """The running requests of instance ``k`` take their tokens, in order (vllm_v1: a
    request that finds no free block preempts the most recently admitted one); one still
    loading when the step was scheduled (``seen``, :func:`scheduled_at_nb`), or whose load's
    end the scheduler has not yet read (``loads_seen``, :func:`loads_seen_nb`), takes none.
    ``phase``: :data:`PASS_ALL`, or only the requests still prefilling (:data:`PASS_PREFILL`;
    :data:`PASS_PREFILL_YIELDS` while others decode: a chunk that finds no free block ends
    the pass, and its admissions, without preempting) or only those decoding
    (:data:`PASS_DECODE`; ``prefill_first``)."""
    rq = sim.rq
    rs = sim.rs
    ist = sim.ist
    prm = sim.prm
    boff = rq.block_offsets
    n_running = ist.n_running
    running = ist.running
    ready = rs.ready
    kv = rs.kv
    target = rs.target
    timing = prm.timings[prm.pool_of[k]]  # this instance's pool's step times
    grows = prm.scheduler == VLLM_V1
    m, budget, sums, steps_left, last_ready, preempted = sc
    pos = -1
    while pos + 1 < n_running[k]:  # (vllm_v1: preemptions take requests off its end)
        pos += 1
        i = running[k, pos]
        if ready[i] > (loads_seen if rs.polled[i] else seen):
            if ready[i] > last_ready:
                last_ready = ready[i]
            continue
        if budget == 0:
            continue
        prefilling = kv[i] < target[i]
        if (phase == PASS_DECODE and prefilling) or (
            phase in (PASS_PREFILL, PASS_PREFILL_YIELDS) and not prefilling
        ):
            continue  # (prefill_first) not of this pass
        if prefilling:
            q = target[i] - kv[i]
            if q > budget:
                q = budget
            steps_left = 0
        else:
            q = 1
            if rs.registered[i] < boff[i + 1] - boff[i] or rs.pd_first[i]:
                steps_left = 0  # (a handed-over request's first step ends at an event)
            elif rq.output_tokens[i] - rs.generated[i] < steps_left:
                steps_left = rq.output_tokens[i] - rs.generated[i]
        if grows and phase == PASS_PREFILL_YIELDS and not grow_nb(sim, k, i, kv[i] + q, now):
            # (prefill_first) a chunk finds no free block while requests decode: no prefill
            # step, the decodes run (SGLang forms no prefill batch its memory cannot hold);
            # budget 0 stops the admissions too
            budget = 0
            break
        if grows:
            # vLLM V1: no free block, the most recently admitted request is preempted
            ok = True
            while not grow_nb(sim, k, i, kv[i] + q, now):
                # (not a request whose KV is still arriving: vLLM keeps those waiting)
                j = n_running[k] - 1
                while ready[running[k, j]] > now:
                    j -= 1
                v = preempt_nb(k, j, rq, rs, ist, sim.pool, prm, sim.out)
                preempted = True
                if v == i:
                    if m == 0:
                        stalled_nb(sim, i, k, now)
                    ok = False
                    break
            if not ok:
                break
            # decode steps run ahead allocate only when HBM's evictions copy nothing down;
            # else only while its blocks hold them
            room = rs.held[i] * prm.block_tokens - kv[i]
            if cascade and kv[i] >= target[i] and room < steps_left:
                steps_left = room
        if prm.defers_loading_hits and rs.loading_hi[i] > 0:
            promoted_nb(sim, k, i)  # (vLLM caches its loaded blocks as it promotes it)
        ist.sched_pos[k, m] = pos
        ist.sched_q[k, m] = q
        budget -= q
        m += 1
        sums = take_nb(sums, q, kv[i], target[i], timing)
    return Scheduled(m, budget, sums, steps_left, last_ready, preempted)


@njit(cache=True, nogil=True, inline="always")
def decoding_nb(sim: Sim, k: int) -> tuple[int, int]:
    """prefill_first: instance ``k``'s decoding requests, and the blocks they need for their
    next token (one each whose tokens fill its blocks), which a prefill pass's admissions
    leave free, as SGLang's prefill batch leaves room for its running requests' decode."""
    rs = sim.rs
    ist = sim.ist
    B = sim.prm.block_tokens
    n = 0
    need = 0
    for pos in range(ist.n_running[k]):
        i = ist.running[k, pos]
        if rs.kv[i] >= rs.target[i]:
            n += 1
            if rs.kv[i] % B == 0:
                need += 1
    return n, need


@njit(cache=True, nogil=True, inline="always")
def schedule_admissions_nb(
    sim: Sim, k: int, now: float, seen: float, sc: Scheduled, keep: int
) -> Scheduled:
    """Waiting requests of instance ``k`` are admitted in FCFS order while the budget, the
    running-request limit and HBM allow, up to the first queued after the step was scheduled
    (``seen``); one whose lower-tier hits another request is loading is skipped and stays in
    its place (``Params.defers_loading_hits``). Each that is ready takes a prefill chunk (a
    decode instance's handed-over request: its first decode step)."""
    rs = sim.rs
    ist = sim.ist
    prm = sim.prm
    ready = rs.ready
    kv = rs.kv
    target = rs.target
    q_len = ist.q_len
    q_head = ist.q_head
    n_running = ist.n_running
    timing = prm.timings[prm.pool_of[k]]  # this instance's pool's step times
    m, budget, sums, steps_left, last_ready, preempted = sc
    ints = sim.ty.ints
    prev = -1  # the last request left waiting before ``i`` (-1: ``i`` is the head)
    i = q_head[k]
    while budget > 0 and i >= 0 and n_running[k] < prm.max_seqs:
        if (rs.handed_at[i] if rs.handed[i] else sim.rq.arrival[i]) > seen:
            break  # (async scheduling) queued after this step was scheduled
        if rs.pf_ready[i] > seen:
            prev = i  # its storage prefetch is in flight: it waits, the next one is tried
            i = rs.next_waiting[i]
            continue
        if rs.pf_n[i] > 0:
            prefetched_nb(sim, k, i, now)
        if prm.prefetches_at_arrival and rs.pf_match[i] > 0 and hit_lost_nb(sim, k, i, now):
            prev = i  # its prefix shrank while it waited: looked up in storage again
            i = rs.next_waiting[i]
            continue
        issue = seen if prm.polls_loads else now
        ints[C_DEFERRED] = 0
        handed = rs.handed[i]
        if not admit_nb(sim, k, i, now, budget, m > 0, issue, keep):
            if ints[C_DEFERRED] == 0:
                break
            prev = i  # another request loads its hits: it waits, the next one is tried
            i = rs.next_waiting[i]
            continue
        if prm.refreshes_host and not handed:
            refs = Refs(sim.rq.block_ids, sim.rq.block_offsets[i], ZERO, rs.registered[i])
            refresh_nb(sim.ts, sim.tp, k, refs, rs.computed_from[i])
        nxt = rs.next_waiting[i]
        if prev < 0:
            q_head[k] = nxt
        else:
            rs.next_waiting[prev] = nxt
        if nxt < 0:
            ist.q_tail[k] = prev
        q_len[k] -= 1
        pos = n_running[k]
        ist.running[k, pos] = i
        n_running[k] += 1
        rs.pf_retry[i] = -1  # (SGLang cancels an admitted request's retry)
        steps_left = 0
        if ready[i] > now or rs.polled[i]:
            # (a polled load's end is reported with a later step's output)
            if ready[i] > last_ready:
                last_ready = ready[i]
            i = nxt
            continue
        q = target[i] - kv[i] if kv[i] < target[i] else 1
        if q > budget:
            q = budget
        ist.sched_pos[k, m] = pos
        ist.sched_q[k, m] = q
        budget -= q
        m += 1
        sums = take_nb(sums, q, kv[i], target[i], timing)
        i = nxt
    return Scheduled(m, budget, sums, steps_left, last_ready, preempted)


@njit(cache=True, nogil=True, inline="always")
def idle_until_nb(
    rs: RequestState, ist: InstanceState, k: int, now: float, preempted: bool
) -> float:
    """When instance ``k``, with nothing to run because every running request is loading,
    wakes: when the first of them is ready; a prefill instance whose blocks are held wakes
    when the first of them is freed; after a preemption at once, to admit (the reference's
    rule in ``start_iteration``)."""
    if preempted or (ist.n_running[k] == 0 and ist.held_head[k] < 0):
        return now
    n_running = ist.n_running
    ready = rs.ready
    w = np.inf
    for pos in range(n_running[k]):
        if ready[ist.running[k, pos]] < w:
            w = ready[ist.running[k, pos]]
    h = ist.held_head[k]
    while h >= 0:
        if rs.release_at[h] < w:
            w = rs.release_at[h]
        h = rs.next_held[h]
    return w


@njit(cache=True, nogil=True, inline="always")
def pd_horizon_nb(ist: InstanceState, prm: Params, k: int, now: float, t_next: float) -> float:
    """How far decode instance ``k`` may run ahead: a prefill instance may hand a request over
    at its iteration's end, and an idle one waiting for held blocks waits for another decode
    instance's next admission (``arrived_nb`` wakes it), so none of those run ahead of it."""
    busy = ist.busy
    busy_until = ist.busy_until
    wake = ist.wake
    blocked = False
    for p in range(prm.n_prefill):
        b = busy_until[p] if busy[p] else wake[p]
        if b < t_next:
            t_next = b
        if not busy[p] and b == np.inf and ist.q_len[p] > 0:
            blocked = True
    if blocked:
        for dd in range(prm.n_prefill, prm.n_instances):
            if dd != k and (busy[dd] or ist.n_running[dd] > 0 or ist.q_len[dd] > 0):
                b = busy_until[dd] if busy[dd] else now  # idle with work: admits now
                if b < t_next:
                    t_next = b
    return t_next


@njit(cache=True, nogil=True, inline="always")
def scheduled_at_nb(ist: InstanceState, prm: Params, k: int, now: float) -> float:
    """When instance ``k``'s scheduler decided the iteration starting ``now``: then, or with
    async scheduling at the start of the step that has just ended if a request of that step
    runs on (the reference's ``scheduled_at``)."""
    if prm.async_sched and ist.runs_on_at[k] == now:
        return ist.iter_start[k]
    return now


@njit(cache=True, nogil=True, inline="always")
def loads_seen_nb(ist: InstanceState, prm: Params, k: int, now: float) -> float:
    """Until when instance ``k``'s scheduler, deciding the iteration starting ``now``, knows
    which lower-tier loads have ended (polls_loads; the reference's ``loads_seen``): with no
    step in flight, now; after a step that has just ended, when that step was decided (its
    worker's poll), or scheduling ahead, when the step before it was."""
    polls = ist.marks
    if polls[POLL_ENDED, k] != now:
        return now
    if prm.async_sched and ist.runs_on_at[k] == now:
        return polls[POLL_BEFORE, k]
    return polls[POLL_AT, k]


@njit(cache=True, nogil=True, inline="always")
def start_iteration_nb(sim: Sim, k: int, now: float, t_next: float) -> None:
    """Idle instance ``k`` schedules an iteration: running requests take their tokens, then
    admissions (FCFS) take prefill chunks (vllm_v0: :func:`schedule_v0_nb`); with nothing to
    run it waits for a load."""
    rs = sim.rs
    ist = sim.ist
    tp = sim.tp
    prm = sim.prm
    n_running = ist.n_running
    wake = ist.wake
    timing = prm.timings[prm.pool_of[k]]  # this instance's pool's step times
    ints = sim.ty.ints
    if k < prm.n_prefill and ist.held_head[k] >= 0:
        release_held_nb(k, now, rs, ist, sim.pool, prm)
    if prm.prefetches_at_arrival:
        retry_prefetches_nb(sim, k, now)
    grows = prm.scheduler == VLLM_V1
    cascade = tp.n_tiers > 0 and (tp.cascade or tp.exclusive)
    v0 = prm.scheduler == VLLM_V0
    sums = StepSums(0, 0, 0, 0, 0, 0, 0)
    steps_left = np.int64(1) << 62  # (0: not a decode-only batch)
    load_end = -np.inf
    seen = now
    if v0:
        m, steps_left, preempted, last_ready, load_end = schedule_v0_nb(sim, k, now, cascade)
        if ist.free_len[k] < 1:
            steps_left = 0  # the next step's requests each need a free block: step by step
        for x in range(m):
            i = ist.running[k, ist.sched_pos[k, x]]
            sums = take_nb(sums, ist.sched_q[k, x], rs.kv[i], rs.target[i], timing)
        sc = Scheduled(m, prm.token_budget, sums, steps_left, last_ready, preempted)
    else:
        seen = scheduled_at_nb(ist, prm, k, now)
        loads_seen = loads_seen_nb(ist, prm, k, now) if prm.polls_loads else seen
        sc = Scheduled(0, prm.token_budget, sums, steps_left, now, False)
        split = prm.prefill_first and not 0 < prm.n_prefill <= k
        n_decoding = keep = ZERO
        if split:
            n_decoding, keep = decoding_nb(sim, k)
            if not grows:
                keep = ZERO
        phase = PASS_ALL
        if split:
            phase = PASS_PREFILL_YIELDS if n_decoding > 0 else PASS_PREFILL
        sc = schedule_running_nb(sim, k, now, seen, loads_seen, sc, cascade, phase)
        n_before = n_running[k]
        if not sc.preempted:  # (vLLM V1 admits nobody in a step that preempted)
            sc = schedule_admissions_nb(sim, k, now, seen, sc, keep)
        if split and sc.m == 0 and not sc.preempted and n_running[k] == n_before:
            # prefill_first: no prefill chunk can run and nobody was admitted (an admission
            # that waits for its load is SGLang's load inside a prefill batch), so decodes,
            # in the whole budget (nothing was taken)
            sc = Scheduled(0, prm.token_budget, sc.sums, sc.steps_left, sc.last_ready, False)
            sc = schedule_running_nb(sim, k, now, seen, loads_seen, sc, cascade, PASS_DECODE)
    m, _, sums, steps_left, last_ready, preempted = sc
    if tp.batch_waits and last_ready > now:
        # the batch waits for every load (load_wait = batch): idle until the last one
        wake[k] = last_ready
        return
    if prm.epp_mx_dt > 0.0:  # what this step leaves waiting (if it runs)
        step_scheduled_nb(ist.epp_mx, k, ist.q_len[k])
    if load_end > now:
        # (vllm_v0) the step admitted lower-tier loads: busy until the last has ended, then
        # its prompts' remainder (the same vLLM step, not counted twice)
        ist.n_sched[k] = 0
        ist.busy[k] = True
        ist.busy_until[k] = load_end
        wake[k] = np.inf
        return
    if m == 0:
        # no step in flight: the next one is decided when it starts (the reference's rule:
        # a load that ended after this attempt's decision, by now, runs in it, at once)
        w = idle_until_nb(rs, ist, k, now, preempted)
        if prm.prefetches_at_arrival:
            # waiting requests whose prefetch is in flight: when the first ends (every one
            # waiting so, and nothing else to wait for: only then)
            gate, all_gated = gated_until_nb(rs, ist, k, seen)
            if all_gated and not preempted and n_running[k] == 0 and ist.held_head[k] < 0:
                w = np.inf
            if gate < w:
                w = gate
        wake[k] = max(w, now)
        ist.runs_on_at[k] = -np.inf
        ist.marks[POLL_ENDED, k] = -np.inf  # (polls_loads: the next attempt polls at once)
        return
    wake[k] = np.inf
    if prm.polls_loads:
        # this step's worker polls for finished loads when it is launched (decided)
        polls = ist.marks
        polls[POLL_BEFORE, k] = polls[POLL_AT, k] if polls[POLL_ENDED, k] == now else seen
        polls[POLL_AT, k] = seen
    tokens, attn, kv_read, n_dec, dec_kv, pf_ns, pf_ext = sums
    dt = step_time_nb(tokens, attn, kv_read, n_dec, dec_kv, pf_ns, timing)
    ints[C_EXTRAP] += step_extrapolated_nb(tokens, n_dec, dec_kv, pf_ext, timing)
    t = now
    # vllm_v1: nothing waits (an admission's blocks may change with time) and none preempted
    ahead = not (grows or v0) or (not preempted and ist.q_len[k] == 0)
    if prm.n_prefill > 0 and k >= prm.n_prefill:
        t_next = pd_horizon_nb(ist, prm, k, now, t_next)
    if m == n_running[k] and steps_left > 1 and ahead:
        plan = AheadPlan(t_next, m, steps_left, dt, attn, kv_read, (grows or v0) and not cascade)
        t, dt = run_ahead_nb(sim, k, now, plan, v0)
    ist.iter_start[k] = t
    ist.n_sched[k] = m
    ist.iter_dt[k] = dt
    ist.busy[k] = True
    ist.busy_until[k] = t + dt
    sim.out.busy_s[k] += dt
    ints[C_ITER] += 1


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def event_loop_nb(sim: Sim) -> tuple[bool, float]:
    """The event loop of one replay, on state :func:`simulate_nb` has set up; returns
    (stopped early, the last event's time).

    It is the reference's loop (:func:`kvtier.sim.reference.simulate_reference`) step for
    step: at each event, iteration ends (``end_iteration_nb``), the early-stop test, arrivals
    (``arrive_nb``: reject or ``route_nb``), then iteration starts (``start_iteration_nb``,
    which calls ``admit_nb``). Each step is inlined here (``inline="always"``): a call would
    pass every state array as machine words, at every event. It allocates nothing, so it is
    compiled without numba's reference counting (``_nrt=False``): reading a named tuple's
    array field yields a new reference, which would otherwise be counted (an atomic
    increment and decrement) wherever a step reads one.
    """
    rq = sim.rq
    ist = sim.ist
    prm = sim.prm
    out = sim.out
    ty = sim.ty
    n = rq.arrival.shape[0]
    n_inst = prm.n_instances
    nx = np.int64(0)  # (a literal 0 would compile route_nb a second time)
    early = False
    now = 0.0
    # the arrays the loop itself reads (each step binds its own on entry, outside its loops)
    arrival = rq.arrival
    busy = ist.busy
    busy_until = ist.busy_until
    act = ist.act
    n_running = ist.n_running
    q_len = ist.q_len
    wake = ist.wake
    slo_on = prm.slo_on
    while True:
        now = next_event_nb(rq, ist, nx, prm, ty)
        if now == np.inf:
            break
        if sim.ts.fault_i.shape[0] > 0:
            faults_advance_nb(sim.ts, now)  # failed devices first (kvtier.sim.fault_step)
        # Which instances act is found first in a loop of its own (handling one changes no
        # other instance's state), so the scan over every instance at every event does not
        # carry the large body's per-instance pointers.
        n_act = 0
        for k in range(n_inst):
            if busy[k] and busy_until[k] == now:
                act[n_act] = k
                n_act += 1
        for a in range(n_act):
            end_iteration_nb(sim, act[a], now)
        if slo_on and slo_missed_nb(prm, ty, n):
            early = True
            stop_early_nb(now, ist, prm, out, ty)
            break
        while next_arrival_nb(rq, nx, prm, ty) == now:
            arrival[nx] = now  # when it was sent (a closed loop's copy of the trace times)
            arrive_nb(sim, nx)
            nx += 1
        # an idle instance schedules only at an event of its own (``wake``: now when its
        # iteration ended or a request joined its queue), never at another instance's
        n_act = 0
        for k in range(n_inst):
            if not busy[k] and (n_running[k] > 0 or q_len[k] > 0) and wake[k] <= now:
                act[n_act] = k
                n_act += 1
        # the next arrival bounds the decode steps run ahead; in a closed loop with every slot
        # taken, the next one follows a finish on another instance: none are run ahead
        t_next = next_arrival_nb(rq, nx, prm, ty)
        if prm.concurrency > 0 and nx < n and t_next == np.inf:
            t_next = now
        for a in range(n_act):
            start_iteration_nb(sim, act[a], now, t_next)
        if out.stats[4] >= 0:
            break  # a replay that does not progress (``stalled_nb``)

    return early, now


def new_state(
    rq: Requests,
    prm: Params,
    pool: HbmPools,
    ts: TierPools,
    tp: TierParams,
    lk: LinkState,
    out: Outputs,
) -> Sim:
    """The replay's state around its inputs: per-request and per-instance arrays, buffers
    and counters, sized from the inputs (which the wrapper has validated).

    Plain NumPy, so the same code runs inlined into :func:`simulate_nb` and in Python, where
    :mod:`kvtier.sim.compile_ahead` reads the state's numba types off a small replay's.
    """
    n = rq.arrival.shape[0]
    n_inst = prm.n_instances
    cap = prm.capacity
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
        rq.input_tokens.copy(),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.bool_),
        np.zeros(n, dtype=np.int64),
        np.full(n, np.inf),
        np.full(n, -1, dtype=np.int64),
        np.zeros(n, dtype=np.float64),
        np.zeros(n, dtype=np.bool_),
        np.zeros(n, dtype=np.bool_),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, -np.inf),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.full(n, -1, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
        np.zeros(n, dtype=np.int64),
    )
    n_pdw = n_inst * prm.pd_workers
    ix_list = np.zeros((5, 2 * n_inst), dtype=np.int64)
    marks = np.full((5, n_inst), -np.inf)
    marks[PF_HELD] = 0.0
    marks[PF_PASSES] = 0.0
    ix_list[IX_HEAD] = -1
    ix_list[IX_TAIL] = -1
    mx_rows = n_inst if prm.epp_mx_dt > 0.0 else 1  # (one row when nothing is recorded)
    ist = InstanceState(
        q_head=np.full(n_inst, -1, dtype=np.int64),
        q_tail=np.full(n_inst, -1, dtype=np.int64),
        q_len=np.zeros(n_inst, dtype=np.int64),
        running=np.empty((n_inst, max_seqs), dtype=np.int64),
        n_running=np.zeros(n_inst, dtype=np.int64),
        sched_q=np.zeros((n_inst, max_seqs), dtype=np.int64),
        sched_pos=np.zeros((n_inst, max_seqs), dtype=np.int64),
        n_sched=np.zeros(n_inst, dtype=np.int64),
        busy=np.zeros(n_inst, dtype=np.bool_),
        busy_until=np.zeros(n_inst, dtype=np.float64),
        wake=np.full(n_inst, np.inf),
        act=np.empty(n_inst, dtype=np.int64),
        active_blocks=np.zeros(n_inst, dtype=np.int64),
        cold_stamp=np.zeros(n_inst, dtype=np.int64),
        pd_wfree=np.zeros(n_pdw, dtype=np.float64),
        pd_wbusy=np.zeros(n_pdw, dtype=np.float64),
        held_head=np.full(n_inst, -1, dtype=np.int64),
        held_tail=np.full(n_inst, -1, dtype=np.int64),
        iter_dt=np.zeros(n_inst, dtype=np.float64),
        seg_steps=np.zeros(n_inst, dtype=np.int64),
        seg_t0=np.zeros(n_inst, dtype=np.float64),
        seg_busy=np.zeros(n_inst, dtype=np.float64),
        seg_attn=np.zeros(n_inst, dtype=np.int64),
        seg_kv=np.zeros(n_inst, dtype=np.int64),
        seg_m=np.zeros(n_inst, dtype=np.int64),
        ring_head=np.zeros(n_inst, dtype=np.int64),
        ring_count=prm.capacities.copy(),
        free_len=prm.capacities.copy(),
        saving=np.zeros(n_inst, dtype=np.bool_),
        iter_start=np.full(n_inst, -np.inf),
        runs_on_at=np.full(n_inst, -np.inf),
        marks=marks,
        ix_last=np.full(2 * prm.ix_nodes, -1, dtype=np.int32),
        ix_log=np.empty((2, 2 * prm.ix_log), dtype=np.int32),
        ix_list=ix_list,
        epp_mx=np.zeros((mx_rows, EPP_MX_WIDTH), dtype=np.float64),
    )
    max_nb = 0
    max_out = 0
    for i in range(n):
        if rq.block_offsets[i + 1] - rq.block_offsets[i] > max_nb:
            max_nb = rq.block_offsets[i + 1] - rq.block_offsets[i]
        if rq.output_tokens[i] > max_out:
            max_out = rq.output_tokens[i]
    max_gen = 0  # the most generated blocks a request stores into a lower tier
    for i in range(len(tp.gen_base) - 1):
        if tp.gen_base[i + 1] - tp.gen_base[i] > max_gen:
            max_gen = tp.gen_base[i + 1] - tp.gen_base[i]
    buf = Buffers(
        np.empty(max_nb + 1, dtype=np.int32),
        np.empty(max_nb + 1, dtype=np.int32),
        np.zeros(2 * tp.n_tiers + 1, dtype=np.int64),
        np.empty(max_nb + 1, dtype=np.int32),
        np.empty(cap + 1, dtype=np.int32),
        np.empty(prm.token_budget // prm.block_tokens + max_seqs + 2, dtype=np.int32),
        np.zeros(prm.block_tokens + 1, dtype=np.int64),
        np.zeros(max_seqs, dtype=np.int64),
        np.empty(max_out + 1 if prm.track_tbt else 1, dtype=np.float64),
        np.empty(max_gen + 1, dtype=np.int32),
    )
    ty = Tally(np.zeros(N_COUNTERS, dtype=np.int64), np.zeros(2, dtype=np.float64))
    sim = Sim(rq, rs, ist, pool, ts, tp, lk, prm, out, ty, buf)
    return sim


new_state_nb = njit(cache=True, nogil=True, inline="always")(new_state)


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

    One kernel call runs the whole replay so the event loop never returns to Python: the
    per-request and per-instance state is allocated here, sized from the inputs (which the
    wrapper has validated), then :func:`event_loop_nb` runs.
    """
    n_inst = prm.n_instances
    cap = prm.capacity
    R = prm.ring_len
    sim = new_state_nb(rq, prm, pool, ts, tp, lk, out)
    # HBM pools, possibly kept from an earlier replay, are set here. Entries of a ring past
    # its live ones name slot 0 of the instance, so the allocation loop's look-ahead always
    # reads a slot record.
    # Instance k's slots are k * cap + [0, capacities[k]) (cap: the largest instance's); the
    # rest of its stride never enters its ring.
    for k in range(n_inst):
        ck = prm.capacities[k]
        for r in range(R):
            pool.rings[k * R + r] = k * cap + (r if r < ck else 0)
    for k in range(n_inst):
        ck = prm.capacities[k]
        for x in range(cap):
            g = k * cap + x
            pool.records[4 * g + POS] = x if x < ck else -1
            pool.records[4 * g + MAP] = -1
            pool.records[4 * g + REF] = 0
            pool.records[4 * g + BLOCK] = -1
            pool.stamps[g] = -1
    early, now = event_loop_nb(sim)
    # Leave the map all zero again so the caller can reuse it for the next replay: every
    # non-zero entry is named by the MAP field of the slot it holds, so clearing those entries
    # costs one pass over the slots instead of one over the whole map.
    for x in range(n_inst * cap):
        mx = pool.records[4 * x + MAP]
        if mx >= 0:
            pool.slot_of[(x // cap) * prm.n_shared + mx] = 0
    out.stats[0] = sim.ty.ints[C_ITER]
    out.stats[1] = 1.0 if early else 0.0
    out.stats[2] = now
    out.stats[3] = sim.ty.ints[C_EXTRAP]
