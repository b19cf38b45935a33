"""SGLang HiCache's storage prefetch: a request's hits in the file tier are read into its
engine's host pool when it arrives, and it waits in its queue, holding no HBM and blocking no
one behind it, until they are there (``wait_complete``); a prefetch under 256 tokens is declined
(docs/model.md, "Storage prefetch at arrival").

Two engines on one host share a file tier and keep host pools of their own (round robin: even
requests on engine 0, odd on engine 1). Engine 0 computes a prefix, written through to the file
tier; engine 1 then extends it, and a short unrelated prompt reaches engine 1 just after.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import REQUEST_FIELDS, assert_fields_equal, replay_both

B = 16
GAP_S = 1.0e4
DRAM, SSD = 0, 1  # lower-tier columns of RawResult.loaded_blocks


def trace(prefix: int) -> BlockedTrace:
    """The prefix on engine 0; at GAP_S its extension on engine 1, then an unrelated prompt on
    engine 0 and a one-block prompt on engine 1, a millisecond apart."""
    base = list(range(prefix))
    nxt = prefix
    other = list(range(nxt + 2, nxt + 2 + prefix))
    prompts = [base + [nxt], base + [nxt + 1], other, [nxt + 2 + prefix]]
    n_blocks = nxt + 3 + prefix
    times = [0.0, GAP_S, GAP_S + 5e-4, GAP_S + 1e-3]
    inputs = [len(p) * B + 1 for p in prompts]
    return BlockedTrace.from_lists(times, inputs, [4] * 4, prompts, B, n_blocks=n_blocks)


def config(prefetch: bool):
    """Two H100 engines on one host, a host pool each and one shared file tier behind SGLang's
    file back end (``sglang-hicache-file``), written through; its prefetch on or off."""
    model = load_model("Qwen3-8B")
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(instances=2, tp=1, routing="round_robin"),
        tiers=(
            TierPolicy(capacity_gb=20.0),
            TierPolicy(name="dram", capacity_gb=100.0),
            TierPolicy(name="ssd", capacity_gb=200.0, connector="sglang-hicache-file"),
        ),
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=2))
    cfg = build_config(hw, model, policy)
    assert cfg.tiers.prefetch_at_arrival.tolist() == [False, True]
    if not prefetch:
        off = np.zeros(cfg.tiers.n_tiers, dtype=np.bool_)
        cfg = replace(cfg, tiers=replace(cfg.tiers, prefetch_at_arrival=off))
    assert cfg.prefetches_at_arrival == prefetch
    return cfg


def replay(prefix: int, prefetch: bool, engine: str):  # noqa: ANN201 - a RawResult
    return simulate_raw(
        trace(prefix), config(prefetch), engine=engine, check_invariants=engine == "reference"
    )


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_the_file_tier_is_read_at_arrival_into_the_host_pool(engine: str) -> None:
    raw = replay(64, True, engine)
    assert raw.tier_hit_blocks[SSD] == 64  # the prefetch read the prefix once
    assert raw.loaded_blocks[1, DRAM] == 64 and raw.loaded_blocks[1, SSD] == 0
    off = replay(64, False, engine)
    assert off.loaded_blocks[1, SSD] == 64 and off.loaded_blocks[1, DRAM] == 0
    # the one-block prompt behind it on engine 1 is not held up by the prefetch in flight
    assert raw.first_token_s[3] < raw.first_token_s[1]


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_prefetch_under_256_tokens_is_declined(engine: str) -> None:
    raw = replay(8, True, engine)  # 128 tokens
    assert raw.loaded_blocks[1, SSD] == 8 and raw.loaded_blocks[1, DRAM] == 0


@pytest.mark.parametrize(("prefix", "prefetch"), [(64, True), (64, False), (8, True)])
def test_engines_agree(prefix: int, prefetch: bool) -> None:
    ref = replay(prefix, prefetch, "reference")
    fast = replay(prefix, prefetch, "numba")
    assert_fields_equal(ref, fast, (*REQUEST_FIELDS, "tier_hit_blocks", "tier_bytes_read"))


def drawn_trace(groups: int, prefix: int, per_group: int, spread: float):
    """Round by round, one request of each group (a group's prefix and a block of its own), sent
    to the engines in turn (round robin): a group's later requests land on engines that did not
    compute its prefix, whose host pools may hold it or not."""
    prompts, times = [], []
    nxt = groups * prefix
    t = 0.0
    for r in range(per_group):
        for g in range(groups):
            prompts.append(list(range(g * prefix, (g + 1) * prefix)) + [nxt])
            nxt += 1
            times.append(t)
            t += spread
        t += 0.0 if r % 2 else 5.0  # every other round long after the one before
    n = len(prompts)
    return BlockedTrace.from_lists(
        times, [(prefix + 1) * B + 1] * n, [2] * n, prompts, B, n_blocks=nxt
    )


@settings(max_examples=50, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    groups=st.integers(1, 4),
    prefix=st.integers(2, 24),
    per_group=st.integers(2, 5),
    instances=st.integers(2, 3),
    spread=st.sampled_from([0.0, 1e-3, 2e-2]),
    hbm_prompts=st.sampled_from([1.5, 3.0]),
    dram_prompts=st.sampled_from([0.5, 1.5, 8.0]),
    min_blocks=st.sampled_from([1, 4, 16]),
    async_scheduling=st.booleans(),
    load_report=st.sampled_from(["step_output", "at_once"]),
)
def test_engines_agree_on_drawn_prefetches(
    groups, prefix, per_group, instances, spread, hbm_prompts, dram_prompts, min_blocks,
    async_scheduling, load_report,
) -> None:  # fmt: skip
    """Drawn groups sharing prefixes over two or three engines whose host pools hold a few
    prompts or many, a shared file tier behind SGLang's file back end: identical per-request
    results and tier counts from both engines, the model's invariants checked at every step."""
    tr = drawn_trace(groups, prefix, per_group, spread)
    model = load_model("Qwen3-8B")
    prompt_gb = (prefix + 2) * B * model.kv_bytes_per_token("bf16") / 1e9
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(
            instances=instances, tp=1, routing="round_robin", async_scheduling=async_scheduling
        ),
        tiers=(
            TierPolicy(capacity_gb=hbm_prompts * prompt_gb),
            TierPolicy(name="dram", capacity_gb=dram_prompts * prompt_gb * instances),
            TierPolicy(name="ssd", capacity_gb=200.0, connector="sglang-hicache-file"),
        ),
        load_report=load_report,
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=instances))
    cfg = replace(build_config(hw, model, policy), prefetch_min_tokens=min_blocks * B)
    assert cfg.prefetches_at_arrival
    pair = replay_both(tr, cfg, check_invariants=True)
    if pair is None:  # both stopped at the same stall
        return
    tiers = ("tier_hit_blocks", "tier_bytes_read", "tier_bytes_written", "link_busy_s")
    assert_fields_equal(*pair, (*REQUEST_FIELDS, *tiers))


def test_the_first_lower_tier_has_nothing_above_to_prefetch_into() -> None:
    """The file back end's connector on the only lower tier: its hits load at admission, once
    (no prefetch reads them first)."""
    model = load_model("Qwen3-8B")
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=2, tp=1, routing="round_robin"),
        tiers=(
            TierPolicy(capacity_gb=20.0),
            TierPolicy(name="ssd", capacity_gb=200.0, connector="sglang-hicache-file"),
        ),
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    cfg = build_config(
        replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=2)), model, policy
    )
    assert cfg.prefetches_at_arrival
    for engine in ("reference", "numba"):
        raw = simulate_raw(trace(64), cfg, engine=engine, check_invariants=engine == "reference")
        assert raw.loaded_blocks[1, 0] == 64 and raw.tier_hit_blocks[0] == 64
