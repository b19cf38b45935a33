"""``cost_aware``: load the first ``c`` found blocks, ``c`` minimising the estimated load time
of those plus the time to recompute the rest (ties: load more)."""

from __future__ import annotations

from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_state import INNER
from kvtier.sim.nb_tiers import Prefill, load_cost_nb


def choose(lower: Any, inst: int, now: float, src: list[int], hbm_hits: int, B: int) -> int:
    counts = [0] * lower.cfg.n_tiers
    best_c = 0
    best = lower.load_cost(inst, now, counts, len(src) * B, hbm_hits * B)
    for k in range(1, len(src) + 1):
        counts[src[k - 1]] += 1
        v = lower.load_cost(inst, now, counts, (len(src) - k) * B, (hbm_hits + k) * B)
        if v <= best:
            best, best_c = v, k
    return best_c


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def choose_nb(sim, k, now, n_src, hbm_hits, timing):  # noqa: ANN001, ANN201
    """The same loop as :func:`choose` over the found blocks' sources ``sim.buf.src``."""
    tp = sim.tp
    lk = sim.lk
    src = sim.buf.src
    counts = sim.buf.counts
    B = sim.prm.block_tokens
    for t in range(tp.n_tiers):
        counts[t] = 0
    best_c = 0
    best = load_cost_nb(tp, lk, k, now, counts, Prefill(n_src * B, hbm_hits * B, timing))
    for c in range(1, n_src + 1):
        counts[src[c - 1]] += 1
        pf = Prefill((n_src - c) * B, (hbm_hits + c) * B, timing)
        v = load_cost_nb(tp, lk, k, now, counts, pf)
        if v <= best:
            best = v
            best_c = c
    return best_c
