"""``kv_aware``: Dynamo's KV router cost, the lowest ``serving.kv_overlap_weight x`` the prompt
blocks left to prefill (an HBM hit counts 1, a lower-tier hit its tier's weight,
:func:`kvtier.sim.routing.kv_route_weights`) plus the instance's active blocks (the prompt
blocks of the requests routed to it and not finished, plus this request's blocks that are not
HBM hits); ties go to the lower index."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_hbm import hbm_lookup_nb
from kvtier.sim.nb_state import INNER, Sim
from kvtier.sim.nb_tiers import Refs, lookup_nb
from kvtier.sim.routers.base_nb import n_routed_nb

if TYPE_CHECKING:
    from kvtier.sim.routers import RouteView


def route(view: RouteView, req: Any) -> int:
    B = view.cfg.block_tokens
    cap = min((req.input_tokens - 1) // B, len(req.blocks))
    n_req = -(-req.input_tokens // B)
    best, best_cost = -1, np.inf
    for k, inst in enumerate(view.routed):
        h = inst.pool.lookup(req.blocks, cap) if view.prefix else 0
        eff = float(h)
        if view.lower is not None:
            for t in view.lower.lookup(k, req.blocks, h, cap):
                eff += view.route_w[t, k]
        cost = view.cfg.kv_overlap_weight * (req.input_tokens / B - eff) + (
            inst.active_blocks + n_req - h
        )
        if cost < best_cost:
            best, best_cost = k, cost
    return best


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def route_nb(sim: Sim, i: int) -> int:
    """The same float operations in the same order as :func:`route`."""
    rq = sim.rq
    ist = sim.ist
    pool = sim.pool
    ts = sim.ts
    tp = sim.tp
    prm = sim.prm
    buf = sim.buf
    boff = rq.block_offsets
    inp = rq.input_tokens
    B = prm.block_tokens
    hcap = (inp[i] - 1) // B
    nb = boff[i + 1] - boff[i]
    if nb < hcap:
        hcap = nb
    n_req = (inp[i] + B - 1) // B
    best = -1
    best_cost = np.inf
    for kk in range(n_routed_nb(prm)):
        h = 0
        if prm.prefix_caching:
            h = hbm_lookup_nb(
                pool.slot_of, kk * prm.n_shared, rq.shared, boff[i], hcap, buf.found,
                prm.swa_off, prm.swa_need,
            )  # fmt: skip
        eff = float(h)
        if tp.n_tiers > 0:
            n_src = lookup_nb(ts, tp, kk, Refs(rq.block_ids, boff[i], h, hcap), buf.src, np.inf)
            for j in range(n_src):
                eff += prm.route_w[buf.src[j], kk]
        cost = prm.kv_overlap_weight * (inp[i] / B - eff) + (ist.active_blocks[kk] + n_req - h)
        if cost < best_cost:
            best = kk
            best_cost = cost
    return best
