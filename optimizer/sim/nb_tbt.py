"""Numba kernels of the per-request TBT tail: the longest token intervals of each request.

Request ``i`` keeps its ``k_i = off[i + 1] - off[i]`` longest intervals so far in
``heap[off[i]:off[i + 1]]``, a min-heap of ``count[i]`` values (the smallest kept one at the
root, the one a longer interval displaces), and the time its last token was seen in
``last[i]``. Which slots hold which values may differ from the reference's ``heapq`` list; the
multiset of the ``k_i`` largest intervals does not, and the mean at the finish sums it in
ascending order (popping the root), the order the reference sums its sorted list in, so both
give the same float. Decode steps run ahead (``kvtier.sim.nb.run_ahead_nb``) hand a request
its tokens' times in one call (:func:`tbt_run_nb`), so its slice is read once per run rather
than once per token. The wrapper (:mod:`kvtier.sim.engine`) sizes and checks the arrays; with
tracking off they are empty and nothing here runs.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_state import INNER


@njit(cache=True, nogil=True, inline="always")
def _sift_down_nb(heap: np.ndarray, o: int, size: int, x: float) -> None:
    """Place ``x`` at the root of the min-heap ``heap[o:o + size]`` and sift it down."""
    j = 0
    while True:
        c = 2 * j + 1
        if c >= size:
            break
        if c + 1 < size and heap[o + c + 1] < heap[o + c]:
            c += 1
        if heap[o + c] >= x:
            break
        heap[o + j] = heap[o + c]
        j = c
    heap[o + j] = x


@njit(cache=True, nogil=True, inline="always")
def _keep_nb(heap: np.ndarray, o: int, k: int, c: int, x: float) -> int:
    """Offer interval ``x`` to the min-heap ``heap[o:o + k]`` of ``c`` kept values: appended
    and sifted up while it is not full, else in place of the root when longer. Returns the
    new count."""
    if c < k:
        j = c
        while j > 0:
            p = (j - 1) // 2
            if heap[o + p] <= x:
                break
            heap[o + j] = heap[o + p]
            j = p
        heap[o + j] = x
        return c + 1
    if k > 0 and x > heap[o]:
        _sift_down_nb(heap, o, k, x)
    return c


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def tbt_token_nb(
    i: int, seen: float, heap: np.ndarray, off: np.ndarray, count: np.ndarray, last: np.ndarray
) -> None:
    """Request ``i``'s next token is seen at ``seen``: its interval joins the longest ones."""
    x = seen - last[i]
    last[i] = seen
    o = off[i]
    count[i] = _keep_nb(heap, o, off[i + 1] - o, count[i], x)


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def tbt_run_nb(
    i: int,
    seen: np.ndarray,
    steps: int,
    heap: np.ndarray,
    off: np.ndarray,
    count: np.ndarray,
    last: np.ndarray,
) -> None:
    """Request ``i``'s next ``steps`` tokens are seen at ``seen[:steps]`` (decode steps run
    ahead): :func:`tbt_token_nb` for each, in order, with the request's slice read once."""
    t_last = last[i]
    o = off[i]
    k = off[i + 1] - o
    c = count[i]
    for j in range(steps):
        c = _keep_nb(heap, o, k, c, seen[j] - t_last)
        t_last = seen[j]
    count[i] = c
    last[i] = t_last


@njit(cache=True, nogil=True, _nrt=False, **INNER)
def tbt_tail_nb(i: int, heap: np.ndarray, off: np.ndarray, count: np.ndarray) -> float:
    """Request ``i`` finished: the mean of its kept intervals, summed smallest first (the heap
    is consumed); NaN when it keeps none (fewer than two tokens)."""
    o = off[i]
    k = off[i + 1] - o
    if k == 0:
        return np.nan
    size = count[i]
    s = 0.0
    while size > 0:
        s += heap[o]
        size -= 1
        if size > 0:
            _sift_down_nb(heap, o, size, heap[o + size])
    count[i] = 0
    return s / k
