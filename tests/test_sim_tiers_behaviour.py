"""Behaviour the tier model must show (issue 5 acceptance), on the built-in profiles.

These follow from docs/design.md 4.4's transfer formula and the sourced Beluga figures, not from
calibrated values: per-operation overhead dominates small per-layer fragments over RDMA and
not over CXL; write-back copies fewer blocks than write-through; a shared pool serves other
hosts while a per-host tier does not.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware, Topology
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace

PROMPT = 16 * 1024  # a Beluga-like long prompt (LV-Eval inputs exceed 15K tokens)


def two_hosts(hw: Hardware, gpus_per_host: int = 1) -> Hardware:
    """The profile cut to two instances, on two hosts (or one host of two GPUs)."""
    hosts = 2 // gpus_per_host
    return replace(hw, topology=Topology(hosts=hosts, gpus_per_host=gpus_per_host, tp=1))


def same_prompt_twice(B: int, gap_s: float = 1000.0) -> BlockedTrace:
    """One long prompt, then the same prompt again once the first has long finished."""
    ids = list(range(PROMPT // B))
    return BlockedTrace.from_lists(
        [0.0, gap_s], [PROMPT + 1, PROMPT + 1], [1, 1], [ids, ids], B, n_blocks=len(ids)
    )


def replay(hw: Hardware, policy: Policy, trace: BlockedTrace):
    cfg = build_config(hw, load_model("Qwen3-32B"), policy)
    ref = simulate_raw(trace, cfg, engine="reference", check_invariants=True)
    fast = simulate_raw(trace, cfg, engine="numba")
    np.testing.assert_array_equal(ref.first_token_s, fast.first_token_s)
    np.testing.assert_array_equal(ref.tier_hit_blocks, fast.tier_hit_blocks)
    return fast, cfg


def tiered(tier: str, B: int, **kw) -> Policy:
    return Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=2, routing="round_robin"),
        tiers=(TierPolicy(), TierPolicy(name=tier, capacity_gb=100.0)),
        **kw,
    )


def load_time(tier: str, B: int) -> float:
    hw = two_hosts(load_hardware("beluga-testbed"))
    raw, _ = replay(hw, tiered(tier, B), same_prompt_twice(B))
    assert raw.instance.tolist() == [0, 1]
    assert raw.tier_hit_blocks.sum() == PROMPT // B  # every block comes from below
    return float(raw.load_s[1])


def test_small_blocks_are_ruinous_over_rdma_and_harmless_over_cxl() -> None:
    rdma16, rdma256 = load_time("rdma", 16), load_time("rdma", 256)
    cxl16, cxl256 = load_time("cxl", 16), load_time("cxl", 256)
    assert rdma16 > 3 * rdma256  # 64 x more per-layer RDMA operations
    assert cxl16 < 1.5 * cxl256  # bandwidth-bound either way
    assert cxl16 < rdma16


def test_coalescing_recovers_superblock_speed_over_rdma() -> None:
    hw = two_hosts(load_hardware("beluga-testbed"))
    raw, _ = replay(hw, tiered("rdma", 16, coalesce=16), same_prompt_twice(16))
    assert raw.load_s[1] < 1.5 * load_time("rdma", 256)


@pytest.mark.parametrize("tier", ["cxl", "rdma"])
def test_shared_pool_serves_a_prefix_computed_on_another_host(tier: str) -> None:
    hw = two_hosts(load_hardware("beluga-testbed"))
    raw, cfg = replay(hw, tiered(tier, 256), same_prompt_twice(256))
    assert cfg.tiers is not None and cfg.tiers.n_hosts == 2
    assert raw.tier_hit_blocks[0] == PROMPT // 256
    assert raw.load_s[1] > 0 and raw.first_token_s[1] - 1000.0 < raw.first_token_s[0]


def test_per_host_dram_serves_its_own_host_only() -> None:
    other_host = two_hosts(load_hardware("beluga-testbed"), gpus_per_host=1)
    raw, _ = replay(other_host, tiered("dram", 256), same_prompt_twice(256))
    assert raw.tier_hit_blocks.sum() == 0 and raw.hit_blocks.sum() == 0
    # a host pool its engines share (per_engine = false): the other engine of the host hits
    same_host = two_hosts(load_hardware("beluga-testbed"), gpus_per_host=2)
    shared = tiered("dram", 256)
    shared = replace(shared, tiers=(shared.tiers[0], replace(shared.tiers[1], per_engine=False)))
    raw, _ = replay(same_host, shared, same_prompt_twice(256))
    assert raw.tier_hit_blocks[0] == PROMPT // 256


def test_dram_is_each_engines_own_by_default() -> None:
    """vLLM's OffloadingConnector, LMCache's local CPU back end, SGLang HiCache's host pool and
    Dynamo KVBM's host tier each keep their host cache to their own engine: the second engine
    of a host recomputes a prompt the first stored in DRAM, and each engine's pool is half of
    the host's 100 GB."""
    same_host = two_hosts(load_hardware("beluga-testbed"), gpus_per_host=2)
    raw, cfg = replay(same_host, tiered("dram", 256), same_prompt_twice(256))
    assert raw.instance.tolist() == [0, 1]
    assert raw.tier_hit_blocks.sum() == 0 and raw.hit_blocks.sum() == 0
    tiers = cfg.tiers
    assert tiers.pool_count.tolist() == [2] and tiers.pool_local.tolist() == [[0, 1]]
    block_bytes = tiers.block_bytes
    assert tiers.capacity_blocks[0] == int(50e9 // block_bytes)
    assert tiers.tier_gb["dram"] == 100.0  # the host's memory is bought whole


def churn_trace(B: int, n: int = 120, seed: int = 7) -> BlockedTrace:
    """Requests over a few hot documents and many cold ones: HBM must evict."""
    rng = np.random.default_rng(seed)
    blocks, inputs = [], []
    for _ in range(n):
        doc = int(rng.integers(0, 4)) if rng.random() < 0.5 else int(rng.integers(4, 400))
        length = int(rng.integers(8, 40))
        blocks.append([doc * 64 + j for j in range(length)])
        inputs.append(length * B + 3)
    uniq = sorted({b for ids in blocks for b in ids})
    dense = {b: i for i, b in enumerate(uniq)}
    arrival = np.arange(n, dtype=np.float64) * 0.5
    return BlockedTrace.from_lists(
        arrival.tolist(),
        inputs,
        [4] * n,
        [[dense[b] for b in ids] for ids in blocks],
        B,
        n_blocks=len(uniq),
    )


def test_write_back_writes_fewer_bytes_than_write_through() -> None:
    hw = two_hosts(load_hardware("beluga-testbed"), gpus_per_host=2)
    trace = churn_trace(256)
    written = {}
    for wp in ("write_through", "write_back", "write_through_selective"):
        policy = Policy(
            block_tokens=256,
            write_policy=wp,
            serving=ServingPolicy(instances=2),
            tiers=(TierPolicy(capacity_gb=1.0), TierPolicy(name="dram", capacity_gb=4.0)),
        )
        raw, _ = replay(hw, policy, trace)
        written[wp] = float(raw.tier_bytes_written.sum())
    assert 0 < written["write_back"] < written["write_through"]
    assert written["write_through_selective"] < written["write_through"]


def test_exclusive_moves_blocks_up_and_inclusive_keeps_them() -> None:
    """Three instances on three hosts take the same prompt in turn: the second loads it from
    the pool; under ``exclusive`` that load removed it there, so the third recomputes."""
    hw = replace(load_hardware("beluga-testbed"), topology=Topology(hosts=3, gpus_per_host=1, tp=1))
    ids = list(range(64))
    trace = BlockedTrace.from_lists(
        [0.0, 1000.0, 2000.0], [PROMPT + 1] * 3, [1] * 3, [ids] * 3, 256, n_blocks=64
    )
    loaded = {}
    for hierarchy in ("inclusive", "exclusive"):
        policy = replace(
            tiered("cxl", 256, hierarchy=hierarchy), serving=ServingPolicy(instances=3)
        )
        raw, _ = replay(hw, policy, trace)
        assert raw.instance.tolist() == [0, 1, 2]
        loaded[hierarchy] = raw.load_s > 0
    assert loaded["inclusive"].tolist() == [False, True, True]
    assert loaded["exclusive"].tolist() == [False, True, False]


def test_fp8_halves_the_bytes_moved() -> None:
    hw = two_hosts(load_hardware("beluga-testbed"))
    a, _ = replay(hw, tiered("cxl", 256), same_prompt_twice(256))
    b, _ = replay(hw, tiered("cxl", 256, kv_dtype="fp8"), same_prompt_twice(256))
    assert b.tier_bytes_read[0] * 2 == a.tier_bytes_read[0]


def test_cost_aware_recomputes_when_loading_is_slower() -> None:
    hw = two_hosts(load_hardware("beluga-testbed"))
    slow = replace(
        hw, tiers={**hw.tiers, "rdma": replace(hw.tiers["rdma"], port_read_bw=1e6)}
    )  # 1 MB/s: loading 4 GB would take an hour
    raw, _ = replay(slow, tiered("rdma", 256, load_rule="cost_aware"), same_prompt_twice(256))
    assert raw.tier_hit_blocks.sum() == 0 and raw.load_s[1] == 0
    raw, _ = replay(hw, tiered("rdma", 256, load_rule="cost_aware"), same_prompt_twice(256))
    assert raw.tier_hit_blocks.sum() == PROMPT // 256


def test_gdsf_cost_is_the_recompute_time_saved() -> None:
    from kvtier.sim.tiers import recompute_costs

    trace = same_prompt_twice(256)
    costs = recompute_costs(
        trace.block_offsets, trace.block_ids, trace.n_blocks, 256, 2.0, 1.0, 10.0
    )
    assert costs[0] == (2.0 * 256 + 256 * 256) / 10.0
    assert np.all(np.diff(costs) > 0)  # later blocks attend to more context


@pytest.mark.parametrize("tier", ["cxl", "rdma"])
def test_a_batch_that_waits_for_loads_stalls_the_decodes_beside_them(tier: str) -> None:
    """load_wait = "batch" (LMCache's synchronous retrieve before the forward pass): a request
    decoding on the instance makes no progress while another request's prefix loads, so it
    finishes later by exactly the load time; with "request" it decodes through the load.

    Round robin over two instances: the long prompt is computed on instance 0 and written to
    the pool; a long decode starts on instance 1, and the same prompt, sent to instance 1 a
    moment later, loads from the pool beside it.
    """
    B = 16
    prompt = list(range(PROMPT // B))
    other = lambda j: [PROMPT // B + j]  # noqa: E731 - a one-block prompt of its own
    arrivals = [0.0, 0.0, 500.0, 1000.0, 1000.5, 1001.0]
    inputs = [PROMPT + 1, B, B, B, B, PROMPT + 1]
    outputs = [1, 1, 1, 400, 1, 1]
    blocks = [prompt, other(0), other(1), other(2), other(3), prompt]
    trace = BlockedTrace.from_lists(arrivals, inputs, outputs, blocks, B)
    hw = two_hosts(load_hardware("beluga-testbed"), gpus_per_host=2)
    asynchronous, _ = replay(hw, tiered(tier, B), trace)
    waiting, _ = replay(hw, tiered(tier, B, load_wait="batch"), trace)
    for raw in (asynchronous, waiting):
        assert raw.instance.tolist() == [0, 1, 0, 1, 0, 1]
        assert raw.tier_hit_blocks.sum() == PROMPT // B  # the second prompt loads from below
    load = float(waiting.load_s[5])
    assert load > 0.05
    assert waiting.finish_s[3] - asynchronous.finish_s[3] == pytest.approx(load, rel=1e-6)
    # the decode started before the load: it had produced tokens, then stalled
    assert waiting.first_token_s[3] < arrivals[5]
