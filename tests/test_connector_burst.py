"""A full hit is never slower than a cold prefill, unless the tier's path is (docs/model.md,
"What the replay shows").

A burst of long prompts on one instance (a cold round, then the same prompts again once the
first round has finished), its HBM too small to keep them, so the second round's prefixes come
from the lower tier. For every connector and every preset with a lower tier, the full-hit
round's mean TTFT is at most the cold round's, or the replay's tier statistics carry the
net-loss verdict (loading a typical hit through the connector takes longer than recomputing
it) that ``kvtier replay`` and ``kvtier compare`` print beside the tier.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kvtier.hardware import load_hardware, load_model
from kvtier.hardware.types import Hardware
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.policy.presets import load_preset, preset_names
from kvtier.policy.registries import CONNECTORS, WRITE_POLICIES
from kvtier.sim import replay_metrics, simulate_raw
from kvtier.sim.config import build_config
from kvtier.trace.blocked import BlockedTrace

ROUND_GAP_S = 1.0e5  # the second round starts long after the first has finished


def burst(n: int, tokens: int, B: int, rounds: int = 2) -> BlockedTrace:
    """``n`` distinct prompts of ``tokens`` tokens at t = 0, then the same ``n`` again in each
    further round, each long after the last."""
    per = tokens // B
    prompts = [list(range(i * per, (i + 1) * per)) for i in range(n)]
    return BlockedTrace.from_lists(
        [r * ROUND_GAP_S for r in range(rounds) for _ in range(n)],
        [tokens + 1] * (rounds * n),
        [1] * (rounds * n),
        prompts * rounds,
        B,
        n_blocks=n * per,
    )


def one_host(hw: Hardware, gpus: int) -> Hardware:
    return replace(hw, topology=replace(hw.topology, hosts=1, gpus_per_host=gpus))


def small_hbm(policy: Policy, model: str, tokens: int) -> Policy:
    """HBM for two and a half prompts of ``tokens``: a round of more does not stay in it."""
    gb = 2.5 * tokens * load_model(model).kv_bytes_per_token(policy.kv_dtype) / 1e9
    tiers = tuple(replace(t, capacity_gb=gb) if t.name == "hbm" else t for t in policy.tiers)
    return replace(policy, tiers=tiers)


def rounds(
    trace: BlockedTrace, hw: Hardware, model: str, policy: Policy, engine: str = "numba"
) -> tuple[float, float, tuple, np.ndarray]:
    """(cold round's mean TTFT, full-hit round's, the tier statistics, blocks per tier)."""
    cfg = build_config(hw, load_model(model), policy)
    raw = simulate_raw(trace, cfg, engine=engine, check_invariants=engine == "reference")
    _, stats = replay_metrics(trace, raw, cfg, hw, slo=None, engine=engine)
    ttft = raw.first_token_s - trace.arrival_s
    n = int(np.sum(trace.arrival_s == 0.0))  # one round; the last round is the full-hit one
    return float(ttft[:n].mean()), float(ttft[-n:].mean()), stats, raw.tier_hit_blocks


def holds(cold: float, hit: float, stats: tuple) -> bool:
    """The property: the hit round is no slower, or the report says the tier is a net loss."""
    return hit <= cold or any(s.net_loss for s in stats)


def connector_policy(connector: str, B: int, tp: int, tokens: int) -> Policy:
    policy = Policy(
        block_tokens=B,
        serving=ServingPolicy(instances=1, tp=tp),
        tiers=(TierPolicy(), TierPolicy(name="rdma", capacity_gb=500.0, connector=connector)),
    )
    return small_hbm(policy, "Qwen3-32B", tokens)


@pytest.mark.parametrize("connector", CONNECTORS.names)
def test_every_connector_full_hit_no_slower_or_net_loss(connector: str) -> None:
    hw = one_host(load_hardware("beluga-testbed"), 8)
    trace = burst(8, 16384, 256)
    cold, hit, stats, tier_hits = rounds(
        trace, hw, "Qwen3-32B", connector_policy(connector, 256, 8, 16384)
    )
    assert tier_hits.sum() > 0  # the second round's prefixes came from the tier
    assert holds(cold, hit, stats), (connector, cold, hit, [s.load_s_idle for s in stats])


def _presets_with_tiers() -> list[str]:
    return [name for name in preset_names() if len(load_preset(name).tiers) > 1]


@pytest.mark.parametrize("preset", _presets_with_tiers())
def test_every_preset_full_hit_no_slower_or_net_loss(preset: str) -> None:
    policy = load_preset(preset)
    hw = load_hardware(policy.hardware)
    hw = one_host(hw, hw.topology.gpus_per_host)  # one host; the instance takes its tp of it
    # one aggregated instance: a P/D preset's lower tiers are judged on the same burst
    serving = replace(policy.serving, instances=1, prefill_instances=0, prefill_share=0.0)
    policy = replace(policy, serving=serving)
    policy = small_hbm(policy, policy.model, 16384)
    # a write policy that counts sightings writes a block once it was seen selective_k times:
    # that many rounds before the full-hit one
    sightings = WRITE_POLICIES.get(policy.write_policy).traits["sightings"]
    passes = 1 + (policy.selective_k if sightings else 1)
    trace = burst(6, 16384, policy.block_tokens, passes)
    cold, hit, stats, tier_hits = rounds(trace, hw, policy.model, policy)
    assert tier_hits.sum() > 0
    assert holds(cold, hit, stats), (preset, cold, hit, [(s.tier, s.net_loss) for s in stats])


def test_beluga_era_path_is_reported_as_net_loss_on_tp8() -> None:
    """LMCache 0.3's serial per-chunk gets on a tp-8 instance: its full hits are slower than
    recomputing, and the report says so; Mooncake Store at its current release is not."""
    hw = one_host(load_hardware("beluga-testbed"), 8)
    trace = burst(8, 16384, 256)
    old = connector_policy("lmcache-0.3-mooncake", 256, 8, 16384)
    cold, hit, stats, _ = rounds(trace, hw, "Qwen3-32B", old)
    assert hit > cold and stats[0].net_loss
    current = replace(load_preset("mooncake-rdma"), serving=ServingPolicy(tp=8))
    current = small_hbm(current, "Qwen3-32B", 16384)
    cold, hit, stats, _ = rounds(trace, hw, "Qwen3-32B", current)
    assert hit < cold and not stats[0].net_loss


@settings(
    max_examples=12, deadline=None, suppress_health_check=[HealthCheck.too_slow], derandomize=True
)
@given(
    connector=st.sampled_from(CONNECTORS.names),
    n=st.integers(1, 6),
    kblocks=st.integers(8, 48),
    B=st.sampled_from([16, 64, 256]),
    tp=st.sampled_from([1, 2, 4, 8]),
)
def test_full_hit_property_drawn(connector: str, n: int, kblocks: int, B: int, tp: int) -> None:
    hw = one_host(load_hardware("beluga-testbed"), 8)
    trace = burst(n, kblocks * 256, B)
    cold, hit, stats, _ = rounds(
        trace, hw, "Qwen3-32B", connector_policy(connector, B, tp, kblocks * 256)
    )
    assert holds(cold, hit, stats), (cold, hit, [(s.load_s_idle, s.recompute_s) for s in stats])


@pytest.mark.parametrize("connector", CONNECTORS.names)
def test_burst_engines_agree(connector: str) -> None:
    """The same burst through the reference: identical per-request TTFT and the same verdict."""
    hw = one_host(load_hardware("beluga-testbed"), 2)
    trace = burst(3, 4096, 256)
    policy = connector_policy(connector, 256, 2, 4096)
    a = rounds(trace, hw, "Qwen3-32B", policy, "reference")
    b = rounds(trace, hw, "Qwen3-32B", policy, "numba")
    assert a[:2] == b[:2]
    assert [s.net_loss for s in a[2]] == [s.net_loss for s in b[2]]
    assert holds(*b[:3])


def test_net_loss_is_said_in_the_tier_table_json_and_a_note() -> None:
    from rich.console import Console

    from kvtier.report.tiers import net_loss_lines, tier_json, tier_table
    from kvtier.sim.tier_stats import STAGES, TierStats

    def row(load: float) -> TierStats:
        stages = dict.fromkeys(STAGES, 0.1)
        return TierStats(
            "rdma", "lmcache-0.3-mooncake", 1.0, 1.0, 1.0, 0.5, stages, "nic", 0.1,
            float("nan"), 0.0, 0.0, judged_blocks=64.0, load_s_idle=load, recompute_s=1.0,
        )  # fmt: skip

    slow, fast = row(9.7), row(0.5)
    assert slow.net_loss and not fast.net_loss
    (line,) = net_loss_lines([slow, fast])
    assert "rdma (lmcache-0.3-mooncake) is a net loss" in line and "9.7 s" in line
    assert [r["net_loss"] for r in tier_json([slow, fast])] == [True, False]
    console = Console(width=250, record=True)
    console.print(tier_table([slow, fast]))
    text = console.export_text()
    assert "9.7 / 1 net loss" in text and "0.5 / 1" in text
