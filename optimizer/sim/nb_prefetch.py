"""SGLang HiCache's storage prefetch in the numba engine: a request's hits in a storage tier are
read into the tiers above when it arrives, and it waits in its queue until they are there.

SGLang 0.5.23 issues the prefetch when a request arrives (``managers/scheduler.py``
``handle_generate_request`` -> ``_prefetch_kvcache``: the prompt's prefix is matched in the
device and host trees and the rest is looked up in the storage back end), reads the pages into
the host pool on a background thread, and under ``--hicache-storage-prefetch-policy
wait_complete`` skips the request when forming a batch until the prefetch has ended
(``check_prefetch_progress``); the pages then become host-resident nodes of the radix tree and
the request loads them from host memory like any host hit. A prefetch shorter than
``prefetch_threshold`` (256 tokens) is declined. docs/model.md, "Storage prefetch at arrival";
the reference is :meth:`kvtier.sim.reference.ReferenceReplay.prefetch`.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_hbm import hbm_lookup_nb
from kvtier.sim.nb_state import INNER, InstanceState, RequestState, Sim
from kvtier.sim.nb_tiers import Refs, fill_upper_nb, lookup_nb, prefetch_blocks_nb


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def prefetch_nb(sim: Sim, k: int, i: int, now: float) -> None:
    """Request ``i``, just routed to instance ``k`` at ``now``: past the prefix HBM and the
    tiers above hold, the run of blocks a prefetching tier holds is read into the tiers above,
    if it is at least ``Params.prefetch_min_blocks`` long; ``i`` waits until it has arrived."""
    rq = sim.rq
    rs = sim.rs
    prm = sim.prm
    tp = sim.tp
    buf = sim.buf
    boff = rq.block_offsets
    B = prm.block_tokens
    nb = boff[i + 1] - boff[i]
    cap = (rs.target[i] - 1) // B
    if nb < cap:
        cap = nb
    h = hbm_lookup_nb(
        sim.pool.slot_of, k * prm.n_shared, rq.shared, boff[i], cap, buf.found, prm.swa_off,
        prm.swa_need,
    )  # fmt: skip
    src = buf.src
    n_src = lookup_nb(sim.ts, tp, k, rq.block_ids, boff[i], h, cap, src)
    j = 0
    # (the first lower tier has none above it to read into: it never prefetches)
    while j < n_src and not (src[j] > 0 and tp.prefetch_at_arrival[src[j]]):
        j += 1
    if j == n_src:
        return
    t = src[j]
    n = 1
    while j + n < n_src and src[j + n] == t:
        n += 1
    if n < prm.prefetch_min_blocks:
        return
    rs.pf_tier[i] = t
    rs.pf_lo[i] = h + j
    rs.pf_n[i] = n
    refs = Refs(rq.block_ids, boff[i], h + j, h + j + n)
    rs.pf_ready[i] = prefetch_blocks_nb(sim.ts, tp, sim.lk, k, now, t, refs)


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def prefetched_nb(sim: Sim, k: int, i: int, now: float) -> None:
    """Request ``i``'s prefetch has ended and the scheduler reaches it: the blocks it read enter
    the tiers above their source (SGLang inserts them into the host radix tree)."""
    rs = sim.rs
    bo = sim.rq.block_offsets[i]
    lo = rs.pf_lo[i]
    n = rs.pf_n[i]
    rs.pf_n[i] = 0
    for j in range(lo, lo + n):
        fill_upper_nb(sim.ts, sim.tp, sim.lk, k, now, rs.pf_tier[i], sim.rq.block_ids[bo + j])


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
