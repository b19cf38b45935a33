"""The ring kernels (flat LRU / FIFO from an empty tier) against the linked-list kernels."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cache import TierState, replay
from kvtier.cache import ring as ring_mod
from kvtier.cache.policies import parse_policy
from kvtier.errors import InputError
from kvtier.trace.blocked import BlockedTrace
from tests.cache_helpers import blocked_traces, random_ids


def linked_list_replay(trace: BlockedTrace, policy: str, capacity: int) -> tuple[list[int], int]:
    """Per-request hits and evictions of the linked-list kernel (a given tier skips the ring)."""
    tier = TierState.create(policy, capacity, trace.n_blocks)
    hits = replay(trace, policy, capacity, flat=True, tier=tier).hit_blocks.tolist()
    return hits, tier.n_evictions


def ring_replay(trace: BlockedTrace, policy: str, capacity: int) -> tuple[list[int], int]:
    hits = np.zeros(trace.n_requests, dtype=np.int64)
    evictions = ring_mod.replay_flat(
        parse_policy(policy).code,
        capacity,
        trace.n_blocks,
        trace.block_offsets,
        trace.block_ids,
        hits,
    )
    return hits.tolist(), evictions


def chunked(ids: np.ndarray, n_blocks: int, per: int) -> BlockedTrace:
    """``ids`` as requests of ``per`` blocks each."""
    n = len(ids)
    n_req = max(1, -(-n // per))
    offsets = np.minimum(np.arange(n_req + 1, dtype=np.int64) * per, n)
    return BlockedTrace(
        arrival_s=np.zeros(n_req),
        input_tokens=np.full(n_req, per * 16 + 1, dtype=np.int64),
        output_tokens=np.ones(n_req, dtype=np.int64),
        block_offsets=offsets,
        block_ids=np.ascontiguousarray(ids, dtype=np.int32),
        n_blocks=n_blocks,
        block_tokens=16,
    )


@pytest.mark.parametrize("policy", ["lru", "fifo"])
@settings(max_examples=150, deadline=None)
@given(trace=blocked_traces(), capacity=st.integers(0, 40))
def test_ring_matches_linked_lists(policy: str, trace: BlockedTrace, capacity: int) -> None:
    want_hits, want_evictions = linked_list_replay(trace, policy, capacity)
    assert ring_replay(trace, policy, capacity) == (want_hits, want_evictions)
    # replay() without a tier takes the ring path
    assert replay(trace, policy, capacity, flat=True).hit_blocks.tolist() == want_hits


@pytest.mark.parametrize("policy", ["lru", "fifo"])
@pytest.mark.parametrize("zipf", [False, True])
@pytest.mark.parametrize("capacity", [1, 2, 3, 17, 300, 1999, 2000, 10**12])
def test_ring_matches_linked_lists_long(policy: str, zipf: bool, capacity: int) -> None:
    """Long sequences: the ring wraps and LRU's ring is compacted many times."""
    trace = chunked(random_ids(capacity, 30_000, 2000, zipf), 2000, 7)
    assert ring_replay(trace, policy, capacity) == linked_list_replay(trace, policy, capacity)


@pytest.mark.parametrize("policy", ["lru", "fifo"])
def test_ring_checks_capacity(policy: str) -> None:
    trace = chunked(np.arange(5), 5, 2)
    for bad in (-1, 1.5, True):
        with pytest.raises(InputError):
            replay(trace, policy, bad, flat=True)  # type: ignore[arg-type]


def test_ring_result_fields() -> None:
    trace = chunked(np.array([0, 1, 0, 2, 1, 0]), 3, 2)
    res = replay(trace, "lru", 2, flat=True, warmup=0.5)
    assert (res.policy, res.capacity_blocks, res.flat, res.first_measured) == ("lru", 2, True, 1)
    # LRU of 2: 0 1 | 0(hit) 2 (evicts 1) | 1 (evicts 0) 0 (evicts 2)
    assert res.hit_blocks.tolist() == [0, 1, 0]
