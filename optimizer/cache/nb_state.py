"""One cache tier's arrays as the named tuple every kernel of the cache engine takes.

numba compiles a ``NamedTuple`` as a plain tuple: a field read by name (``tier.blk``) costs
nothing, and a call passes the eight arrays as the same machine words as eight separate
arguments did. The layouts are fixed by :meth:`kvtier.cache.state.TierState.create`, which
fills and checks every array; kernels check nothing.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np


class TierArrays(NamedTuple):
    """A tier's state (struct of arrays); see :class:`kvtier.cache.state.TierState`."""

    meta: np.ndarray  # i8 (META_LEN,): scalars at the enums.M_* slots
    fmeta: np.ndarray  # f8 (FMETA_LEN,): GDSF inflation
    blk: np.ndarray  # i4 (n_blocks, BLK_LANES): lanes L_PRV, L_NXT, L_FREQ, L_WHERE
    prio: np.ndarray  # f8 (n_blocks,): heap priority (LFU, GDSF; length 1 otherwise)
    stamp: np.ndarray  # i8 (n_blocks,): heap tie-break, time of last access (idem)
    heap: np.ndarray  # i4 (capacity + 1,): LFU/GDSF heap (idem)
    hpos: np.ndarray  # i4 (n_blocks,): index in heap or -1 (idem)
    cost: np.ndarray  # f8 (n_blocks,): GDSF per-block cost (length 1 otherwise)
