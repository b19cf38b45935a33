"""SGLang HiCache's storage prefetch in the numba engine: a request's hits in a storage tier are
read into the tiers above when it arrives, and it waits in its queue until they are there.

SGLang 0.5.23 issues the prefetch when a request arrives (``managers/scheduler.py``
``handle_generate_request`` -> ``_prefetch_kvcache``: the prompt's prefix is matched in the
device and host trees and the rest is looked up in the storage back end), reads the pages into
the host pool on a background thread, and under ``--hicache-storage-prefetch-policy
wait_complete`` skips the request when forming a batch until the prefetch has ended
(``check_prefetch_progress``); the pages then become host-resident nodes of the radix tree and
the request loads them from host memory like any host hit. A prefetch of a prompt left
shorter than ``prefetch_threshold`` (256 tokens) is declined; one is declined too while the
engine's prefetches in flight reserve half its host pool (``prefetch_capacity_limit``), and a
declined or missed one is re-issued by later scheduling passes (``StoragePrefetchRetries``),
and so is one whose prefix in HBM and the host pool shrank while it waited
(``_prefetch_after_device_hit_loss``). docs/model.md, "Storage prefetch at arrival"; the
reference is
:meth:`kvtier.sim.reference.ReferenceReplay.prefetch`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_hbm import hbm_lookup_nb
from kvtier.sim.nb_state import INNER, PF_HELD, PF_PASSES, InstanceState, RequestState, Sim
from kvtier.sim.nb_tiers import (
    Refs,
    fill_upper_nb,
    lookup_nb,
    prefetch_blocks_nb,
    storage_run_nb,
)


@njit(cache=True, nogil=True, inline="always")
def prompt_cap_nb(sim: Sim, i: int) -> int:
    """The prompt blocks request ``i`` may find cached: those before its last token."""
    nb = sim.rq.block_offsets[i + 1] - sim.rq.block_offsets[i]
    cap = (sim.rs.target[i] - 1) // sim.prm.block_tokens
    return min(nb, cap)


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def reachable_nb(sim: Sim, k: int, i: int, cap: int) -> int:
    """The prompt blocks of request ``i`` HBM and then the tiers admission reaches hold on
    instance ``k``, at most ``cap`` (the reference's ``reachable``)."""
    rq = sim.rq
    prm = sim.prm
    bo = rq.block_offsets[i]
    h = hbm_lookup_nb(
        sim.pool.slot_of, k * prm.n_shared, rq.shared, bo, cap, sim.buf.found, prm.swa_off,
        prm.swa_need,
    )  # fmt: skip
    return h + lookup_nb(sim.ts, sim.tp, k, Refs(rq.block_ids, bo, h, cap), sim.buf.src, np.inf)


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def hit_lost_nb(sim: Sim, k: int, i: int, now: float) -> bool:
    """Did request ``i``'s prefix in HBM and the host tier shrink since its last prefetch
    lookup? Then, within its attempts, the storage lookup is issued again and ``i`` skipped
    this pass (SGLang's ``_prefetch_after_device_hit_loss``); past them the shorter match is
    admitted (the reference's ``hit_lost``)."""
    rs = sim.rs
    held = reachable_nb(sim, k, i, prompt_cap_nb(sim, i))
    if held >= rs.pf_match[i]:
        return False
    if rs.pf_tries[i] >= sim.prm.prefetch_retry_attempts:
        rs.pf_match[i] = held
        return False
    rs.pf_tries[i] += 1
    prefetch_nb(sim, k, i, now)
    return True


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def prefetch_nb(sim: Sim, k: int, i: int, now: float) -> None:
    """Request ``i``, on instance ``k`` at ``now`` (its arrival, or a retry): past the prefix
    HBM and the tiers admission reaches hold, the run of blocks the prefetching tiers hold is
    read into the tiers above, and ``i`` waits until it has arrived. Declined when under
    ``Params.prefetch_min_blocks`` of prompt are left; when ``k``'s prefetches in flight hold
    ``prefetch_limit_tokens``, or the tier holds none of it, a retry is armed."""
    rq = sim.rq
    rs = sim.rs
    prm = sim.prm
    bo = rq.block_offsets[i]
    cap = prompt_cap_nb(sim, i)
    lo = reachable_nb(sim, k, i, cap)
    rs.pf_match[i] = lo
    if cap - lo < prm.prefetch_min_blocks:
        return  # (no lookup was issued: no retry)
    marks = sim.ist.marks
    if marks[PF_HELD, k] * prm.block_tokens >= prm.prefetch_limit_tokens:
        rs.pf_retry[i] = 0  # (declined, rate limited)
        return
    src = sim.buf.src
    n = storage_run_nb(sim.ts, sim.tp, k, rq.block_ids, bo, lo, cap, src)
    if n == 0:
        rs.pf_retry[i] = 0  # (a miss: a backup may still be committing)
        return
    marks[PF_HELD, k] += cap - lo  # (the whole prompt left is reserved)
    refs = Refs(rq.block_ids, bo, lo, lo + n)
    ready, deepest = prefetch_blocks_nb(sim.ts, sim.tp, sim.lk, k, now, refs, src)
    rs.pf_ready[i] = ready
    rs.pf_tier[i] = deepest
    rs.pf_lo[i] = lo
    rs.pf_n[i] = n


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def prefetched_nb(sim: Sim, k: int, i: int, now: float) -> None:
    """Request ``i``'s prefetch has ended and the scheduler reaches it: the blocks it read enter
    the tiers above their sources (SGLang inserts them into the host radix tree; each fills the
    tiers above the deepest read that lack it) and its reservation is released."""
    rs = sim.rs
    bo = sim.rq.block_offsets[i]
    lo = rs.pf_lo[i]
    n = rs.pf_n[i]
    rs.pf_n[i] = 0
    sim.ist.marks[PF_HELD, k] -= prompt_cap_nb(sim, i) - lo
    for j in range(lo, lo + n):
        fill_upper_nb(sim.ts, sim.tp, sim.lk, k, now, rs.pf_tier[i], sim.rq.block_ids[bo + j])


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def retry_prefetches_nb(sim: Sim, k: int, now: float) -> None:
    """A scheduling pass of instance ``k`` re-issues the prefetches whose retry is due, in
    queue order (SGLang's ``StoragePrefetchRetries.pop_ready``): the queue's head drops its
    retry; a retry is due ``Params.prefetch_retry_passes`` passes after the first that sees
    it, and a request makes at most ``prefetch_retry_attempts`` re-issues (the reference's
    ``retry_prefetches``)."""
    rs = sim.rs
    prm = sim.prm
    marks = sim.ist.marks
    marks[PF_PASSES, k] += 1.0
    passes = np.int64(marks[PF_PASSES, k])
    i = sim.ist.q_head[k]
    if i >= 0:
        rs.pf_retry[i] = -1
    while i >= 0:
        nxt = rs.next_waiting[i]  # (a re-issue leaves the queue as it is)
        if rs.pf_retry[i] >= 0:
            if rs.pf_tries[i] >= prm.prefetch_retry_attempts or prm.prefetch_retry_passes <= 0:
                rs.pf_retry[i] = -1
            else:
                if rs.pf_retry[i] == 0:
                    rs.pf_retry[i] = passes + prm.prefetch_retry_passes
                if rs.pf_retry[i] <= passes:
                    rs.pf_retry[i] = -1
                    rs.pf_tries[i] += 1
                    prefetch_nb(sim, k, i, now)
        i = nxt


@njit(cache=True, nogil=True, inline="always")
def gated_until_nb(rs: RequestState, ist: InstanceState, k: int, seen: float) -> tuple[float, bool]:
    """When the first waiting request of instance ``k`` whose prefetch is in flight after
    ``seen`` is ready (inf: none), and whether every waiting request is such."""
    gate = np.inf
    n = 0
    i = ist.q_head[k]
    while i >= 0:
        if rs.pf_ready[i] > seen:
            n += 1
            if rs.pf_ready[i] < gate:
                gate = rs.pf_ready[i]
        i = rs.next_waiting[i]
    return gate, n > 0 and n == ist.q_len[k]
