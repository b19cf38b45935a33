"""A block loaded from a tier whose connector fills the tiers above it becomes resident there
(SGLang HiCache's storage back ends: the prefetch lands in the engine's host pool and its radix
tree takes the pages; docs/model.md, "Loads that fill the tiers above").

Two engines on one host share a file tier (a Lustre-like pool every engine reaches) and keep
host pools of their own. Engine 0 computes a prefix, written through to its host pool and the
file tier; engine 1 then extends it and loads it from the file tier. After fillers have pushed
it out of engine 1's HBM, engine 1 extends it again: with the fill it finds the prefix in its
own host pool, without it in the file tier again. Both engines of the simulator agree.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import REQUEST_FIELDS, assert_fields_equal, replay_both

B = 16
PREFIX = 64  # blocks of the shared prefix
GAP_S = 1.0e4  # each request starts long after the last has finished
DRAM, SSD = 0, 1  # lower-tier columns of RawResult.loaded_blocks


def trace() -> BlockedTrace:
    """Round robin over two engines: the prefix on engine 0, its first extension on engine 1,
    then fillers on both (three on engine 1, more than its HBM holds beside the prefix), then
    its second extension on engine 1."""
    base = list(range(PREFIX))
    nxt = PREFIX
    prompts = [base + [nxt], base + [nxt + 1]]
    nxt += 2
    for _ in range(7):
        prompts.append(list(range(nxt, nxt + PREFIX + 1)))
        nxt += PREFIX + 1
    prompts.append(base + [nxt])
    nxt += 1
    n = len(prompts)
    times = [i * GAP_S for i in range(n)]
    return BlockedTrace.from_lists(
        times, [(PREFIX + 1) * B + 1] * n, [4] * n, prompts, B, n_blocks=nxt
    )


def config(file_connector: str):
    """Two H100 engines on one host, HBM for about two and a half prompts each, a host pool
    per engine and one shared file tier behind ``file_connector``, written through; the file
    tier's prefetch at arrival off, so its blocks are loaded at admission (the prefetch:
    tests/test_prefetch_at_arrival.py)."""
    model = load_model("Qwen3-8B")
    hbm_gb = 2.5 * (PREFIX + 1) * B * model.kv_bytes_per_token("bf16") / 1e9
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(instances=2, tp=1, routing="round_robin"),
        tiers=(
            TierPolicy(capacity_gb=hbm_gb),
            TierPolicy(name="dram", capacity_gb=100.0),
            TierPolicy(name="ssd", capacity_gb=200.0, connector=file_connector),
        ),
    )
    hw = load_hardware("a3-highgpu-4g-lustre")
    hw = replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=2))
    cfg = build_config(hw, model, policy)
    off = np.zeros(cfg.tiers.n_tiers, dtype=np.bool_)
    return replace(cfg, tiers=replace(cfg.tiers, prefetch_at_arrival=off))


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_file_tier_load_fills_the_host_pool(engine: str) -> None:
    cfg = config("sglang-hicache-file")
    assert cfg.tiers.names == ("dram", "ssd")
    assert cfg.tiers.load_fills_upper.tolist() == [False, True]
    raw = simulate_raw(trace(), cfg, engine=engine, check_invariants=engine == "reference")
    loaded = raw.loaded_blocks
    assert loaded[1, SSD] == PREFIX and loaded[1, DRAM] == 0  # engine 1 reads the file tier
    assert raw.hit_blocks[-1] == 0  # HBM no longer holds it
    assert loaded[-1, DRAM] == PREFIX and loaded[-1, SSD] == 0  # then its own host pool


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_without_the_fill_the_file_tier_is_read_again(engine: str) -> None:
    cfg = config("direct")
    assert not cfg.tiers.load_fills_upper.any()
    raw = simulate_raw(trace(), cfg, engine=engine, check_invariants=engine == "reference")
    loaded = raw.loaded_blocks
    assert loaded[1, SSD] == PREFIX
    assert loaded[-1, SSD] == PREFIX and loaded[-1, DRAM] == 0


@pytest.mark.parametrize("connector", ["sglang-hicache-file", "direct"])
def test_engines_agree(connector: str) -> None:
    cfg = config(connector)
    ref, fast = replay_both(trace(), cfg, check_invariants=True)
    assert_fields_equal(ref, fast, (*REQUEST_FIELDS, "tier_hit_blocks", "tier_bytes_read"))
