"""Flat LRU and FIFO replay from an empty tier, with the queue kept as a ring of block ids.

:func:`kvtier.cache.replay` uses these kernels when it builds the tier itself (no warm ``tier``
passed in) under flat semantics, the libCacheSim-parity mode. They give exactly the hits
of the linked-list policies in :mod:`kvtier.cache.policies` (tests/test_cache_ring.py
checks both against each other and the reference) but never build a
:class:`~kvtier.cache.state.TierState`: the replay only reports hits, so nothing needs
the per-block link rows afterwards.

Why (docs/benchmarks.md, "Cache engine"): on a sequence without locality, such as 10M Zipf
accesses over 1M ids, nearly every access of the linked-list kernels misses the CPU caches on
rows found by following links (the victim's neighbour, a hit block's neighbours), and each such
load waits for the one before it. Here every block is a single flag or slot number, and the
blocks an access touches are known many accesses in advance: the trace's ids, and the next
victims in the ring's order. The kernels prefetch them ``AHEAD`` accesses early, so the misses
overlap. Not building the 16-byte link rows also saves allocating and filling 90 MB per replay
of the 5.7M-block Mooncake trace.

- **FIFO:** the ring holds the resident blocks in insertion order; a hit changes nothing, a miss
  evicts the oldest and appends the new block. ``resident`` is one byte per block.
- **LRU:** every access appends the block; ``slot[b]`` is 1 + the ring index of ``b``'s latest
  entry, 0 if ``b`` is not resident. Older entries of ``b`` are stale and are skipped when
  eviction reaches them, so the oldest entry that is still its block's latest is the least
  recently used block. When the ring fills, it is compacted to the latest entries (at most
  ``capacity``); with four slots per block of capacity this costs at most 1/3 extra visit per
  access.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.enums import FIFO, LRU
from kvtier.cache.prefetch import prefetch

POLICIES = (LRU, FIFO)
AHEAD = 16  # accesses between prefetching a block's flag or slot and using it
LRU_RING_PER_BLOCK = 4  # ring entries per block of capacity under LRU
_MAX_RING = 2**31 - 1  # slots are int32


@njit(cache=True, nogil=True, _nrt=False)
def fifo_flat_nb(
    capacity: int,
    offsets: np.ndarray,
    ids: np.ndarray,
    resident: np.ndarray,
    ring: np.ndarray,
    hits_out: np.ndarray,
) -> int:
    """FIFO over requests ``offsets``/``ids`` (flat); hits per request; returns evictions.

    ``resident``: uint8 zeros, one per block id. ``ring``: int32, at least ``max(capacity, 1)``
    entries; ``capacity`` at most the number of block ids.
    """
    n_ring = len(ring)
    n_ids = len(ids)
    size = 0
    tail = 0  # oldest resident block
    head = 0  # next free entry
    evictions = 0
    for r in range(len(offsets) - 1):
        h = 0
        for j in range(offsets[r], offsets[r + 1]):
            if j + AHEAD < n_ids:
                prefetch(resident, ids[j + AHEAD])
            b = ids[j]
            if resident[b] != 0:
                h += 1
                continue
            if capacity < 1:
                continue
            if size >= capacity:
                v = ring[tail]
                tail += 1
                if tail == n_ring:
                    tail = 0
                if tail + AHEAD < n_ring:
                    prefetch(resident, ring[tail + AHEAD])
                resident[v] = 0
                evictions += 1
            else:
                size += 1
            resident[b] = 1
            ring[head] = b
            head += 1
            if head == n_ring:
                head = 0
        hits_out[r] = h
    return evictions


@njit(cache=True, nogil=True, _nrt=False)
def _compact_nb(slot: np.ndarray, ring: np.ndarray, tail: int, count: int) -> int:
    """Keep each block's latest entry among the ``count`` from ``tail``, in order, from
    ``tail`` on; returns the new head. Entries only move toward the tail, so none is
    overwritten before it is read."""
    n_ring = len(ring)
    w = tail
    i = tail
    for _ in range(count):
        y = ring[i]
        i += 1  # 1 + the index of the entry just read
        if i + AHEAD < n_ring:
            prefetch(slot, ring[i + AHEAD])
        if slot[y] == i:
            ring[w] = y
            w += 1
            slot[y] = w
            if w == n_ring:
                w = 0
        if i == n_ring:
            i = 0
    return w


@njit(cache=True, nogil=True, _nrt=False)
def lru_flat_nb(
    capacity: int,
    offsets: np.ndarray,
    ids: np.ndarray,
    slot: np.ndarray,
    ring: np.ndarray,
    hits_out: np.ndarray,
) -> int:
    """LRU over requests ``offsets``/``ids`` (flat); hits per request; returns evictions.

    ``slot``: int32 zeros, one per block id. ``ring``: int32, more entries than ``capacity``
    (which is at most the number of block ids) and below 2**31.
    """
    n_ring = len(ring)
    n_ids = len(ids)
    size = 0
    tail = 0  # oldest entry (maybe stale)
    head = 0  # next free entry
    count = 0  # entries from tail to head, stale ones included
    evictions = 0
    for r in range(len(offsets) - 1):
        h = 0
        for j in range(offsets[r], offsets[r + 1]):
            if j + AHEAD < n_ids:
                prefetch(slot, ids[j + AHEAD])
            b = ids[j]
            hit = slot[b] != 0
            if hit:
                h += 1
            elif capacity < 1:
                continue
            else:
                if size >= capacity:
                    # the oldest entry that is still its block's latest is the LRU block
                    while True:
                        v = ring[tail]
                        tail += 1
                        s = tail
                        if tail == n_ring:
                            tail = 0
                        count -= 1
                        if tail + AHEAD < n_ring:
                            prefetch(slot, ring[tail + AHEAD])
                        if slot[v] == s:
                            break
                    slot[v] = 0
                    size -= 1
                    evictions += 1
                size += 1
            if count == n_ring:
                head = _compact_nb(slot, ring, tail, count)
                count = size if hit else size - 1  # a missed block has no entry yet
            ring[head] = b
            head += 1
            slot[b] = head
            if head == n_ring:
                head = 0
            count += 1
        hits_out[r] = h
    return evictions


def replay_flat(
    code: int,
    capacity: int,
    n_blocks: int,
    offsets: np.ndarray,
    ids: np.ndarray,
    hits_out: np.ndarray,
) -> int:
    """Flat replay of an empty ``code`` (LRU or FIFO) tier of ``capacity`` blocks over ids
    ``0..n_blocks-1``; fills ``hits_out`` per request and returns the number of evictions.

    ``offsets``/``ids`` are a checked ``BlockedTrace``'s CSR arrays (the kernels do not check
    bounds).
    """
    # A tier larger than the id space never evicts, so the clamp changes no result.
    cap = min(int(capacity), int(n_blocks))
    if code == FIFO:
        resident = np.zeros(n_blocks, dtype=np.uint8)
        ring = np.zeros(max(cap, 1), dtype=np.int32)
        return int(fifo_flat_nb(cap, offsets, ids, resident, ring, hits_out))
    if code == LRU:
        slot = np.zeros(n_blocks, dtype=np.int32)
        ring = np.zeros(min(LRU_RING_PER_BLOCK * cap + 1, _MAX_RING), dtype=np.int32)
        return int(lru_flat_nb(cap, offsets, ids, slot, ring, hits_out))
    raise ValueError(f"no ring kernel for policy code {code}")
