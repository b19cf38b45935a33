"""Indexed binary min-heap over block ids, ordered by (priority, stamp) (numba kernels).

LFU and GDSF evict the block with the smallest priority and break ties by the smaller stamp
(the virtual time of its last access), exactly libCacheSim's orderings (``LFU.c`` frequency
buckets appended at the tail; ``abstractRank.hpp`` ``pq_node_type::operator<``). Stamps are
unique, so the minimum is unique and any correct heap evicts the same block. ``hpos[b]`` is
block ``b``'s index in ``heap`` (or -1), which makes update and removal O(log n).
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import M_HEAP_N, NIL


@njit(cache=True, nogil=True, _nrt=False)
def _less_nb(prio: np.ndarray, stamp: np.ndarray, a: int, b: int) -> bool:
    if prio[a] != prio[b]:
        return prio[a] < prio[b]
    return stamp[a] < stamp[b]


@njit(cache=True, nogil=True, _nrt=False)
def _sift_up_nb(
    heap: np.ndarray, hpos: np.ndarray, prio: np.ndarray, stamp: np.ndarray, i: int
) -> None:
    b = heap[i]
    while i > 0:
        parent = (i - 1) >> 1
        pb = heap[parent]
        if _less_nb(prio, stamp, b, pb):
            heap[i] = pb
            hpos[pb] = i
            i = parent
        else:
            break
    heap[i] = b
    hpos[b] = i


@njit(cache=True, nogil=True, _nrt=False)
def _sift_down_nb(
    heap: np.ndarray, hpos: np.ndarray, prio: np.ndarray, stamp: np.ndarray, i: int, n: int
) -> None:
    b = heap[i]
    while True:
        child = 2 * i + 1
        if child >= n:
            break
        right = child + 1
        if right < n and _less_nb(prio, stamp, heap[right], heap[child]):
            child = right
        cb = heap[child]
        if _less_nb(prio, stamp, cb, b):
            heap[i] = cb
            hpos[cb] = i
            i = child
        else:
            break
    heap[i] = b
    hpos[b] = i


@njit(cache=True, nogil=True, _nrt=False)
def heap_push_nb(
    meta: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    b: int,
) -> None:
    """Add block ``b`` with its current ``prio[b]`` and ``stamp[b]``."""
    n = meta[M_HEAP_N]
    heap[n] = b
    hpos[b] = n
    meta[M_HEAP_N] = n + 1
    _sift_up_nb(heap, hpos, prio, stamp, n)


@njit(cache=True, nogil=True, _nrt=False)
def heap_update_nb(
    meta: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    b: int,
) -> None:
    """Restore order after ``prio[b]`` or ``stamp[b]`` changed (in either direction)."""
    i = hpos[b]
    _sift_up_nb(heap, hpos, prio, stamp, i)
    _sift_down_nb(heap, hpos, prio, stamp, hpos[b], meta[M_HEAP_N])


@njit(cache=True, nogil=True, _nrt=False)
def heap_remove_nb(
    meta: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
    b: int,
) -> None:
    """Take block ``b`` out of the heap."""
    i = hpos[b]
    n = meta[M_HEAP_N] - 1
    meta[M_HEAP_N] = n
    hpos[b] = NIL
    if i == n:
        return
    last = heap[n]
    heap[i] = last
    hpos[last] = i
    _sift_up_nb(heap, hpos, prio, stamp, i)
    _sift_down_nb(heap, hpos, prio, stamp, hpos[last], n)


@njit(cache=True, nogil=True, _nrt=False)
def heap_pop_nb(
    meta: np.ndarray,
    heap: np.ndarray,
    hpos: np.ndarray,
    prio: np.ndarray,
    stamp: np.ndarray,
) -> int:
    """Remove and return the block with the smallest (priority, stamp)."""
    b = heap[0]
    heap_remove_nb(meta, heap, hpos, prio, stamp, b)
    return b
