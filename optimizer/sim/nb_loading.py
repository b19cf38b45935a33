"""Blocks being loaded from a lower tier, per instance: the numba engine's marks.

vLLM's OffloadingConnector keeps, in its scheduler, the set of blocks whose loads into HBM are
in flight (``_blocks_being_loaded``, added by vLLM PR #29087; in the 0.15.1 to 0.34.0 wheels,
``distributed/kv_transfer/kv_connector/v1/offloading/scheduler.py``). A waiting request whose
lower-tier hits include one of them is not scheduled in that step (``get_num_new_matched_
tokens`` returns ``None`` and the scheduler moves on to the next waiting request); once the
load is done the blocks are in HBM's prefix cache and it hits them there. docs/model.md, "Hits
another request is loading".

The marks count, per instance and shared block (``k * n_shared + shared id``), the running
requests that loaded the block and have not yet put it into HBM's cache; a block read by one
request only (shared id -1) is never another request's hit and is not marked. The reference
keeps the same counts in a ``Counter`` per instance (:meth:`kvtier.sim.reference.
ReferenceReplay.admit`).
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_hbm import u64
from kvtier.sim.nb_state import RequestState


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
def unmark_loading_nb(
    loading: np.ndarray, base: int, shared: np.ndarray, bo: int, rs: RequestState, i: int
) -> None:
    """Request ``i`` (prompt references from ``bo``) no longer loads its marked blocks: they
    are in HBM's cache (its first step ended) or given back (preempted)."""
    lo = rs.loading_lo[i]
    mark_loading_nb(loading, base, shared, bo + lo, rs.loading_hi[i] - lo, -1)
    rs.loading_hi[i] = 0
