"""Blocks being loaded from a lower tier, per instance: the numba engine's marks, and what a
request that hits them does.

vLLM's OffloadingConnector keeps, in its scheduler, the set of blocks whose loads into HBM are
in flight (``_blocks_being_loaded``, added by vLLM PR #29087; in the 0.15.1 to 0.34.0 wheels,
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``). A waiting request whose
lower-tier hits include one of them is not scheduled in that step (``get_num_new_matched_
tokens`` returns ``None`` and the scheduler moves on to the next waiting request); once the
load is done the blocks are in HBM's prefix cache and it hits them there. docs/model.md, "Hits
another request is loading".

The marks count, per instance and shared block (``k * n_shared + shared id``), the running
requests that loaded the block and have not yet put it into HBM's cache (as vLLM does when it
promotes the loader, :func:`promoted_nb`); a block read by one request only (shared id -1) is
never another request's hit and is not marked. The reference
keeps the same counts in a ``Counter`` per instance (:meth:`kvtier.sim.reference.
ReferenceReplay.admit`).

SGLang's radix tree takes the pages of a load-back at once (``init_load_back`` assigns the
node's device indices before the batch runs; the next request of the same batch matches them
in ``init_next_round_input``, sglang 0.5.23 ``managers/scheduler.py`` and
``mem_cache/unified_radix_cache.py``): with ``Params.shares_loading_hits`` a request's loaded
blocks enter HBM's cache at its admission, and a request that hits them before they have
arrived waits for their arrival (``HbmPools.loading_until``), loading nothing again.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_hbm import Run, hbm_register_nb, u64
from kvtier.sim.nb_state import INNER, ZERO, HbmPools, Params, RequestState, Sim


@njit(cache=True, nogil=True, inline="always")
def loading_hit_nb(loading: np.ndarray, base: int, shared: np.ndarray, start: int, n: int) -> bool:
    """Whether any of the ``n`` blocks from reference ``start`` is being loaded on the instance
    whose marks start at ``base``."""
    for j in range(start, start + n):
        m = shared[u64(j)]
        if m >= 0 and loading[u64(base + m)] > 0:
            return True
    return False


@njit(cache=True, nogil=True, inline="always")
def mark_loading_nb(
    loading: np.ndarray, base: int, shared: np.ndarray, start: int, n: int, by: int
) -> None:
    """Add ``by`` (1: a load issued, -1: its blocks are cached or given back) to the marks of
    the ``n`` blocks from reference ``start``."""
    for j in range(start, start + n):
        m = shared[u64(j)]
        if m >= 0:
            loading[u64(base + m)] += by


@njit(cache=True, nogil=True, inline="always")
def set_until_nb(
    until: np.ndarray, base: int, shared: np.ndarray, start: int, n: int, t: float
) -> None:
    """Set when the load of the ``n`` blocks from reference ``start`` ends to ``t`` (0: none
    under way)."""
    for j in range(start, start + n):
        m = shared[u64(j)]
        if m >= 0:
            until[u64(base + m)] = t


@njit(cache=True, nogil=True, inline="always")
def issued_nb(
    pool: HbmPools, rs: RequestState, i: int, base: int, shared: np.ndarray, bo: int, lo: int,
    hi: int,
) -> None:  # fmt: skip
    """Request ``i`` (prompt references from ``bo``) issued the load of its blocks ``lo:hi``:
    they are marked until its promotion (``Params.defers_loading_hits``)."""
    mark_loading_nb(pool.loading, base, shared, bo + lo, hi - lo, 1)
    rs.loading_lo[i] = lo
    rs.loading_hi[i] = hi


@njit(cache=True, nogil=True, inline="always")
def unmark_loading_nb(
    pool: HbmPools, prm: Params, base: int, shared: np.ndarray, bo: int, rs: RequestState,
    i: int,
) -> None:  # fmt: skip
    """Request ``i`` (prompt references from ``bo``) no longer loads its marked blocks: they
    are in HBM's cache (its promotion, or under ``shares_loading_hits`` its first step ended)
    or it was preempted."""
    lo = rs.loading_lo[i]
    hi = rs.loading_hi[i]
    if prm.defers_loading_hits:
        mark_loading_nb(pool.loading, base, shared, bo + lo, hi - lo, -1)
    if prm.shares_loading_hits:
        set_until_nb(pool.loading_until, base, shared, bo + lo, hi - lo, 0.0)
    rs.loading_hi[i] = 0


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def promoted_nb(sim: Sim, k: int, i: int) -> None:
    """Request ``i``'s load on instance ``k`` has ended and the scheduler takes it into a step
    for the first time since (``Params.defers_loading_hits``): vLLM promotes it and caches its
    loaded blocks then (``_update_waiting_for_remote_kv``: ``cache_blocks``), before it tries
    the waiting requests, so its marks end and a deferred request hits them in this step (the
    reference's ``ReferenceReplay.promote``)."""
    rq = sim.rq
    rs = sim.rs
    bo = rq.block_offsets[i]
    base = k * sim.prm.n_shared
    hi = rs.computed_from[i]
    hbm_register_nb(
        sim.pool, rq, base, bo, Run(rs.slot_off[i], rs.registered[i], hi), sim.buf.wbuf, ZERO,
        hi,
    )  # fmt: skip
    rs.registered[i] = hi
    unmark_loading_nb(sim.pool, sim.prm, base, rq.shared, bo, rs, i)


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def share_loads_nb(sim: Sim, k: int, i: int, h: int, loaded: int) -> None:
    """Request ``i``, just admitted on instance ``k`` with ``h`` HBM hits and ``loaded`` blocks
    loading (``Params.shares_loading_hits``): a hit on a block still arriving makes it wait for
    that block (its ``ready``); its own loaded blocks enter HBM's cache now, marked until its
    first step ends with when they arrive (the reference's ``ReferenceReplay.share_loads``)."""
    rq = sim.rq
    rs = sim.rs
    until = sim.pool.loading_until
    shared = rq.shared
    bo = rq.block_offsets[i]
    base = k * sim.prm.n_shared
    wait = 0.0  # (a time no later than now: no wait)
    for j in range(bo, bo + h):
        m = shared[u64(j)]
        if m >= 0 and until[u64(base + m)] > wait:
            wait = until[u64(base + m)]
    if loaded > 0:
        hbm_register_nb(
            sim.pool, rq, base, bo, Run(rs.slot_off[i], h, h + loaded), sim.buf.wbuf, ZERO,
            h + loaded,
        )  # fmt: skip
        set_until_nb(until, base, shared, bo + h, loaded, rs.ready[i])
        rs.registered[i] = h + loaded
        rs.loading_lo[i] = h
        rs.loading_hi[i] = h + loaded
    if wait > rs.ready[i]:
        rs.ready[i] = wait
