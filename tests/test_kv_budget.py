"""Each engine's KV budget as its framework sizes it (docs/model.md, "The KV budget"), and the
scheduler a framework runs when the policy names none."""

from __future__ import annotations

import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from kvtier.deploy.apply import apply_deployment
from kvtier.deploy.kv_budget import aic_non_kv_bytes, kv_budget
from kvtier.export.common import deployment
from kvtier.hardware import load_hardware, load_model
from kvtier.policy.model import Policy, ServingPolicy, TierPolicy
from kvtier.policy.registries import SCHEDULERS
from kvtier.sim.config import build_config

GIB = 2**30


def _aic_breakdown(hf_id: str, framework: str, tp: int, quant: str | None, tokens: int) -> float:
    """What aiconfigurator-core's estimator holds per GPU besides weights and KV."""
    logging.getLogger("aiconfigurator_core").setLevel(logging.ERROR)
    from aiconfigurator_core.sdk import perf_database
    from aiconfigurator_core.sdk.memory import KVCacheEstimator

    version = perf_database.resolve_query_version("h100_sxm", framework, "current")
    b = KVCacheEstimator.from_request(
        hf_id,
        "h100_sxm",
        framework,
        str(version),
        max_num_tokens=tokens,
        max_batch_size=1024,
        tp_size=tp,
        moe_tp_size=tp,
        gemm_quant_mode=quant,
        kvcache_quant_mode=quant,
    ).breakdown
    return b["activations_bytes"] + b["runtime_overhead_bytes"] + b["comm_overhead_bytes"]


def test_vllm_budget_is_its_share_of_the_runtime_memory_less_weights_and_the_rest() -> None:
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
    budget = kv_budget(hw, model, Policy(), 1)
    rest = _aic_breakdown(model.hf_id, "vllm", 1, None, 8192)
    assert budget.non_kv_per_gpu == pytest.approx(rest)
    assert 3 * GIB < rest < 5 * GIB  # vLLM's own log: 3.05 GiB (docs/sources.md)
    assert budget.kv_bytes == pytest.approx(0.9 * 79.22 * GIB - model.weight_bytes - rest)
    assert "aiconfigurator-core" in budget.source and "0.9 of it" in budget.source


def test_trtllm_budget_is_its_share_of_what_weights_and_the_rest_leave_free() -> None:
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-70b")
    serving = ServingPolicy(framework="trtllm", tp=2, weight_dtype="fp8")
    policy = Policy(serving=serving, kv_dtype="fp8")
    hw, model = apply_deployment(hw, model, policy)
    budget = kv_budget(hw, model, policy, 2)
    rest = _aic_breakdown(model.hf_id, "trtllm", 2, "fp8", 8192)
    free = 79.22 * GIB - model.weight_bytes / 2 - rest
    assert budget.kv_bytes == pytest.approx(2 * 0.9 * free)
    vllm = Policy(serving=ServingPolicy(framework="vllm", tp=2, weight_dtype="fp8"), kv_dtype="fp8")
    # 0.9 of what is free leaves more than 0.9 of the whole less the rest
    assert budget.kv_bytes > kv_budget(hw, model, vllm, 2).kv_bytes


def test_without_the_package_s_model_the_profile_reserve_stands_in() -> None:
    hw = load_hardware("beluga-testbed")  # H20: no aiconfigurator-core system
    model = load_model("Qwen3-32B")
    budget = kv_budget(hw, model, Policy(), hw.topology.tp)
    assert budget.non_kv_per_gpu == hw.activation_reserve_bytes
    assert budget.kv_bytes == hw.kv_capacity_bytes(model)
    assert "activation_reserve_gb" in budget.source
    assert aic_non_kv_bytes("", "H100-SXM", "vllm", "current", 1, "bf16", "bf16", 8192, 8) is None


@settings(max_examples=12, deadline=None)
@given(st.sampled_from([2048, 4096, 8192, 16384, 32768]), st.sampled_from([2048, 8192, 32768]))
def test_a_larger_token_budget_leaves_no_more_room_for_kv(a: int, b: int) -> None:
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
    small, large = sorted((a, b))

    def room(tokens: int) -> float:
        return kv_budget(hw, model, Policy(serving=ServingPolicy(max_num_batched_tokens=tokens)), 1)

    assert room(large).kv_bytes <= room(small).kv_bytes


def test_the_replay_and_the_export_size_the_same_budget_and_say_where_it_came_from() -> None:
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
    policy = Policy(serving=ServingPolicy(tp=1, framework="trtllm"))
    cfg = build_config(hw, model, policy)
    exported = deployment(policy, hw, model).hbm_kv_bytes
    block = policy.kv_bytes_per_block(model)
    assert cfg.capacity_blocks == int(exported // block)
    assert cfg.hbm_provenance.startswith(f"{exported / 1e9:,.1f} GB per instance of tp=1")
    pinned = Policy(serving=policy.serving, tiers=(TierPolicy(capacity_gb=40.0),))
    assert build_config(hw, model, pinned).hbm_provenance == "tiers.hbm.capacity_gb"


def test_each_framework_runs_its_own_scheduler_unless_the_policy_names_one() -> None:
    hw, model = load_hardware("h100-node"), load_model("llama-3.1-8b")
    trt = ServingPolicy(tp=1, framework="trtllm")
    assert trt.engine_scheduler == "reserve"
    assert ServingPolicy(tp=1).engine_scheduler == "vllm_v1"
    assert ServingPolicy(tp=1, framework="sglang").engine_scheduler == "vllm_v1"
    assert ServingPolicy(tp=1, framework="trtllm", scheduler="vllm_v1").engine_scheduler == (
        "vllm_v1"
    )
    cfg = build_config(hw, model, Policy(serving=trt))
    assert cfg.scheduler == SCHEDULERS.codes["reserve"]
    assert cfg.watermark_blocks == 0  # GUARANTEED_NO_EVICT reserves instead of a watermark
