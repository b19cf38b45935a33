"""Differential tests: the numba engine gives exactly the reference's results."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cache import TierState, replay
from kvtier.cache.reference import RefTier, replay_reference
from kvtier.trace.blocked import BlockedTrace
from tests.cache_helpers import POLICIES, blocked_traces


@pytest.mark.parametrize("policy", POLICIES)
@pytest.mark.parametrize("flat", [False, True])
@settings(max_examples=60, deadline=None)
@given(trace=blocked_traces(), capacity=st.integers(0, 30), seed=st.integers(0, 2**16))
def test_replay_matches_reference(
    policy: str, flat: bool, trace: BlockedTrace, capacity: int, seed: int
) -> None:
    cost = np.random.default_rng(seed).choice([0.5, 1.0, 2.0, 3.25], trace.n_blocks)
    got = replay(trace, policy, capacity, flat=flat, cost=cost).hit_blocks
    want = replay_reference(trace, policy, capacity, flat=flat, cost=cost)
    assert got.tolist() == want


@pytest.mark.parametrize("policy", POLICIES)
@settings(max_examples=50, deadline=None)
@given(
    capacity=st.integers(1, 12),
    ops=st.lists(st.tuples(st.sampled_from("aaaarc"), st.integers(0, 19)), max_size=120),
)
def test_primitives_match_reference(policy: str, capacity: int, ops: list[tuple[str, int]]) -> None:
    """access / remove / contains in any order: same hits, same victims, same residency."""
    tier = TierState.create(policy, capacity, 20)
    ref = RefTier(policy, capacity)
    for op, b in ops:
        if op == "a":
            assert tier.access(b) == ref.access(b)
        elif op == "r":
            assert tier.remove(b) == ref.remove(b)
        else:
            assert tier.contains(b) == ref.contains(b)
        assert tier.size == ref.size
    assert sorted(tier.resident().tolist()) == sorted(b for b in range(20) if ref.contains(b))


def test_prefix_semantics_by_hand() -> None:
    """Prefix hits stop at the first gap; tail-first touching keeps the prefix longest."""
    trace = BlockedTrace.from_lists(
        [0.0, 1.0, 2.0, 3.0],
        [64, 64, 64, 64],
        [1, 1, 1, 1],
        [[0, 1, 2, 3], [0, 1, 2, 3], [4, 5], [0, 9, 2, 3]],
        16,
        n_blocks=10,
    )
    # LRU of 4: request 1 hits all 4 and touches 3, 2, 1, 0, so 0 is the most recent. Request
    # 2 touches 5 then 4 and evicts the two least recent, 3 and 2 (the tail). Request 3 finds 0
    # (hit) and then 9 (miss), so its prefix is 1 block.
    assert replay(trace, "lru", 4).hit_blocks.tolist() == [0, 4, 0, 1]
    assert replay_reference(trace, "lru", 4) == [0, 4, 0, 1]
    # a resident block after a gap does not count in prefix mode, but does in flat mode
    gap = BlockedTrace.from_lists([0.0, 1.0], [48, 48], [1, 1], [[0, 1, 2], [0, 7, 2]], 16, 8)
    assert replay(gap, "lru", 8).hit_blocks.tolist() == [0, 1]
    assert replay(gap, "lru", 8, flat=True).hit_blocks.tolist() == [0, 2]
