"""Prefill and decode pools on different GPU types (serving.prefill_gpu, a hardware profile's
prefill_gpu): each pool's step times, HBM blocks, price and power are its GPU's, and both
engines agree exactly, per request, on a mixed-GPU P/D replay."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest

from kvtier.errors import InputError
from kvtier.hardware import load_gpu, load_hardware, load_model
from kvtier.policy import Policy
from kvtier.sim import build_config, simulate_raw
from kvtier.sim.energy import replay_energy
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.blocks import block_trace
from kvtier.trace.synth import synthesize
from tests.test_sim_differential import assert_same

MODEL = "Llama-3.1-8B"


def policy(**serving) -> Policy:
    p = Policy()
    return replace(p, serving=replace(p.serving, **serving))


def config(hw: str = "h200-node", **serving):
    return build_config(load_hardware(hw), load_model(MODEL), policy(**serving))


def test_each_pool_runs_at_its_gpu_type() -> None:
    mixed = config(instances=4, prefill_instances=1, prefill_gpu="h100-sxm")
    h100 = build_config(load_hardware("h100-node"), load_model(MODEL), policy(instances=1))
    h200 = config(instances=1)
    assert mixed.two_pools and mixed.prefill_gpu is not None
    assert mixed.prefill_gpu.name == "H100-SXM"
    # HBM blocks: 80 GB on the prefill instance, 141 GB on the decode ones
    assert mixed.instance_capacity().tolist() == [h100.capacity_blocks] + [h200.capacity_blocks] * 3
    rows = mixed.pool_timings()
    np.testing.assert_array_equal(rows[0], h100.timing_params())
    np.testing.assert_array_equal(rows[1], h200.timing_params())
    assert "prefill H100-SXM tp=1" in mixed.step_provenance
    assert "decode H200 tp=1" in mixed.step_provenance
    # one H100 and three H200 at their own prices
    h100_price, h200_price = load_gpu("h100-sxm").price_per_hour, load_gpu("h200").price_per_hour
    assert mixed.cost_per_hour == pytest.approx(h100_price + 3 * h200_price)


def test_the_profile_prefill_gpu_is_used_only_when_disaggregated() -> None:
    split = config("vr-nvl144-cpx", prefill_instances=16)
    assert split.prefill_gpu is not None and split.prefill_gpu.name == "Rubin-CPX"
    assert split.n_prefill == 16 and split.n_instances == 24
    # 128 GB GDDR7 against 288 GB HBM4
    assert split.capacity_blocks < split.decode_capacity_blocks
    aggregated = config("vr-nvl144-cpx")
    assert aggregated.prefill_gpu is None and not aggregated.two_pools


def test_prefill_gpu_without_a_split_is_a_one_line_error() -> None:
    with pytest.raises(InputError, match="serving.prefill_gpu"):
        config(prefill_gpu="h100-sxm")
    with pytest.raises(InputError, match="unknown gpus profile"):
        config(prefill_instances=1, prefill_gpu="nope")


def test_each_pool_draws_its_gpus_power() -> None:
    cfg = config(instances=2, prefill_instances=1, prefill_gpu="l40s")
    trace = BlockedTrace.from_lists([0.0], [2000], [4], [[]], 16)
    raw = simulate_raw(trace, cfg, engine="reference")
    hw = load_hardware("h200-node")
    e = replay_energy(raw, cfg, hw, trace.arrival_s, 2004)
    span = e.span_s
    l40s, h200 = load_gpu("l40s"), hw.gpu
    idle = (l40s.idle_w + h200.idle_w) * span
    busy = raw.busy_s[0] * (l40s.tdp_w - l40s.idle_w) + raw.busy_s[1] * (h200.tdp_w - h200.idle_w)
    assert e.parts_j["gpu_idle"] == pytest.approx(idle, rel=1e-12)
    assert e.parts_j["gpu_busy"] == pytest.approx(busy, rel=1e-12)


@pytest.mark.parametrize(
    ("hw", "serving"),
    [
        ("h200-node", {"instances": 5, "prefill_instances": 2, "prefill_gpu": "h100-sxm"}),
        ("vr-nvl144-cpx", {"prefill_instances": 16}),
    ],
)
def test_both_engines_agree_on_a_mixed_gpu_pd_replay(hw: str, serving: dict) -> None:
    cfg = config(hw, **serving)
    assert cfg.prefill_gpu is not None
    trace = block_trace(synthesize("chat", requests=120, rate=40.0, seed=3), 16)
    ref = simulate_raw(trace, cfg, engine="reference")
    nb = simulate_raw(trace, cfg, engine="numba")
    assert_same(ref, nb, trace)
    assert np.isfinite(ref.first_token_s).all()
    # the decode instances are the second GPU type's
    assert (ref.decode_instance >= cfg.n_prefill).all()
