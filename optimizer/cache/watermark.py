"""Batch eviction at a high watermark: how many blocks a pool sheds after an insertion.

Mooncake Store's master does not evict one object per put once its pool is full. Its eviction
thread (``MasterService::EvictionThreadFunc``, every ``kEvictionThreadSleepMs`` = 10 ms) checks
the pool's used share and, above ``eviction_high_watermark_ratio`` ``h``, evicts
``max(r, used - h + r)`` of its objects (``eviction_ratio`` ``r``) in one ``BatchEvict``,
oldest lease first (``mooncake-store/src/master_service.cpp`` at v0.3.12.post1 and at
``738b375``; defaults in ``include/types.h``: ``h`` 0.95 until PR #2871, 2026-07-14, then
0.90; ``r`` 0.05). So its pool runs between about ``h (1 - r)`` and ``h`` full, not at its
capacity, and the blocks of one batch leave together (docs/model.md, "Batch eviction at a
high watermark"; docs/sources.md [Mooncake-eviction]).

The rule is written once, as plain Python: the reference simulator calls it, the numba engine
compiles this very function (as :mod:`kvtier.sim.transfer`'s formulas), so both shed the
same count. The pool's own eviction policy chooses the victims (:meth:`kvtier.cache.reference.
RefTier.evict_one`, :func:`kvtier.cache.nb.evict_one_nb`).
"""

from __future__ import annotations

import math


def shed_count(size: int, capacity: int, high: float, ratio: float) -> int:
    """Blocks a pool holding ``size`` of ``capacity`` blocks evicts at once: 0 while it holds
    no more than ``high`` of its capacity; else one batch of ``ceil(size * max(ratio, used -
    high + ratio))`` (Mooncake's ``evict_ratio_target`` of its object count; at least one),
    and more batches while the pool is still past its watermark (the eviction thread's next
    rounds, 10 ms apart, taken at once here). ``high`` 1 (or more) never sheds: the pool then
    evicts one block per insertion once full, the cache engine's own rule."""
    total = 0
    while capacity >= 1 and size > high * capacity:
        used = size / capacity
        share = used - high + ratio
        if ratio > share:
            share = ratio
        n = math.ceil(size * share)
        if n < 1:
            n = 1
        if n > size:
            n = size
        size -= n
        total += n
    return total
