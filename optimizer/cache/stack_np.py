"""The one-pass LRU curve's stack distances with NumPy alone, for small traces.

:func:`kvtier.cache.mrc.lru_stack_hist_nb` walks the trace once, touch by touch; importing
numba and loading its cached machine code costs about 0.7 s of CPU before the first access,
more than the whole curve of a 10,000-request trace. This module computes the same histogram
offline, with a few dozen whole-array NumPy passes, and is used below
:data:`kvtier.cache.curve.NUMPY_STACK_MAX` block references.

The distance of a lookup whose block was last touched at time ``tb``, taken when ``R``
touches have happened, is the number of distinct blocks touched in ``[tb, R)``: the touches
``k`` in that window that are the latest of their block, i.e. whose block is not touched
again before ``R`` (``nxt[k] >= R``). That is a static range count over the sequence ``nxt``
(how many of ``nxt[tb:R]`` are below ``R``), which a wavelet matrix over ``nxt`` answers for
every lookup at once, one bit level at a time.

Prefix semantics (all lookups of a request before its touches, touches tail-first, a block's
hit needs every block before it resident) and flat semantics give the same histogram as the
kernel, exactly; a request that names one block twice is left to the kernel (``None``).
"""

from __future__ import annotations

import numpy as np

from kvtier.cache import enums


def count_below(
    values: np.ndarray, lo: np.ndarray, hi: np.ndarray, bound: np.ndarray
) -> np.ndarray:
    """For each query ``i``: how many of ``values[lo[i]:hi[i]]`` are ``< bound[i]``.

    A wavelet matrix over ``values`` (non-negative integers), walked from the top bit down
    for all queries together: where the bound's bit is 1, the range's elements with a 0 bit
    are below it and counted, and the range follows the 1s; else it follows the 0s.
    """
    count = np.zeros(len(lo), dtype=np.int64)
    if len(lo) == 0 or len(values) == 0:
        return count
    top = max(int(values.max()), int(bound.max()))
    seq = values.astype(np.int64, copy=True)
    lo = lo.astype(np.int64, copy=True)
    hi = hi.astype(np.int64, copy=True)
    rank0 = np.zeros(len(seq) + 1, dtype=np.int64)
    for level in range(max(top.bit_length(), 1) - 1, -1, -1):
        one = ((seq >> level) & 1).astype(bool)
        np.cumsum(~one, out=rank0[1:])
        zeros = rank0[-1]
        up = ((bound >> level) & 1).astype(bool)
        z_lo = rank0[lo]
        z_hi = rank0[hi]
        count += np.where(up, z_hi - z_lo, 0)
        lo = np.where(up, zeros + lo - z_lo, z_lo)
        hi = np.where(up, zeros + hi - z_hi, z_hi)
        seq = np.concatenate((seq[~one], seq[one]))
    return count


def lru_stack_hist_np(
    offsets: np.ndarray, ids: np.ndarray, n_blocks: int, semantics: int, first_measured: int
) -> np.ndarray | None:
    """:func:`kvtier.cache.mrc.lru_stack_hist_nb`'s histogram (``n_blocks + 2`` slots, the
    last for cold misses), or None when a request names a block twice (prefix semantics)."""
    inf = n_blocks + 1
    hist = np.zeros(n_blocks + 2, dtype=np.int64)
    n_refs = len(ids)
    if n_refs == 0:
        return hist
    offsets = offsets.astype(np.int64, copy=False)
    sizes = np.diff(offsets)
    req = np.repeat(np.arange(len(sizes), dtype=np.int64), sizes)
    pos = np.arange(n_refs, dtype=np.int64)
    if semantics == enums.PREFIX:
        # access j of a request [lo, hi) is touched at time lo + (hi - 1 - j): tail first
        touch_time = offsets[req] + offsets[req + 1] - 1 - pos
        window_end = offsets[req]  # lookups all come before the request's touches
    else:
        touch_time = pos
        window_end = pos
    order = np.empty(n_refs, dtype=np.int64)
    order[touch_time] = pos  # the access touched at each time
    seq = ids[order].astype(np.int64, copy=False)
    # previous and next touch of the same block, by a stable sort on the block id
    by_block = np.argsort(seq, kind="stable")
    same = seq[by_block[1:]] == seq[by_block[:-1]]
    prev_t = np.full(n_refs, -1, dtype=np.int64)
    prev_t[by_block[1:][same]] = by_block[:-1][same]
    next_t = np.full(n_refs, n_refs, dtype=np.int64)
    next_t[by_block[:-1][same]] = by_block[1:][same]
    tb = prev_t[touch_time]  # per access, in request order
    if semantics == enums.PREFIX and (tb >= window_end).any():
        return None  # a block twice in one request: its lookups see the state before both
    dist = np.full(n_refs, inf, dtype=np.int64)
    warm = tb >= 0
    lo, hi = tb[warm], window_end[warm]
    # distinct blocks in [lo, hi) = touches there whose next touch is at or after hi
    dist[warm] = (hi - lo) - count_below(next_t, lo, hi, hi)
    if semantics == enums.PREFIX:
        # running maximum within each request: offset by request so one pass stays in it
        shifted = dist + req * (inf + 1)
        dist = np.maximum.accumulate(shifted) - req * (inf + 1)
    measured = req >= first_measured
    hist += np.bincount(dist[measured], minlength=n_blocks + 2)
    return hist
