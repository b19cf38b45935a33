"""``llmd_epp``: llm-d's endpoint picker (EPP) as its tiered-prefix-cache guide configures it.

llm-d-router v0.10.0 (``pkg/epp/scheduling/scheduler_profile.go``, ``runScorerPlugins``) sums,
per instance, each scorer's score clamped to [0, 1] times the scorer's weight, in the
profile's order, and the ``max-score-picker`` takes the highest sum. The five scorers of the
guide's profile and the active-request scorer of an earlier one (``serving.epp_*_weight``, in
this order):

* ``queue-scorer`` (``scorer/queuedepth/queue.go``): ``(max_q - q) / (max_q - min_q)`` over
  the candidates' waiting requests ``q``; 1 for every instance when all queues are equal;
* ``kv-cache-utilization-scorer`` (``scorer/kvcacheutilization``): ``1 - usage``, vLLM's
  ``kv_cache_usage_perc`` (the share of HBM blocks not in the free queue);
* ``prefix-cache-scorer`` fed by the GPU prefix producer (``scorer/prefix/plugin.go``):
  matched prefix blocks / the prompt's blocks (reading the caches: the HBM prefix hit);
* the same scorer fed by the CPU producer (reading the caches: the prefix held in HBM or a
  lower tier, the HBM hit plus the blocks after it found below);
* ``no-hit-lru-scorer`` (``scorer/nohitlru/no_hit_lru.go``): 0.5 for every instance when any
  instance has a prefix hit; else (a "cold" request) ``1 - rank / (n - 1)``, ranking first
  the instances that never took a cold request (in index order), then the others from the
  least recently to the most recently (1 when n = 1); the chosen instance of a cold request
  becomes the most recent;
* ``active-request-scorer`` (llm-d-inference-scheduler v0.4.0, ``pkg/plugins/scorer/
  active_request.go``; the same arithmetic at v0.3.2 and, at its default parameters, v0.8.0):
  ``a`` = requests routed to the instance and not finished (the EPP counts a request from its
  pick to the end of its response); 1 when ``a`` = 0, else ``(max_a - a) / max_a`` with
  ``max_a`` the most on any instance.

The two prefix scorers read, as the EPP does, its own LRU indexes of where it sent prompts
(``SimConfig.epp_index``, :mod:`kvtier.sim.routers.epp_index`), or, with ``epp_index`` empty,
the instances' cached blocks. The ``max-score-picker`` breaks ties at random (it shuffles the
candidates before a stable sort by score: ``picker/maxscore/picker.go`` at v0.10.0, and
gateway-api-inference-extension v1.0.1's ``max_score_picker.go``); here each tie is settled
by a draw fixed by the request's index (:func:`tie_draw`), uniform over the tied instances,
so a replay stays deterministic and both engines pick alike. The queue and KV-utilisation
scorers read each instance's waiting requests and KV use as the EPP last scraped them
(``SimConfig.epp_metrics_interval_s``, :mod:`kvtier.sim.routers.epp_metrics`), or with an
interval of 0 the exact state at the arrival; the active-request scorer counts what the EPP
itself sent, at once."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_hbm import hbm_lookup_nb
from kvtier.sim.nb_state import INNER, IX_CNT, Sim
from kvtier.sim.nb_tiers import Refs, lookup_nb
from kvtier.sim.routers.base_nb import n_routed_nb
from kvtier.sim.routers.epp_index import (
    CPU,
    GPU,
    index_add_nb,
    index_match_nb,
)
from kvtier.sim.routers.epp_metrics import scraped_at, scraped_at_nb, seen, seen_nb

if TYPE_CHECKING:
    from kvtier.sim.routers import RouteView


# a prime below 2**32: every product in tie_draw stays inside int64, in Python and in numba
_TIE_P = 4294967291


def tie_draw(i: int, t: int) -> int:
    """A draw in ``[0, t)`` fixed by request ``i`` and the tie count ``t`` (``t >= 1``): the
    ``t``-th instance found at the best score replaces the pick when it is 0 (probability
    ``1/t``, reservoir sampling), which leaves each of the tied instances picked alike."""
    x = ((i % _TIE_P) * 69069 + t * 40503 + 12345) % _TIE_P
    x = ((x ^ (x >> 15)) * 1103515245) % _TIE_P
    x = ((x ^ (x >> 13)) * 1103515245) % _TIE_P
    return x % t


tie_draw_nb = njit(cache=True, nogil=True, **INNER)(tie_draw)


def _lru_score(stamps: list[int], k: int, n: int) -> float:
    """The no-hit-LRU score of instance ``k`` for a cold request (``stamps``: 0 never)."""
    if n <= 1:
        return 1.0
    never = sum(1 for s in stamps[:n] if s == 0)
    if stamps[k] == 0:
        rank = sum(1 for j in range(k) if stamps[j] == 0)
    else:
        rank = never + sum(1 for j in range(n) if 0 < stamps[j] < stamps[k])
    return 1.0 - float(rank) / float(n - 1)


def route(view: RouteView, req: Any) -> int:
    B = view.cfg.block_tokens
    nb = len(req.blocks)
    cap = min((req.input_tokens - 1) // B, nb)
    w = view.cfg.epp_weights
    insts = view.routed
    n = len(insts)
    hbm: list[int] = []
    held: list[int] = []
    mx = view.epp_metrics  # the queue and KV use the EPP last scraped, else the exact state
    tick = scraped_at(req.arrival, view.cfg.epp_metrics_interval_s) if mx is not None else 0.0
    waiting: list[int] = []
    free: list[int] = []
    for k, inst in enumerate(insts):
        if mx is not None:
            q, f = seen(mx, k, tick, inst.pool.capacity)
        else:
            q, f = len(inst.waiting), len(inst.pool.free)
        waiting.append(q)
        free.append(f)
    q_min = q_max = waiting[0]
    a_max = 0
    cold = True
    index = view.epp_index
    nh = [0, 0]
    if index is not None:  # the EPP's own indexes of where it sent prompts
        keys = index.keys(req.blocks, req.input_tokens, B)
        nh = [len(keys[GPU]), len(keys[CPU])]
        counts = index.match(keys, n)
    for k, inst in enumerate(insts):
        if index is not None:
            h, c = counts[GPU][k], counts[CPU][k]
        else:
            h = inst.pool.lookup(req.blocks, cap) if view.prefix else 0
            c = h
            if view.lower is not None:
                c += len(view.lower.lookup(k, req.blocks, h, cap))
        hbm.append(h)
        held.append(c)
        if h > 0:
            cold = False
        q = waiting[k]
        q_min = min(q_min, q)
        q_max = max(q_max, q)
        a_max = max(a_max, inst.load)
    best, best_score, ties = -1, -1.0, 0
    for k, inst in enumerate(insts):
        q = waiting[k]
        qs = 1.0 if q_max == q_min else float(q_max - q) / float(q_max - q_min)
        cap_k = inst.pool.capacity
        ks = 1.0 - float(cap_k - free[k]) / float(cap_k)
        ks = min(max(ks, 0.0), 1.0)
        den_g = nh[GPU] if index is not None else nb
        den_c = nh[CPU] if index is not None else nb
        gs = float(hbm[k]) / float(den_g) if den_g > 0 else 0.0
        cs = float(held[k]) / float(den_c) if den_c > 0 else 0.0
        ls = _lru_score(view.cold_stamp, k, n) if cold else 0.5
        a = inst.load
        as_ = 1.0 if a == 0 else float(a_max - a) / float(a_max)
        s = 0.0
        s += qs * w[0]
        s += ks * w[1]
        s += gs * w[2]
        s += cs * w[3]
        s += ls * w[4]
        s += as_ * w[5]
        if s > best_score:
            best, best_score, ties = k, s, 1
        elif s == best_score:
            ties += 1
            if tie_draw(req.idx, ties) == 0:
                best = k
    if cold:
        view.cold_stamp[best] = req.idx + 1
    if index is not None:
        index.add(best, keys)
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
    w = prm.epp_w
    stamps = ist.cold_stamp
    B = prm.block_tokens
    nb = boff[i + 1] - boff[i]
    hcap = (inp[i] - 1) // B
    if nb < hcap:
        hcap = nb
    n = n_routed_nb(prm)
    n_inst = prm.n_instances
    cnt = ist.ix_list[IX_CNT]
    nh_g = 0
    nh_c = 0
    if prm.epp_ix:  # the EPP's own indexes of where it sent prompts
        nh_g = prm.ix_koff[0, i + 1] - prm.ix_koff[0, i]
        nh_c = prm.ix_koff[1, i + 1] - prm.ix_koff[1, i]
        index_match_nb(ist, prm, i, n)
    # the queue and KV use the EPP last scraped (epp_metrics), else the exact state
    stale = prm.epp_mx_dt > 0.0
    tick = scraped_at_nb(rq.arrival[i], prm.epp_mx_dt) if stale else 0.0
    q_min, _ = seen_nb(ist.epp_mx, 0, tick, prm.capacities[0]) if stale else (ist.q_len[0], 0)
    q_max = q_min
    a_max = 0
    cold = True
    for kk in range(n):
        h = 0
        if prm.epp_ix:
            h = cnt[kk]
        elif prm.prefix_caching:
            h = hbm_lookup_nb(
                pool.slot_of, kk * prm.n_shared, rq.shared, boff[i], hcap, buf.found,
                prm.swa_off, prm.swa_need,
            )  # fmt: skip
        if h > 0:
            cold = False
        q = ist.q_len[kk]
        if stale:
            q, _ = seen_nb(ist.epp_mx, kk, tick, prm.capacities[kk])
        if q < q_min:
            q_min = q
        if q > q_max:
            q_max = q
        a = ist.q_len[kk] + ist.n_running[kk]  # (the EPP's own count of what it sent)
        if a > a_max:
            a_max = a
    never = 0
    for kk in range(n):
        if stamps[kk] == 0:
            never += 1
    best = -1
    best_score = -1.0
    ties = 0
    for kk in range(n):
        h = 0
        c = 0
        if prm.epp_ix:
            h = cnt[kk]
            c = cnt[n_inst + kk]
        else:
            if prm.prefix_caching:
                h = hbm_lookup_nb(
                    pool.slot_of, kk * prm.n_shared, rq.shared, boff[i], hcap, buf.found,
                    prm.swa_off, prm.swa_need,
                )  # fmt: skip
            c = h
            if tp.n_tiers > 0:
                c += lookup_nb(ts, tp, kk, Refs(rq.block_ids, boff[i], h, hcap), buf.src, np.inf)
        q = ist.q_len[kk]
        free = ist.free_len[kk]
        if stale:
            q, free = seen_nb(ist.epp_mx, kk, tick, prm.capacities[kk])
        qs = 1.0
        if q_max != q_min:
            qs = float(q_max - q) / float(q_max - q_min)
        cap_k = prm.capacities[kk]
        ks = 1.0 - float(cap_k - free) / float(cap_k)
        ks = min(max(ks, 0.0), 1.0)
        gs = 0.0
        cs = 0.0
        den_g = nh_g if prm.epp_ix else nb
        den_c = nh_c if prm.epp_ix else nb
        if den_g > 0:
            gs = float(h) / float(den_g)
        if den_c > 0:
            cs = float(c) / float(den_c)
        ls = 0.5
        if cold:
            if n <= 1:
                ls = 1.0
            else:
                rank = 0
                if stamps[kk] == 0:
                    for j in range(kk):
                        if stamps[j] == 0:
                            rank += 1
                else:
                    rank = never
                    for j in range(n):
                        if stamps[j] > 0 and stamps[j] < stamps[kk]:
                            rank += 1
                ls = 1.0 - float(rank) / float(n - 1)
        a = ist.q_len[kk] + ist.n_running[kk]
        as_ = 1.0
        if a != 0:
            as_ = float(a_max - a) / float(a_max)
        s = 0.0
        s += qs * w[0]
        s += ks * w[1]
        s += gs * w[2]
        s += cs * w[3]
        s += ls * w[4]
        s += as_ * w[5]
        if s > best_score:
            best = kk
            best_score = s
            ties = 1
        elif s == best_score:
            ties += 1
            if tie_draw_nb(i, ties) == 0:
                best = kk
    if cold:
        stamps[best] = i + 1
    if prm.epp_ix:
        index_add_nb(ist, prm, best, i)
    return best
