"""The shared tier loop (numba): look up, admit, evict until it fits, insert.

Policies only provide primitives (``hit_nb``, ``admit_nb``, ``insert_nb``, ``evict_nb``,
``remove_nb`` in ``kvtier.cache.policies``, see ``kvtier.cache.policies.base``), reached through
the dispatchers of :mod:`kvtier.cache.hooks`, generated from the registry; capacity rules live
here, once. Every kernel takes a tier's state as one :class:`kvtier.cache.nb_state.TierArrays`
(``tier``), built by :meth:`kvtier.cache.state.TierState.arrays`: the named tuple
``(meta, fmeta, blk, prio, stamp, heap, hpos, cost)``.

Nothing here checks bounds: the Python wrappers check every block id and array before a call.
Capacities are in blocks and every block has size 1.

Performance notes (measured on the 2-core VM, see docs/benchmarks.md): every cache kernel is
compiled with ``_nrt=False`` because none of them allocates, and with numba's reference counting
on, the incref/decref of the eleven state arrays at each primitive call made an access about ten
times slower. A call passes the named tuple's arrays as the same machine words as the eight
separate arguments it replaced (side by side in docs/benchmarks.md, "Cache engine: the bundled
tier state"). The batch kernels (:mod:`kvtier.cache.kernels`) branch on the policy once and
inline a loop of this module specialised to it (``_replay_loop_nb(0, ...)``), so LLVM drops the
other policies' code from the hot loop; dispatching per access cost another factor of about
three. Flat LRU and FIFO replays from an empty tier do not come here: :mod:`kvtier.cache.ring`
runs them without link rows.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache import hooks
from kvtier.cache.enums import (
    L_WHERE,
    M_CAPACITY,
    M_CLOCK,
    M_N_EVICTIONS,
    M_POLICY,
    M_SIZE,
    NIL,
    PREFIX,
    W_MAIN,
    W_SMALL,
)
from kvtier.cache.nb_state import TierArrays


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def contains_nb(tier: TierArrays, b: int) -> bool:
    """Is block ``b`` resident? Changes nothing (a ghost entry is not residency)."""
    w = tier.blk[b, L_WHERE]
    return w == W_MAIN or w == W_SMALL  # noqa: SIM109 - two compares, no tuple, in numba


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def access_as_nb(pol: int, tier: TierArrays, b: int) -> tuple[bool, int]:
    """Access block ``b`` under policy ``pol`` (the tier's own, or a constant that lets LLVM
    drop the other policies' code): a hit updates the policy, a miss admits it.

    Returns ``(hit, evicted)``: ``evicted`` is the block that left the tier to make room
    (NIL if none; with unit-size blocks at most one leaves per access), which a caller with a
    tier below uses for write-back. Under GDSF the evicted block can be ``b`` itself: it was
    admitted and lost to every resident block.
    """
    meta = tier.meta
    meta[M_CLOCK] += 1
    if contains_nb(tier, b):
        hooks.hit_nb(pol, tier, b)
        return True, NIL
    flag = hooks.admit_nb(pol, tier, b)
    if flag < 0 or meta[M_CAPACITY] < 1:
        return False, NIL
    victim = NIL
    if hooks.admit_first_nb(pol):
        # GreedyDual admits first and then evicts the minimum, which may be the new block
        # itself (libCacheSim GDSF_get).
        if hooks.insert_nb(pol, tier, b, flag):
            meta[M_SIZE] += 1
        while meta[M_SIZE] > meta[M_CAPACITY]:
            victim = hooks.evict_nb(pol, tier)
            meta[M_SIZE] -= 1
            meta[M_N_EVICTIONS] += 1
        return False, victim
    while meta[M_SIZE] + 1 > meta[M_CAPACITY]:
        v = hooks.evict_nb(pol, tier)
        if v != NIL:
            victim = v
            meta[M_SIZE] -= 1
            meta[M_N_EVICTIONS] += 1
    if hooks.insert_nb(pol, tier, b, flag):
        meta[M_SIZE] += 1
    return False, victim


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def evict_one_nb(tier: TierArrays) -> int:
    """Evict the block the tier's policy chooses next and return it (a batch eviction's
    victims, one by one: :mod:`kvtier.cache.watermark`); the tier must hold a block. A policy
    step that evicts nothing (S3-FIFO moving a block between its queues) is repeated."""
    meta = tier.meta
    while True:
        v = hooks.evict_nb(meta[M_POLICY], tier)
        if v != NIL:
            meta[M_SIZE] -= 1
            meta[M_N_EVICTIONS] += 1
            return v


@njit(cache=True, nogil=True, _nrt=False)
def discard_nb(tier: TierArrays, b: int) -> bool:
    """Drop block ``b`` from the tier (and from S3-FIFO's ghost); True if it was resident."""
    resident = contains_nb(tier, b)
    hooks.remove_nb(tier.meta[M_POLICY], tier, b, resident)
    if resident:
        tier.meta[M_SIZE] -= 1
    return resident


@njit(cache=True, nogil=True, _nrt=False)
def access_nb(tier: TierArrays, b: int) -> tuple[bool, int]:
    """Access block ``b`` under the tier's policy; see :func:`access_as_nb`."""
    return access_as_nb(tier.meta[M_POLICY], tier, b)


# ---- batch loops (specialised per policy by kvtier.cache.kernels) ---------------------------


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _replay_loop_nb(
    pol: int,
    tier: TierArrays,
    offsets: np.ndarray,
    ids: np.ndarray,
    semantics: int,
    hits_out: np.ndarray,
) -> None:
    n = len(offsets) - 1
    for r in range(n):
        lo = offsets[r]
        hi = offsets[r + 1]
        h = 0
        if semantics == PREFIX:
            while lo + h < hi and contains_nb(tier, ids[lo + h]):
                h += 1
            for j in range(hi - 1, lo - 1, -1):
                access_as_nb(pol, tier, ids[j])
        else:
            for j in range(lo, hi):
                hit, _ = access_as_nb(pol, tier, ids[j])
                if hit:
                    h += 1
        hits_out[r] = h


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _access_many_loop_nb(
    pol: int, tier: TierArrays, ids: np.ndarray, hit_out: np.ndarray, evicted_out: np.ndarray
) -> None:
    for j in range(len(ids)):
        hit, v = access_as_nb(pol, tier, ids[j])
        hit_out[j] = hit
        evicted_out[j] = v
