"""The one-pass LRU curve equals LRU replays at every capacity, exactly."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.cache import default_capacities, miss_ratio_curve, replay
from kvtier.cache.mrc import lru_stack_hits
from kvtier.cache.reference import lru_hits_by_capacity
from kvtier.cache.trace_replay import warmup_start
from kvtier.errors import InputError
from kvtier.trace.blocked import BlockedTrace
from tests.cache_helpers import blocked_traces


@pytest.mark.parametrize("flat", [False, True])
@settings(max_examples=80, deadline=None)
@given(trace=blocked_traces(), warmup=st.sampled_from([0.0, 0.3, 0.5]))
def test_stack_curve_equals_replays(trace: BlockedTrace, flat: bool, warmup: float) -> None:
    caps = list(range(0, trace.n_blocks + 3))
    stack = lru_stack_hits(trace, caps, flat=flat, warmup=warmup)
    replays = [replay(trace, "lru", c, flat=flat, warmup=warmup).hits for c in caps]
    assert stack.tolist() == replays
    first = warmup_start(trace.n_requests, warmup)
    assert replays == lru_hits_by_capacity(trace, caps, flat=flat, first_measured=first)


def test_stack_curve_on_a_larger_random_trace() -> None:
    rng = np.random.default_rng(7)
    n, nb = 400, 900
    blocks = []
    for _ in range(n):
        root = int(rng.integers(0, 30)) * 30
        blocks.append([root + k for k in range(int(rng.integers(0, 30)))])
    trace = BlockedTrace.from_lists([0.0] * n, [512] * n, [1] * n, blocks, 16, n_blocks=nb)
    caps = default_capacities(nb)
    for flat in (False, True):
        curve = miss_ratio_curve(trace, "lru", caps, flat=flat, warmup=0.25)
        replays = miss_ratio_curve(trace, "lru", caps, flat=flat, warmup=0.25, method="replay")
        assert [p.hits for p in curve.points] == [p.hits for p in replays.points]
        ratios = [p.hit_ratio_blocks for p in curve.points]
        assert ratios == sorted(ratios)  # LRU is a stack algorithm: hits never fall with C


def test_curve_json_and_defaults() -> None:
    trace = BlockedTrace.from_lists(
        [0.0, 1.0, 2.0], [40, 40, 40], [1, 1, 1], [[0, 1], [0, 1], [2, 0]], 16
    )
    result = miss_ratio_curve(trace)
    assert result.method == "stack" and result.policy == "lru"
    assert [p.capacity_blocks for p in result.points] == default_capacities(3)
    doc = result.to_json()
    assert doc["policy"] == "lru"
    point = doc["points"][-1]  # type: ignore[index]
    assert point == {"capacity_blocks": 3, "hit_ratio_blocks": 2 / 6, "hit_ratio_tokens": 32 / 120}
    assert miss_ratio_curve(trace, "fifo").method == "replay"


def test_default_capacities() -> None:
    assert default_capacities(0) == [1]
    assert default_capacities(1) == [1]
    caps = default_capacities(5_000_000)
    assert caps[0] == 1 and caps[-1] == 5_000_000 and len(caps) == 20
    assert caps == sorted(set(caps))
    assert default_capacities(5) == [1, 2, 3, 4, 5]


def test_bad_curve_arguments() -> None:
    trace = BlockedTrace.from_lists([0.0], [32], [1], [[0, 1]], 16)
    with pytest.raises(InputError, match="lru only"):
        miss_ratio_curve(trace, "sieve", [1], method="stack")
    with pytest.raises(InputError, match="method"):
        miss_ratio_curve(trace, "lru", [1], method="exact")
    with pytest.raises(InputError, match="capacities"):
        miss_ratio_curve(trace, "lru", [-2])
    with pytest.raises(InputError, match="at least one"):
        miss_ratio_curve(trace, "lru", [])
