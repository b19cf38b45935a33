"""Chained 64-bit block hashes.

A chained hash identifies a block *and everything before it*: ``h_i = mix(h_{i-1}, id_i)``.
Two blocks with equal chained hashes therefore have equal prefixes, which is what prefix
caching needs. Importers whose source ids are per-block content ids, and the synthesiser, build
chains with :func:`chain_hashes`. The mixer is SplitMix64's finaliser (Steele et al., 2014),
a bijection on 64-bit words with good avalanche, so distinct chains collide only by chance
(about n^2 / 2^65 for n blocks).
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


@njit(cache=True, nogil=True, inline="always")
def mix64_nb(x: np.uint64) -> np.uint64:
    """SplitMix64 finaliser: a bijective 64-bit mixer."""
    z = x + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


@njit(cache=True, nogil=True)
def _chain_hashes_nb(offsets: np.ndarray, ids: np.ndarray, seeds: np.ndarray) -> np.ndarray:
    out = np.empty(ids.shape[0], dtype=np.uint64)
    for r in range(offsets.shape[0] - 1):
        h = seeds[r]
        for j in range(offsets[r], offsets[r + 1]):
            h = mix64_nb(h ^ mix64_nb(ids[j]))
            out[j] = h
    return out


def chain_hashes(
    offsets: np.ndarray, ids: np.ndarray, seeds: np.ndarray | int | None = None
) -> np.ndarray:
    """Chain per-block content ids into prefix hashes, request by request.

    ``ids[offsets[r]:offsets[r+1]]`` are request ``r``'s block content ids in prompt order;
    the result has the same layout, with ``out[j]`` a hash of ``ids`` from the request's start
    through ``j``. ``seeds`` (one per request, or one for all) salts the chains, for example by
    tenant; requests with equal seeds and equal id prefixes get equal hashes.
    """
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    ids = np.ascontiguousarray(ids, dtype=np.uint64)
    n = offsets.shape[0] - 1
    if n < 0 or offsets[0] != 0 or offsets[-1] != ids.shape[0] or np.any(np.diff(offsets) < 0):
        raise ValueError("offsets must start at 0, end at len(ids) and not decrease")
    if seeds is None:
        seeds_arr = np.zeros(n, dtype=np.uint64)
    elif np.isscalar(seeds):
        seeds_arr = np.full(n, seeds, dtype=np.uint64)
    else:
        seeds_arr = np.ascontiguousarray(seeds, dtype=np.uint64)
        if seeds_arr.shape[0] != n:
            raise ValueError(f"seeds has {seeds_arr.shape[0]} entries, expected {n}")
    return _chain_hashes_nb(offsets, ids, seeds_arr)
