"""What optimize reports is what ran: settings that took effect, presets compared like with
like, contradictory pins refused, and a diagnosis from whole replays."""

from __future__ import annotations

from dataclasses import replace

import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, TierPolicy
from kvtier.search.run import (
    as_ran,
    baseline_policies,
    check_pinned_size,
    effective_params,
    model_tp,
    optimize,
)
from tests.helpers import REPO, assert_one_line_error, invoke

SAMPLE = REPO / "traces" / "sample-multiround-qa.parquet"
MOONCAKE = REPO / "traces" / "mooncake-conversation.parquet"


def test_contradictory_pins_are_refused_in_one_line(tmp_path) -> None:
    result = invoke(
        "optimize",
        "--trace",
        str(SAMPLE),
        "--pin",
        "serving.tp=8",
        "--pin",
        "serving.instances=3",
        "--storage",
        f"sqlite:///{tmp_path / 's.db'}",
    )
    assert_one_line_error(result, "--pin", "serving.tp=8", "serving.instances=3", "24 GPUs")


def test_pins_that_fit_are_not_refused() -> None:
    hw = load_hardware("h100-node")
    check_pinned_size({"serving.tp": 8, "serving.instances": 1}, hw)
    check_pinned_size({"serving.tp": 2, "serving.instances": 4}, hw)
    check_pinned_size({"serving.instances": 30}, hw)  # tp searched: instances follow the GPUs
    with pytest.raises(Exception, match="at most 4 instances of tp 2"):
        check_pinned_size({"serving.tp": 2, "serving.instances": 5}, hw)


def test_presets_run_at_a_tensor_parallel_size_that_holds_the_model() -> None:
    hw, big = load_hardware("h100-node"), load_model("Llama-3.1-70B")
    assert hw.kv_capacity_bytes(big, hw.topology.tp) <= 0  # the presets' own tp cannot hold it
    base = Policy(hardware="h100-node", model="Llama-3.1-70B")
    presets = baseline_policies(base, hw, big)
    ran = {n: p for n, p in presets.items() if isinstance(p, Policy)}
    assert ran, presets
    for name, policy in ran.items():
        sizes = [policy.serving.tp or hw.topology.tp]
        sizes += [t for t in (policy.serving.prefill_tp, policy.serving.decode_tp) if t]
        for tp in sizes:
            assert hw.kv_capacity_bytes(big, tp) > 0, (name, tp)
        assert policy.serving.tp == model_tp(hw, big, hw.topology.tp), name
    # a model that fits keeps each preset's own size
    small = load_model("Llama-3.1-8B")
    kept = baseline_policies(Policy(hardware="h100-node"), hw, small)
    plain = baseline_policies(Policy(hardware="h100-node"))
    for name, policy in kept.items():
        if isinstance(policy, Policy):
            assert policy.serving == plain[name].serving, name


def test_the_winner_shows_the_instances_that_ran_and_no_settings_of_unused_tiers() -> None:
    policy = Policy(serving=replace(Policy().serving, instances=11, tp=8))
    ran = as_ran(policy, {"instances": 4}, 1.0)
    assert ran.serving.instances == 4
    assert as_ran(policy, {"instances": 2}, 0.5).serving.instances == 4  # a half sample ran 2
    params = {
        "serving.instances": 11,
        "serving.tp": 8,
        "tiers.dram.enabled": False,
        "tiers.dram.capacity_gb": 640.0,
        "tiers.dram.eviction": "s3fifo",
        "block_tokens": 64,
    }
    shown = effective_params(params, replace(ran, block_tokens=64))
    assert shown == {
        "serving.instances": 4,
        "serving.tp": 8,
        "tiers.dram.enabled": False,
        "block_tokens": 64,
    }
    with_dram = replace(ran, tiers=(TierPolicy(), TierPolicy(name="dram", capacity_gb=320.0)))
    params["tiers.dram.enabled"] = True
    shown = effective_params(params, with_dram)
    assert shown["tiers.dram.capacity_gb"] == 320.0  # as refined, not as sampled
    assert shown["tiers.dram.eviction"] == "lru"


@pytest.mark.slow
def test_no_feasible_diagnosis_names_a_trial_that_served_the_whole_trace(tmp_path) -> None:
    result = optimize(
        str(MOONCAKE),
        target="dynamo",
        slo_text="ttft_p99=0.05,tpot_p99=0.01",
        n_trials=4,
        seed=0,
        compare_presets=False,
        storage=f"sqlite:///{tmp_path / 'm.db'}",
        study_name="mooncake",
        runs_dir=tmp_path / "runs",
    )
    assert result.best is None
    near = result.closest
    assert near is not None
    m = near.metrics
    # its figures are of the whole trace: a trial that ran to the end, or one replayed to it
    assert not m.get("early_stopped") or m.get("replayed_to_end")
    assert m["n_served"] + m["n_rejected"] == m["n_requests"]
    assert result.binding in near.violations and near.violations[result.binding] > 0
    from rich.console import Console

    from kvtier.report.optimize import print_result

    console = Console(record=True, width=200)
    print_result(result, console)
    text = console.export_text()
    assert f"Closest: trial {near.number}" in text
    assert "served the whole trace" in text or "replayed to the end" in text
    if m["n_rejected"]:
        assert f"rejected {m['n_rejected']:,} of" in text
    else:
        assert "rejected" not in text
