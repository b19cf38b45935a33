"""Warm start at the presets that met the SLO and at the knees of the trace's miss-ratio
curve."""

from __future__ import annotations

import numpy as np

from kvtier.hardware import load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.search.space import Param, SearchSpace
from kvtier.search.warmstart import (
    curve_knees,
    knee_capacities_gb,
    policy_value,
    preset_trials,
    warm_start_trials,
)
from kvtier.trace.blocks import block_trace
from kvtier.trace.synth import synthesize


def test_knees_of_a_known_curve() -> None:
    caps = np.geomspace(1, 1024, 11)  # 1, 2, 4, ..., 1024
    # hit ratio saturates at 0.5 from 64 blocks on
    hits = np.minimum(np.log2(caps) / 6, 1.0) * 0.5
    knees = curve_knees(caps, hits)
    assert int(caps[6]) in knees  # 64: farthest from the chord, and 99% of the final ratio
    assert all(k <= 64 for k in knees)
    assert curve_knees(caps[:2], hits[:2]) == []


def test_warm_start_enqueues_capacity_params() -> None:
    trace = synthesize("chat", requests=300, rate=5.0, seed=2)
    blocked = block_trace(trace, 16)
    model = load_model("Llama-3.1-8B")
    knees = knee_capacities_gb(blocked, model)
    assert knees and all(k > 0 for k in knees)
    block_gb = 16 * model.kv_bytes_per_token() / 1e9
    assert max(knees) <= blocked.n_blocks * block_gb + 1e-9
    space = SearchSpace(
        (
            Param("tiers.hbm.capacity_gb", low=0.01, high=1000.0, log=True),
            Param("serving.routing", choices=("round_robin", "least_loaded")),
        )
    )
    trials = warm_start_trials(space, blocked, model, Policy())
    assert [t["tiers.hbm.capacity_gb"] for t in trials] == [max(0.01, k) for k in knees]
    pinned = space.with_pins({"tiers.hbm.capacity_gb": 5.0})
    assert warm_start_trials(pinned, blocked, model, Policy()) == []


def test_optimize_runs_the_enqueued_trials_first(tmp_path) -> None:
    import optuna

    from kvtier.search.run import optimize
    from kvtier.trace.io import write_trace

    path = tmp_path / "t.parquet"
    write_trace(synthesize("chat", requests=200, rate=5.0, seed=4), path)
    space = tmp_path / "s.toml"
    space.write_text(
        'format = "kvtier-space/1"\n[params."tiers.hbm.capacity_gb"]\nlow = 0.05\nhigh = 40.0\n'
        'log = true\n[params."serving.instances"]\nlow = 1\nhigh = 2\n'
    )
    result = optimize(
        str(path),
        space=str(space),
        n_trials=6,
        study_name="w",
        runs_dir=tmp_path / "runs",
        out=str(tmp_path / "p.toml"),
    )
    study = optuna.load_study(study_name="w", storage=result.storage)
    knees = knee_capacities_gb(
        block_trace(synthesize("chat", requests=200, rate=5.0, seed=4), 16),
        load_model("Llama-3.1-8B"),
    )
    # the presets that met the SLO first (each at the instances it ran on), then the knees
    worked = [b for b in result.baselines if b.evaluation is not None and b.evaluation.feasible]
    instances = {b.evaluation.policy.serving.instances for b in worked}
    presets = result.warm_started - len(knees)
    assert 0 < len(knees) <= 3 and 0 < presets <= len(worked)
    warmed = study.trials[: result.warm_started]
    assert {t.params["serving.instances"] for t in warmed[:presets]} <= instances
    firsts = [t.params["tiers.hbm.capacity_gb"] for t in warmed[presets:]]
    assert firsts == [min(max(k, 0.05), 40.0) for k in knees]


def test_a_preset_is_enqueued_as_far_as_the_space_states_it() -> None:
    space = SearchSpace(
        (
            Param("serving.instances", low=1, high=8, integer=True),
            Param("serving.routing", choices=("round_robin", "kv_aware")),
            Param("tiers.dram.enabled", choices=(True, False)),
            Param(
                "tiers.dram.capacity_gb", low=10.0, high=100.0, when=(("tiers.dram.enabled", True),)
            ),
            Param("serving.tp", choices=(1, 2)),
            Param("block_tokens", choices=(16, 32)),
        ),
        pinned={"kv_dtype": "bf16"},
    )
    tiered = Policy(
        block_tokens=64,  # not in the space: left to the sampler
        serving=ServingPolicy(instances=3, routing="kv_aware"),
        tiers=(TierPolicy(), TierPolicy(name="dram", capacity_gb=40.0)),
    )
    flat = Policy(serving=ServingPolicy(instances=5, routing="prefix_affinity", tp=2))
    trials = preset_trials(space, [tiered, flat, tiered], default_tp=1)
    assert trials == [  # one per preset, the duplicate once; unset tp is the hardware's
        {
            "serving.instances": 3,
            "serving.routing": "kv_aware",
            "tiers.dram.enabled": True,
            "tiers.dram.capacity_gb": 40.0,
            "serving.tp": 1,
        },
        {"serving.instances": 5, "tiers.dram.enabled": False, "serving.tp": 2, "block_tokens": 16},
    ]
    assert policy_value(tiered, "tiers.cxl.capacity_gb") is None
    split = Policy(serving=ServingPolicy(prefill_instances=2))
    assert policy_value(split, "serving.prefill_share") is None  # a count, not a share
