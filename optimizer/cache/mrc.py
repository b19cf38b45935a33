"""The one-pass LRU miss-ratio curve's kernel: exact stack distances in one jitted pass (the
curve's API is :mod:`kvtier.cache.curve`, which uses this above a million block references).

LRU with demand insertion is a stack algorithm: at capacity ``C`` the resident blocks are the
top ``C`` of one recency stack, so a block is resident iff its stack distance (distinct blocks
touched since its last touch, itself included) is ``<= C``. One pass computes every access's
distance by counting the "latest touch" marks at or after the block's last touch time
(O(N log N)), then a histogram gives the hits at every capacity at once. The marks are a bitmap
over touch times with a Fenwick tree over its 64-bit words: 9M touches take 1.1 MB of bits and a
1.1 MB tree, which stay in cache, where a Fenwick tree over the times themselves took 72 MB.
A new touch only sets a bit in the newest word, which enters the tree once, when it is full, so
the tree is updated once per re-touch rather than twice per touch (35% less time).

- Flat semantics: access ``j`` hits at capacity ``C`` iff ``d_j <= C``.
- Prefix semantics: all distances of a request are taken before its touches; block ``j`` is a
  prefix hit iff ``max(d_0..d_j) <= C`` (the prefix is contiguous), so the histogram counts the
  running maximum. Touches then go tail-first, exactly as the replay does.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache import enums
from kvtier.cache.curve import (  # noqa: F401  (the curve's API, defined without numba there)
    MrcPoint,
    MrcResult,
    _check_capacities,
    default_capacities,
    miss_ratio_curve,
    working_set_blocks,
)
from kvtier.cache.warmup import warmup_start
from kvtier.trace.blocked import BlockedTrace


@njit(cache=True, nogil=True, _nrt=False)
def _popcount_nb(x: int) -> int:
    """Set bits of a uint64 (SWAR)."""
    x = x - ((x >> np.uint64(1)) & np.uint64(0x5555555555555555))
    x = (x & np.uint64(0x3333333333333333)) + ((x >> np.uint64(2)) & np.uint64(0x3333333333333333))
    x = (x + (x >> np.uint64(4))) & np.uint64(0x0F0F0F0F0F0F0F0F)
    # add the byte counts with shifts (no multiply, so no wrap-around when run as plain Python)
    x = x + (x >> np.uint64(8))
    x = x + (x >> np.uint64(16))
    x = x + (x >> np.uint64(32))
    return np.int64(x & np.uint64(0x7F))


@njit(cache=True, nogil=True, _nrt=False)
def _marked_before_nb(bits: np.ndarray, tree: np.ndarray, t: int) -> int:
    """Marked touch times ``< t``: Fenwick sum over whole 64-bit words, popcount of the rest.

    ``t``'s word may be the newest, unsealed one; the tree holds every word before it.
    """
    w = t >> 6
    s = 0
    i = w
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    r = t & 63
    if r:
        s += _popcount_nb(bits[w] & ((np.uint64(1) << np.uint64(r)) - np.uint64(1)))
    return s


@njit(cache=True, nogil=True, _nrt=False)
def _tree_add_nb(tree: np.ndarray, w: int, v: int) -> None:
    """Add ``v`` to the count of word ``w``."""
    i = w + 1
    n = len(tree)
    while i < n:
        tree[i] += v
        i += i & (-i)


@njit(cache=True, nogil=True, _nrt=False)
def _touch_nb(bits: np.ndarray, tree: np.ndarray, last: np.ndarray, b: int, t: int) -> int:
    """Block ``b`` touched at time ``t``; returns 1 if it was never touched before.

    Times only grow, so the new mark always lands in the newest word. That word enters the
    Fenwick tree once, whole, when time moves past it (:func:`_seal_word_nb`); until then its
    marks are counted from the word itself. Only unmarking an older touch updates the tree.
    """
    new = 0
    tb = last[b]
    if tb >= 0:
        w = tb >> 6
        bits[w] ^= np.uint64(1) << np.uint64(tb & 63)
        if w != t >> 6:  # a sealed word: its count is in the tree
            _tree_add_nb(tree, w, -1)
    else:
        new = 1
    bits[t >> 6] |= np.uint64(1) << np.uint64(t & 63)
    last[b] = t
    if t & 63 == 63:
        _seal_word_nb(bits, tree, t >> 6)
    return new


@njit(cache=True, nogil=True, _nrt=False)
def _seal_word_nb(bits: np.ndarray, tree: np.ndarray, w: int) -> None:
    """Word ``w`` is complete: add its marks to the tree."""
    c = _popcount_nb(bits[w])
    if c:
        _tree_add_nb(tree, w, c)


@njit(cache=True, nogil=True, _nrt=False)
def lru_stack_hist_nb(
    offsets: np.ndarray,
    ids: np.ndarray,
    semantics: int,
    first_measured: int,
    bits: np.ndarray,
    tree: np.ndarray,
    last: np.ndarray,
    hist: np.ndarray,
) -> None:
    """Histogram of hit distances: ``hist[d]`` = measured block lookups that hit iff C >= d.

    ``hist`` has ``n_blocks + 2`` slots; slot ``n_blocks + 1`` collects cold misses. Scratch:
    ``bits`` (uint64, one bit per touch time, zeroed), ``tree`` (int64 Fenwick tree over the
    words of ``bits``, zeroed, ``len(bits) + 1``), ``last`` (int64 per block, filled with -1).
    The distance of a block last touched at ``t`` is the number of marked times ``>= t``.
    """
    inf = len(hist) - 1
    marked = 0
    t = 0
    n = len(offsets) - 1
    for r in range(n):
        lo = offsets[r]
        hi = offsets[r + 1]
        measured = r >= first_measured
        if semantics == enums.PREFIX:
            m = 0
            for j in range(lo, hi):
                if m < inf:
                    tb = last[ids[j]]
                    d = inf if tb < 0 else marked - _marked_before_nb(bits, tree, tb)
                    if d > m:
                        m = d
                # once a cold block is met, the rest of the request misses at every capacity
                if measured:
                    hist[m] += 1
            for j in range(hi - 1, lo - 1, -1):
                marked += _touch_nb(bits, tree, last, ids[j], t)
                t += 1
        else:
            for j in range(lo, hi):
                b = ids[j]
                tb = last[b]
                d = inf if tb < 0 else marked - _marked_before_nb(bits, tree, tb)
                if measured:
                    hist[d] += 1
                marked += _touch_nb(bits, tree, last, b, t)
                t += 1


def lru_stack_hits(
    trace: BlockedTrace, capacities: list[int], *, flat: bool = False, warmup: float = 0.0
) -> np.ndarray:
    """Exact LRU hit blocks (measured requests) at each capacity, in one pass."""
    caps = _check_capacities(capacities)
    start = warmup_start(trace.n_requests, warmup)
    hist = np.zeros(trace.n_blocks + 2, dtype=np.int64)
    semantics = enums.FLAT if flat else enums.PREFIX
    words = trace.n_block_refs // 64 + 1
    bits = np.zeros(words, dtype=np.uint64)
    tree = np.zeros(words + 1, dtype=np.int64)
    last = np.full(trace.n_blocks, -1, dtype=np.int64)
    lru_stack_hist_nb(
        trace.block_offsets, trace.block_ids, semantics, start, bits, tree, last, hist
    )
    cum = np.cumsum(hist)
    return np.array([cum[min(c, trace.n_blocks)] for c in caps], dtype=np.int64)
