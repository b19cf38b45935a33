"""Batch eviction at a high watermark (Mooncake Store's master; kvtier.cache.watermark,
docs/model.md "Batch eviction at a high watermark").

A pool past ``eviction_high_watermark`` of its capacity evicts ``max(r, used - h + r)`` of
its blocks at once, so it runs below its capacity, and a loop over more prompts than it then
holds loses every prompt before its turn comes round (least recently used first), where a pool
evicting one block per insertion keeps them all. Victims of a batch cascade under write-back
and are found in the tier below. Both engines agree.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from kvtier.cache.watermark import shed_count
from kvtier.errors import InputError
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy, policy_from_dict
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import REQUEST_FIELDS, assert_fields_equal, replay_both

B = 16
P = 10  # full blocks a prompt
N = 10  # prompts a round
GAP_S = 1.0e4  # each request starts long after the last has finished
DRAM, SSD = 0, 1  # lower-tier columns of RawResult.loaded_blocks


@given(
    st.integers(1, 10_000),
    st.floats(0.01, 1.0),
    st.floats(0.0, 1.0),
    st.data(),
)
def test_a_batch_brings_the_pool_back_to_its_watermark(
    capacity: int, high: float, ratio: float, data: st.DataObject
) -> None:
    size = data.draw(st.integers(0, capacity))
    n = shed_count(size, capacity, high, ratio)
    if size <= high * capacity:
        assert n == 0
        return
    assert 1 <= n <= size
    assert size - n <= high * capacity  # back at or below the watermark
    first = min(size, max(1, math.ceil(size * max(ratio, size / capacity - high + ratio))))
    assert n >= first  # at least Mooncake's first batch
    if size - first <= high * capacity:
        assert n == first  # and one batch when it is enough


def test_mooncakes_batch_of_a_pool_just_past_its_watermark() -> None:
    # 951 of 1,000 objects at h 0.95, r 0.05: ceil(951 x max(0.05, 0.951 - 0.95 + 0.05))
    assert shed_count(951, 1000, 0.95, 0.05) == math.ceil(951 * (0.951 - 0.95 + 0.05))
    assert shed_count(951, 1000, 0.95, 0.05) == 49
    assert shed_count(950, 1000, 0.95, 0.05) == 0
    assert shed_count(1000, 1000, 1.0, 0.05) == 0  # watermark 1: never a batch
    assert shed_count(91, 100, 0.9, 0.0) == 1  # ratio 0: back to the watermark


def trace(rounds: int = 2) -> BlockedTrace:
    """``N`` prompts of ``P`` full blocks each (and one token more), sent one after another,
    then the same ``N`` again in the same order."""
    prompts = [list(range(i * P, (i + 1) * P)) for i in range(N)]
    order = prompts * rounds
    n = len(order)
    times = [i * GAP_S for i in range(n)]
    return BlockedTrace.from_lists(times, [P * B + 1] * n, [4] * n, order, B, n_blocks=N * P)


def config(
    high: float | None,
    ratio: float | None,
    *,
    write_policy: str = "write_through",
    file_tier: bool = False,
):
    """One H100 engine whose HBM holds about two prompts and a host pool of exactly the ``N``
    prompts' blocks with the given watermark; with ``file_tier``, a large file tier below
    it."""
    model = load_model("Qwen3-8B")
    block_gb = B * model.kv_bytes_per_token("bf16") / 1e9
    policy = Policy(
        block_tokens=B,
        write_policy=write_policy,
        serving=ServingPolicy(instances=1, tp=1, routing="round_robin"),
        tiers=(
            TierPolicy(capacity_gb=2.5 * (P + 1) * block_gb),
            TierPolicy(
                name="dram",
                capacity_gb=(N * P + 0.5) * block_gb,
                eviction_high_watermark=high,
                eviction_ratio=ratio,
            ),
            *([TierPolicy(name="ssd", capacity_gb=10 * N * P * block_gb)] if file_tier else []),
        ),
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=1))
    cfg = build_config(hw, model, policy)
    assert int(cfg.tiers.capacity_blocks[DRAM]) == N * P
    off = np.zeros(cfg.tiers.n_tiers, dtype=np.bool_)
    return replace(cfg, tiers=replace(cfg.tiers, prefetch_at_arrival=off))


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_pool_at_capacity_keeps_the_whole_loop(engine: str) -> None:
    raw = simulate_raw(trace(), config(None, None), engine=engine, check_invariants=True)
    second = slice(N, 2 * N)
    assert raw.loaded_blocks[second, DRAM].sum() == N * P


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_pool_past_its_watermark_loses_the_loop_to_lru(engine: str) -> None:
    """At 0.9 and 0.05 the pool sheds 6 blocks whenever it reaches 91 of 100: the first round
    leaves 88, the oldest prompt's blocks and the next one's first two gone, and each prompt
    of the second round, recomputed and written again, pushes out the next prompt's first
    blocks before its turn: the host pool serves none of the second round."""
    raw = simulate_raw(trace(), config(0.9, 0.05), engine=engine, check_invariants=True)
    second = slice(N, 2 * N)
    assert raw.loaded_blocks[second, DRAM].sum() == 0
    assert raw.hit_blocks[second].sum() == 0  # (nor HBM, which holds two prompts)


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_below_a_written_through_file_tier_only_the_lost_blocks_are_read_there(
    engine: str,
) -> None:
    """With a file tier written through below the host pool, each block is read from the
    first tier holding it: the second round's first prompt (all of it shed) and the next
    one's first two blocks come from the file tier, the rest from the host pool (a load
    does not write the host pool, so nothing more is shed)."""
    cfg = config(0.9, 0.05, file_tier=True)
    raw = simulate_raw(trace(), cfg, engine=engine, check_invariants=True)
    second = slice(N, 2 * N)
    assert raw.loaded_blocks[second, DRAM].tolist() == [0, P - 2] + [P] * (N - 2)
    assert raw.loaded_blocks[second, SSD].tolist() == [P, 2] + [0] * (N - 2)


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_batchs_victims_cascade_under_write_back(engine: str) -> None:
    """Under write-back nothing reaches the file tier but what the host pool evicts: the
    batches' victims are found there in the second round."""
    cfg = config(0.9, 0.05, write_policy="write_back", file_tier=True)
    raw = simulate_raw(trace(), cfg, engine=engine, check_invariants=True)
    second = slice(N, 2 * N)
    assert raw.loaded_blocks[second, SSD].sum() > 0
    assert raw.tier_bytes_written[SSD] > 0


@pytest.mark.parametrize("write_policy", ["write_through", "write_back"])
@pytest.mark.parametrize(("high", "ratio"), [(0.9, 0.05), (0.5, 0.3), (0.73, None)])
def test_engines_agree(write_policy: str, high: float, ratio: float | None) -> None:
    cfg = config(high, ratio, write_policy=write_policy, file_tier=True)
    pair = replay_both(trace(3), cfg, check_invariants=True)
    assert pair is not None
    ref, fast = pair
    assert_fields_equal(ref, fast, REQUEST_FIELDS)
    np.testing.assert_array_equal(ref.loaded_blocks, fast.loaded_blocks)
    np.testing.assert_array_equal(ref.tier_bytes_written, fast.tier_bytes_written)
    np.testing.assert_array_equal(ref.tier_bytes_read, fast.tier_bytes_read)
    np.testing.assert_array_equal(ref.link_busy_s, fast.link_busy_s)


@pytest.mark.parametrize(
    ("tier", "key"),
    [
        ({"name": "hbm", "eviction_high_watermark": 0.9}, "below hbm"),
        ({"name": "dram", "eviction_ratio": 0.05}, "needs eviction_high_watermark"),
        ({"name": "dram", "eviction_high_watermark": 1.5}, "eviction_high_watermark"),
        ({"name": "dram", "eviction_high_watermark": 0.0}, "eviction_high_watermark"),
        ({"name": "dram", "eviction_high_watermark": 0.9, "eviction_ratio": 2}, "eviction_ratio"),
    ],
)
def test_bad_watermarks_name_the_key(tier: dict, key: str) -> None:
    tiers = [{"name": "hbm"}, tier] if tier["name"] != "hbm" else [tier]
    with pytest.raises(InputError) as err:
        policy_from_dict({"format": "kvtier-policy/1", "tiers": tiers}, "p.toml")
    assert key in str(err.value) and "p.toml" in str(err.value)
