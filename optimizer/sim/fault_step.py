"""Faults of the lower tiers: the reference step and its numba twin, side by side.

The rules (docs/model.md, "Faults"); the faults are rows of arrays built by
:func:`kvtier.sim.faults.fault_arrays`, one per failed pool:

- At the first event at or after ``at`` the fault takes its device down. A device fault
  (``tier``, ``device``, ``host``) loses the blocks the device holds: every block of the pool
  whose id maps to the device (``id % devices == device``, all of them for a whole pool) is
  removed, in ascending id order, and its id recorded; a ``switch`` fault keeps them.
- While down (``at <= now < at + down``) the device is unreachable: a look-up does not find a
  block of it (the run of found blocks ends there, so the request recomputes from it), a copy
  down into it is dropped (no transfer, no counts), and a victim cascading into it is lost.
- At ``at + down`` it is back, empty of what it lost. It refills by the write policy, and with
  a rebuild rate the lost blocks come back from replicas, the ``j``-th (from 0) at
  ``up + (j + 1) * seconds_per_block`` (applied at the first event at or after that time; a
  block already back by a write is skipped, a rebuilt block's eviction victim is discarded).

Faults are advanced once per event instant, before anything else at that instant. No lower
tier is read or written between two events, so advancing at every instant the reference
visits and only at those the kernel visits (it runs decode steps ahead) gives the same state.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import L_WHERE, M_POLICY, W_MAIN, W_SMALL
from kvtier.cache.nb import access_as_nb, discard_nb
from kvtier.cache.nb_state import TierArrays
from kvtier.sim.faults import (
    DOWN,
    FI_CURSOR,
    FI_DEV,
    FI_LOSE,
    FI_LOST,
    FI_NDEV,
    FI_POOL,
    FI_STATE,
    FT_AT,
    FT_REBUILD,
    FT_UP,
    PENDING,
    UP,
)
from kvtier.sim.nb_state import DIRTY_SPAN


class RefFaults:
    """The reference step: the fault rows and the lower tiers' pools they act on."""

    def __init__(
        self, fi: np.ndarray, ft: np.ndarray, lost: np.ndarray, n_blocks: int, n_faults: int
    ) -> None:
        self.n_faults = n_faults
        self.fi = fi.copy()
        self.ft = ft.copy()
        self.lost = lost.copy()
        self.n_blocks = max(int(n_blocks), 1)

    def down(self, p: int, b: int) -> bool:
        """Is block ``b`` of pool ``p`` on a device that is down?"""
        for f in range(self.fi.shape[0]):
            row = self.fi[f]
            if row[FI_STATE] == DOWN and row[FI_POOL] == p:
                d = row[FI_DEV]
                if d < 0 or b % row[FI_NDEV] == d:
                    return True
        return False

    def advance(self, pools: list[Any], now: float) -> None:
        """Take down, bring back and rebuild what ``now`` has reached."""
        for f in range(self.fi.shape[0]):
            row, times = self.fi[f], self.ft[f]
            pool = pools[int(row[FI_POOL])]
            if row[FI_STATE] == PENDING and now >= times[FT_AT]:
                row[FI_STATE] = DOWN
                if row[FI_LOSE] == 1:
                    n = 0
                    d, nd = int(row[FI_DEV]), int(row[FI_NDEV])
                    for b in range(self.n_blocks):
                        if (d < 0 or b % nd == d) and pool.contains(b):
                            pool.remove(b)
                            self.lost[f, n] = b
                            n += 1
                    row[FI_LOST] = n
            if row[FI_STATE] == DOWN and now >= times[FT_UP]:
                row[FI_STATE] = UP
            if row[FI_STATE] == UP:
                while (
                    row[FI_CURSOR] < row[FI_LOST]
                    and times[FT_UP] + (row[FI_CURSOR] + 1) * times[FT_REBUILD] <= now
                ):
                    b = int(self.lost[f, row[FI_CURSOR]])
                    if not pool.contains(b) and not self.down(int(row[FI_POOL]), b):
                        pool.access(b)
                    row[FI_CURSOR] += 1


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def fault_down_nb(ts, p, b):  # noqa: ANN001, ANN201
    """:meth:`RefFaults.down` over ``ts.fault_i``."""
    fi = ts.fault_i
    for f in range(fi.shape[0]):
        if fi[f, FI_STATE] == DOWN and fi[f, FI_POOL] == p:
            d = fi[f, FI_DEV]
            if d < 0 or b % fi[f, FI_NDEV] == d:
                return True
    return False


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _has_nb(ts, p, b):  # noqa: ANN001, ANN201
    w = ts.blk[p, b, L_WHERE]
    return w == W_MAIN or w == W_SMALL  # noqa: SIM109


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def _pool_nb(ts, p):  # noqa: ANN001, ANN201
    """Pool ``p``'s arrays as the cache engine's :class:`TierArrays` (views)."""
    return TierArrays(
        ts.meta[p], ts.fmeta[p], ts.blk[p], ts.prio[p], ts.stamp[p], ts.heap[p], ts.hpos[p],
        ts.cost[p],
    )  # fmt: skip


@njit(cache=True, nogil=True, _nrt=False)
def faults_advance_nb(ts, now):  # noqa: ANN001, ANN201
    """:meth:`RefFaults.advance` over the pools' stacked arrays and the fault rows of ``ts``."""
    fi, ft, lost = ts.fault_i, ts.fault_t, ts.fault_lost
    n_blocks = ts.blk.shape[1]
    for f in range(fi.shape[0]):
        p = fi[f, FI_POOL]
        if fi[f, FI_STATE] == PENDING and now >= ft[f, FT_AT]:
            fi[f, FI_STATE] = DOWN
            if fi[f, FI_LOSE] == 1:
                n = 0
                d, nd = fi[f, FI_DEV], fi[f, FI_NDEV]
                for b in range(n_blocks):
                    if (d < 0 or b % nd == d) and _has_nb(ts, p, b):
                        discard_nb(_pool_nb(ts, p), b)
                        lost[f, n] = b
                        n += 1
                fi[f, FI_LOST] = n
        if fi[f, FI_STATE] == DOWN and now >= ft[f, FT_UP]:
            fi[f, FI_STATE] = UP
        if fi[f, FI_STATE] == UP:
            while (
                fi[f, FI_CURSOR] < fi[f, FI_LOST]
                and ft[f, FT_UP] + (fi[f, FI_CURSOR] + 1) * ft[f, FT_REBUILD] <= now
            ):
                b = lost[f, fi[f, FI_CURSOR]]
                if not _has_nb(ts, p, b) and not fault_down_nb(ts, p, b):
                    access_as_nb(ts.meta[p, M_POLICY], _pool_nb(ts, p), b)
                    ts.dirty[p, b // DIRTY_SPAN] = 1  # (nb_tiers.touch_nb's rule)
                fi[f, FI_CURSOR] += 1
