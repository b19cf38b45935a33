"""``prefix_affinity``: the instance with the most HBM-resident prefix blocks among those whose
load is at most the least load plus ``serving.affinity_overload`` (fewer waiting plus running
requests on ties, then the lower index)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.prefetch import prefetch
from kvtier.sim.nb_hbm import hbm_lookup_nb
from kvtier.sim.nb_state import Sim
from kvtier.sim.routers.base_nb import n_routed_nb

if TYPE_CHECKING:
    from kvtier.sim.routers import RouteView


def route(view: RouteView, req: Any) -> int:
    loads = [inst.load for inst in view.routed]
    limit = min(loads) + view.cfg.affinity_overload
    cap = (req.input_tokens - 1) // view.cfg.block_tokens
    best, best_hits, best_load = -1, -1, 0
    for k, inst in enumerate(view.routed):
        if loads[k] > limit:
            continue
        h = inst.pool.lookup(req.blocks, min(cap, len(req.blocks))) if view.prefix else 0
        if h > best_hits or (h == best_hits and loads[k] < best_load):
            best, best_hits, best_load = k, h, loads[k]
    return best


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def route_nb(sim: Sim, i: int) -> int:
    rq = sim.rq
    ist = sim.ist
    pool = sim.pool
    prm = sim.prm
    buf = sim.buf
    q_len = ist.q_len
    n_running = ist.n_running
    boff = rq.block_offsets
    inp = rq.input_tokens
    shared = rq.shared
    slot_of = pool.slot_of
    found = buf.found
    n_inst = n_routed_nb(prm)
    min_load = q_len[0] + n_running[0]
    for kk in range(1, n_inst):
        ld = q_len[kk] + n_running[kk]
        if ld < min_load:
            min_load = ld
    limit = min_load + prm.affinity_overload
    hcap = (inp[i] - 1) // prm.block_tokens
    nb = boff[i + 1] - boff[i]
    if nb < hcap:
        hcap = nb
    k = -1
    best_hits = -1
    best_load = 0
    if hcap > 0 and shared[boff[i]] >= 0:
        # each instance's first look-up misses: let the misses overlap
        for kk in range(n_inst):
            prefetch(slot_of, kk * prm.n_shared + shared[boff[i]])
    for kk in range(n_inst):
        ld = q_len[kk] + n_running[kk]
        if ld > limit:
            continue
        h = hbm_lookup_nb(
            slot_of, kk * prm.n_shared, shared, boff[i], hcap, found, prm.swa_off, prm.swa_need
        )
        if not prm.prefix_caching:
            h = 0
        if h > best_hits or (h == best_hits and ld < best_load):
            k = kk
            best_hits = h
            best_load = ld
    return k
