"""Sliding-window copies in the lower tiers (``SimConfig.tier_window``; docs/model.md,
"Sliding-window copies in the lower tiers").

vLLM's OffloadingConnector under the hybrid KV cache manager keys its CPU blocks by block and
attention group (offloading/scheduler.py, 0.22.0): a gpt-oss block is a full-attention entry
and a sliding-window entry. A hit needs the full-attention entries of the whole prefix and the
sliding-window entries of its last ``cdiv(128, B)`` blocks, and only those are touched again,
so a reused prefix keeps its full-attention entries while its other sliding-window entries
age out.

The trace, at B = 64 (a hit needs the sliding-window copies of its last two blocks): a
prompt of an eight-block prefix and a block of its own (A), the same prefix hit in HBM (B),
three fillers that push the prefix out of HBM and, written through, eight entries out of the
CPU pool: the oldest, the prefix's first six sliding-window copies and A's own block's two.
Then the whole prefix again (C), which finds it all, and a prompt sharing the prefix's first
seven blocks (D), whose full-attention entries are held but of whose last two blocks' sliding-
window copies only the seventh's is (the one B's hit touched): vLLM loads nothing for it.
"""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.sim import simulate_raw
from kvtier.sim.config import build_config
from kvtier.sim.reference_tiers import LowerTiers
from kvtier.trace.blocked import BlockedTrace
from tests.helpers import REQUEST_FIELDS, assert_fields_equal, replay_both
from tests.sim_strategies import blocked_traces, tiered_configs
from tests.test_sim_tiers_differential import tiered_engines_agree

B = 64
P = 8  # blocks of the prefix
FILL = 3  # filler prompts of P + 1 blocks
GAP_S = 1.0e4


def trace() -> BlockedTrace:
    prefix = list(range(P))
    nxt = P
    prompts = [prefix + [nxt], prefix + [nxt + 1]]
    nxt += 2
    for _ in range(FILL):
        prompts.append(list(range(nxt, nxt + P + 1)))
        nxt += P + 1
    prompts += [prefix + [nxt], prefix[:7] + [nxt + 1]]
    n = len(prompts)
    inputs = [len(p) * B + 1 for p in prompts]
    times = [j * GAP_S for j in range(n)]
    return BlockedTrace.from_lists(times, inputs, [4] * n, prompts, B, n_blocks=nxt + 2)


def config():
    model = load_model("gpt-oss-120b")
    block_gb = B * model.kv_bytes_per_token("bf16") / 1e9
    # A and B leave 20 entries; the fillers add 2 x 27, of which 8 must go
    cpu_entries = 2 * FILL * (P + 1) + 12
    policy = Policy(
        block_tokens=B,
        write_policy="write_through",
        serving=ServingPolicy(instances=1, tp=1),
        tiers=(
            TierPolicy(capacity_gb=20.5 * block_gb),
            TierPolicy(
                name="dram", capacity_gb=(cpu_entries + 0.5) * block_gb, connector="vllm-offloading"
            ),
        ),
    )
    hw = load_hardware("h100-node")
    return build_config(
        replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=1)), model, policy
    )


def without_group_entries(cfg):
    return replace(cfg, tiers=replace(cfg.tiers, group_entries=False))


def test_the_window_applies_to_vllms_connector_on_a_sliding_window_model() -> None:
    cfg = config()
    assert cfg.tier_window == (1, 2)  # one sliding-window group, cdiv(128, 64) blocks
    assert without_group_entries(cfg).tier_window == (0, 0)
    assert replace(cfg, prefix_caching=False).tier_window == (0, 0)
    assert replace(cfg, swa_blocks=0).tier_window == (0, 0)


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_reused_prefix_keeps_what_its_hits_need(engine: str) -> None:
    run = simulate_raw(trace(), config(), engine=engine, check_invariants=engine == "reference")
    c, d = len(run.hit_blocks) - 2, len(run.hit_blocks) - 1
    assert run.hit_blocks[1] == P  # B hit the prefix in HBM
    assert run.hit_blocks[c] == 0 and run.loaded_blocks[c, 0] == P  # C loaded all of it
    # D's full-attention entries are held, its sliding-window copies at the cut are not
    assert run.hit_blocks[d] == 0 and run.loaded_blocks[d, 0] == 0
    # one entry a block (no group entries): D loads its seven blocks
    plain = simulate_raw(trace(), without_group_entries(config()), engine=engine)
    assert plain.loaded_blocks[d, 0] == 7


@pytest.mark.parametrize("engine", ["reference", "numba"])
def test_a_load_moves_the_windows_copies_with_the_run(engine: str) -> None:
    # C's load: its eight full-attention entries and the two sliding-window copies before the
    # hit's end; written through, each computed block is two entries, and D, loading nothing,
    # writes six of its prefix blocks' sliding-window copies again (the seventh's and their
    # full-attention entries held)
    run = simulate_raw(trace(), config(), engine=engine)
    plain = simulate_raw(trace(), without_group_entries(config()), engine=engine)
    block = config().tiers.block_bytes
    assert run.tier_hit_blocks[0] == P
    assert run.tier_bytes_read[0] == (P + 2) * block
    written = plain.tier_bytes_written[0] / block  # one entry a block, nothing evicted
    assert written == (P + 1) + 1 + FILL * (P + 1) + 2  # A, B, the fillers, C and D
    assert run.tier_bytes_written[0] == (2 * written + 6) * block


def test_engines_agree() -> None:
    pair = replay_both(trace(), config(), check_invariants=True)
    assert pair is not None
    assert_fields_equal(*pair, (*REQUEST_FIELDS, "tier_hit_blocks", "tier_bytes_read"))


def test_window_end_follows_vllms_sliding_window_lookup() -> None:
    # _sliding_window_lookup: from the run's end back, the first block ending `need` held
    # blocks; reaching the run's start, the held blocks from it (0: no hit)
    cfg = config()
    lower = LowerTiers(cfg.tiers, 40, [cfg.timing], None)
    lower.win_off, lower.win_copies, lower.win_need = 20, 1, 2
    held = {2, 3, 5, 7}
    for b in held:
        lower.pool(0, 0).access(b + 20)
    blocks = list(range(10))
    assert lower.window_end(0, blocks, 0, 10) == 4  # 7 alone, 5 alone, then 2 and 3
    assert lower.window_end(0, blocks, 0, 3) == 0  # 2 alone before the start's miss
    assert lower.window_end(0, blocks, 2, 3) == 3  # the run from its start: 2
    assert lower.window_end(0, blocks, 4, 5) == 4  # 4 not held: no hit


@st.composite
def windowed_cases(draw: st.DrawFn):
    """Generated traces under tiered configurations with the window on: vLLM V1, prefix
    caching, sliding-window layers and a connector keying each group's blocks."""
    trace = draw(blocked_traces())
    cfg = draw(tiered_configs(trace.block_tokens))
    cfg = replace(
        cfg,
        scheduler=1,
        prefix_caching=True,
        swa_window=draw(st.sampled_from([1, 2, 5, 2 * trace.block_tokens + 1])),
        tiers=replace(cfg.tiers, group_entries=True, touches_prompt=True),
    )
    assume(cfg.tier_window[0] > 0)
    return trace, cfg


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(windowed_cases())
def test_engines_agree_on_generated_traces(case) -> None:
    tiered_engines_agree(*case)
