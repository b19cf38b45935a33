"""Every count the numba engine derives is checked before its kernel runs.

The kernel does no bounds checks: a negative or overflowed block count would make it write
outside its arrays, a huge one allocate more than the machine has. The engine refuses those
with one-line errors, and a request too large to ever fit costs no memory (it is rejected on
arrival in both engines alike).
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config, engine, simulate_raw
from kvtier.trace.blocked import BlockedTrace


@pytest.fixture(scope="module")
def cfg():
    return build_config(load_hardware("h100-node"), load_model("Llama-3.1-8B"), Policy())


def lengths_only(inputs: list[int], outputs: list[int], block_tokens: int = 16) -> BlockedTrace:
    n = len(inputs)
    return BlockedTrace.from_lists(
        [float(i) for i in range(n)], inputs, outputs, [[] for _ in range(n)], block_tokens
    )


def assert_same(a, b) -> None:  # noqa: ANN001
    for name in ("first_token_s", "finish_s", "hit_blocks", "instance"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_an_overflowed_token_sum_is_refused(cfg) -> None:
    big = 1 << 62
    trace = lengths_only([big, 64], [big + 2, 8])  # input + output - 1 overflows int64
    with pytest.raises(InputError, match="request 0 has"):
        simulate_raw(trace, cfg)


def test_requests_that_can_never_fit_cost_no_memory_and_agree(cfg, monkeypatch) -> None:
    """Three requests of 2^30 + 2^30 tokens at B = 1 hold 6.4e9 blocks: as the kernel takes
    them (each cut to capacity + 1) the slot array is small, and both engines reject the
    same requests and serve the rest identically."""
    trace = lengths_only([1 << 30, 64, 1 << 30], [1 << 30, 8, 1 << 30], block_tokens=1)
    one = replace(cfg, block_tokens=1, capacity_blocks=4096)
    refs: list[int] = []
    original = engine._check_counts

    def spy(*args):  # noqa: ANN002, ANN202
        refs.append(original(*args))
        return refs[-1]

    monkeypatch.setattr(engine, "_check_counts", spy)
    fast = simulate_raw(trace, one)
    slow = simulate_raw(trace, one, engine="reference")
    assert_same(fast, slow)
    assert np.isnan(fast.finish_s[[0, 2]]).all() and np.isfinite(fast.finish_s[1])
    assert refs == [4097 + 71 + 4097]


def test_a_replay_larger_than_memory_is_refused(cfg, monkeypatch) -> None:
    monkeypatch.setattr(engine, "physical_memory", lambda: 1 << 20)
    trace = lengths_only([64, 64], [8, 8])
    with pytest.raises(InputError, match="needs about .* GB of memory"):
        simulate_raw(trace, cfg)


def test_too_many_block_references_are_refused(cfg, monkeypatch) -> None:
    monkeypatch.setattr(engine, "MAX_REFS", 100)
    trace = lengths_only([64 * 16] * 3, [1] * 3)  # 3 x 64 blocks
    with pytest.raises(InputError, match="192 blocks of 16 tokens in all"):
        simulate_raw(trace, cfg)
    monkeypatch.setattr(engine, "MAX_REFS", 193)
    simulate_raw(trace, cfg)
