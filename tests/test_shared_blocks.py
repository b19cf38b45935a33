"""The shared-block index that the serving kernel's prefix-cache map is keyed by."""

from __future__ import annotations

from collections import Counter

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.shared import shared_block_index


@settings(deadline=None)  # the first example compiles the kernel
@given(st.lists(st.integers(0, 30), max_size=200))
def test_shared_index_numbers_exactly_the_blocks_read_twice(ids: list[int]) -> None:
    shared, n_shared = shared_block_index(np.array(ids, dtype=np.int32), 31)
    counts = Counter(ids)
    assert shared.dtype == np.int32 and len(shared) == len(ids)
    assert n_shared == sum(1 for c in counts.values() if c > 1)
    number: dict[int, int] = {}
    for b, m in zip(ids, shared.tolist(), strict=True):
        if counts[b] == 1:
            assert m == -1
        else:  # one number per block, dense, in order of first reference
            assert number.setdefault(b, len(number)) == m
    assert sorted(number.values()) == list(range(n_shared))


def test_shared_index_rejects_ids_out_of_range() -> None:
    with pytest.raises(ValueError, match="block ids"):
        shared_block_index(np.array([0, 5], dtype=np.int32), 5)
    with pytest.raises(ValueError, match="block ids"):
        shared_block_index(np.array([-1], dtype=np.int32), 5)


def test_trace_computes_the_index_once_and_head_recomputes_it() -> None:
    trace = BlockedTrace.from_lists(
        arrival_s=[0.0, 1.0, 2.0],
        input_tokens=[64, 64, 64],
        output_tokens=[1, 1, 1],
        blocks=[[0, 1, 2], [0, 1, 3], [4, 5]],
        block_tokens=16,
    )
    shared, n_shared = trace.shared_blocks
    assert trace.shared_blocks[0] is shared  # kept
    assert shared.tolist() == [0, 1, -1, 0, 1, -1, -1, -1] and n_shared == 2
    first = trace.head(1)  # in the first request alone no block is read twice
    assert first.shared_blocks[0].tolist() == [-1, -1, -1] and first.shared_blocks[1] == 0
    assert first.n_blocks == 3 and trace.head(2).n_blocks == 4  # the sample's id space
    assert trace.head(0).n_blocks == 0


def test_a_rescaled_trace_keeps_the_computed_index() -> None:
    trace = BlockedTrace.from_lists(
        arrival_s=[0.0, 1.0], input_tokens=[32, 32], output_tokens=[1, 1],
        blocks=[[0, 1], [0, 2]], block_tokens=16,
    )  # fmt: skip
    fresh = trace.with_arrivals(trace.arrival_s / 2)  # nothing computed yet: computed anew
    assert fresh.shared_blocks[0].tolist() == [0, -1, 0, -1]
    shared = trace.shared_blocks[0]
    faster = trace.with_arrivals(trace.arrival_s / 2)
    assert faster.shared_blocks[0] is shared  # carried over, not computed again
    assert faster.arrival_s.tolist() == [0.0, 0.5] and trace.arrival_s.tolist() == [0.0, 1.0]
