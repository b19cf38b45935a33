"""What tiering buys: both answers get the same instance sweep (kvtier.search.tiering)."""

from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest

from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import SLO, policy_from_dict, policy_to_dict
from kvtier.report.optimize import tiering_sentence
from kvtier.scenario import Scenario
from kvtier.search.objective import Evaluator
from kvtier.search.run import Choice
from kvtier.search.study import TrialSummary
from kvtier.search.tiering import compare_tiering, sweep_instances, with_tier_values
from kvtier.trace.io import read_trace, write_trace
from kvtier.trace.synth import synthesize

SLO_ = SLO(ttft_p99_s=0.5, tpot_p99_s=0.05)
DRAM = {"tiers.dram.enabled": True, "tiers.dram.capacity_gb": 64.0, "tiers.dram.eviction": "lru"}
HBM = {f"tiers.{t}.enabled": False for t in ("dram", "cxl", "rdma", "ssd")}


@pytest.fixture(scope="module")
def evaluator(tmp_path_factory) -> Evaluator:
    path = tmp_path_factory.mktemp("tier") / "chat.parquet"
    write_trace(synthesize("chat", requests=400, rate=12.0, seed=3), path)
    hw, mdl = load_hardware("h100-node"), load_model("Llama-3.1-8B")
    base = replace(policy_from_dict({"hardware": "h100-node", "model": "Llama-3.1-8B"}, "t"))
    return Evaluator(Scenario(read_trace(path), hw, mdl, replace(base, slo=SLO_), slo=SLO_))


def fewest(evaluator: Evaluator, values: dict, most: int) -> int:
    """The fewest instances meeting the SLO, by trying every count."""
    return next(
        n
        for n in range(1, most + 1)
        if evaluator.evaluate({**values, "serving.instances": n}).feasible
    )


def test_sweep_counts_instances_of_the_policys_own_tp(evaluator) -> None:
    # 8 GPUs hold 4 instances of tp=2: the sweep bisects over those (the simulator would clamp
    # a larger count to them), and the answer's GPUs are instances x tp
    values = {**HBM, "serving.tp": 2}
    got = sweep_instances(evaluator, values, 8, "x", 1)
    assert got is not None
    n = fewest(evaluator, values, 4)
    assert got.gpus == 2 * n
    ev = evaluator.evaluate({**values, "serving.instances": n})
    assert got.cost_per_mtok == ev.cost_per_mtok


def test_an_hbm_only_winner_is_also_tried_with_each_tier_on_fewer_instances(evaluator) -> None:
    winner_values = {**HBM, "serving.instances": 8}
    ev = evaluator.evaluate(winner_values)
    assert ev.feasible
    winner = TrialSummary(
        number=0,
        params=winner_values,
        policy=policy_to_dict(ev.policy),
        metrics=ev.metrics.to_dict(),
        violations=ev.violations,
        feasible=True,
        rate_scale=ev.rate_scale,
    )
    tiered, hbm = compare_tiering(
        evaluator, [winner], winner, 8, 1, hardware_has_tiers=True, tier_additions=[DRAM]
    )
    assert tiered is not None and tiered.label == "trial 0 with dram"
    values = with_tier_values(winner_values, DRAM)
    n = fewest(evaluator, values, 8)
    assert (tiered.gpus, tiered.tiers) == (n, {"dram": 64.0})
    assert (
        tiered.cost_per_mtok == evaluator.evaluate({**values, "serving.instances": n}).cost_per_mtok
    )
    # and the HBM-only answer is the winner on its fewest instances
    assert hbm is not None and hbm.gpus == fewest(evaluator, winner_values, 8)
    # without additions an HBM-only study has no tiered answer
    assert compare_tiering(evaluator, [winner], winner, 8, 1, hardware_has_tiers=True)[0] is None


def test_the_sentence_counts_one_gpu_in_the_singular() -> None:
    tiered = Choice("t", 0.0218, 7.03, 4, {"ssd": 1260.0}, 1.29, {})
    hbm = Choice("h", 0.0253, 8.15, 5, {}, 1.28, {})
    assert tiering_sentence(tiered, hbm) == (
        "Tiering (ssd 1,260 GB) meets the SLO with 1 fewer GPU (4 instead of 5) and costs 14% "
        "less per token than HBM alone ($0.0218 vs $0.0253 per 1M tokens)."
    )


def test_the_tiering_sentence_names_a_preset_that_beat_the_search_of_its_kind() -> None:
    """A preset of either kind meeting the SLO for less than the search's policy of that kind
    is named, and "HBM alone" is then the searched policy, so the sentence never contradicts
    the presets' rows."""
    tiered = SimpleNamespace(cost_per_mtok=0.0255, gpus=5, tiers={"dram": 94.1})
    hbm = SimpleNamespace(cost_per_mtok=0.0354, gpus=7, tiers={})
    presets = [("vllm-hbm", 0.0253, False), ("mooncake-rdma", 0.0261, True)]
    text = tiering_sentence(tiered, hbm, presets)
    assert "than the searched HBM-only policy" in text and "HBM alone" not in text
    assert "The preset vllm-hbm (HBM only) met it for less, $0.0253" in text
    assert "1% less than the best tiered policy found" in text
    assert "mooncake-rdma" not in text  # dearer than the search's tiered policy
    cheap_tier = [("lmcache-cpu", 0.0200, True)]
    text = tiering_sentence(tiered, hbm, cheap_tier)
    assert "than HBM alone" in text
    assert "The preset lmcache-cpu (tiered) met it for less, $0.0200" in text
    assert "44% less than the best HBM-only policy found" in text
