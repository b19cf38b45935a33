"""Shared generators for the cache-engine tests."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from kvtier.cache.registry import EVICTIONS
from kvtier.trace.blocked import BlockedTrace

# Every registered policy (a new one is differential-tested with no edit here), plus parameters.
POLICIES = [*EVICTIONS.names, "s3fifo(small=0.3,ghost=0.5,threshold=1)"]


@st.composite
def blocked_traces(draw: st.DrawFn, max_requests: int = 25, max_blocks: int = 30) -> BlockedTrace:
    """Small traces with heavy reuse: prefixes shared, tails varied, ids sometimes repeated."""
    n_blocks = draw(st.integers(1, max_blocks))
    n = draw(st.integers(1, max_requests))
    blocks = [
        draw(st.lists(st.integers(0, n_blocks - 1), min_size=0, max_size=8)) for _ in range(n)
    ]
    B = 16
    inputs = [len(b) * B + draw(st.integers(1, B)) for b in blocks]
    return BlockedTrace.from_lists(
        [float(i) for i in range(n)], inputs, [1] * n, blocks, B, n_blocks=n_blocks
    )


def random_ids(seed: int, n: int, n_blocks: int, zipf: bool) -> np.ndarray:
    rng = np.random.default_rng(seed)
    if zipf:
        return ((rng.zipf(1.3, n) - 1) % n_blocks).astype(np.int32)
    return rng.integers(0, n_blocks, n).astype(np.int32)
