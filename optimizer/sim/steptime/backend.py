"""Choose a scenario's step-time backend and pack its parameters (docs/model.md, "Step time").

``serving.step_time``: ``measured`` (tables from aiconfigurator-core's operator database; an
error names what is missing when no data covers the scenario), ``roofline`` (the analytic
fallback), or ``auto`` (measured where the data covers the GPU, model, framework, tp and
dtypes, else the roofline).
"""

from __future__ import annotations

import functools

import numpy as np

from kvtier.errors import InputError
from kvtier.hardware.aic import fp8_weights, weight_type
from kvtier.hardware.types import Hardware, ModelProfile
from kvtier.policy.model import Policy
from kvtier.sim.steptime.attention_backend import triton_ratio, with_triton_attention
from kvtier.sim.steptime.calibrated import at_cluster_scale
from kvtier.sim.steptime.frontend import frontend_s, frontend_token_s
from kvtier.sim.steptime.measured import (
    AIC_SYSTEMS,
    NVLINK_SIBLING,
    measured_key,
    measured_tables,
)
from kvtier.sim.steptime.pack import pack_measured, roofline_params
from kvtier.sim.steptime.sustained import at_power_limit, ridge_tokens, scale_for

ACT_BYTES = 2.0  # BF16 activations: the all-reduce message is hidden * 2 bytes per token
ALLREDUCES_PER_LAYER = 2  # after attention and after the MLP (Megatron-style TP)
MOE_TABLE_MAX = 65536  # distinct-expert fraction tabulated to this many tokens (then ~1)


def allreduce_s_per_token(tp: int, model: ModelProfile, bw: float) -> float:
    """Seconds of tensor-parallel all-reduce per batch token at ``bw`` bytes/s per direction:
    a ring all-reduce sends and receives ``2 (tp - 1) / tp`` of each ``hidden * 2`` byte
    message, ``ALLREDUCES_PER_LAYER`` per layer."""
    n_ar = ALLREDUCES_PER_LAYER * model.layers
    return n_ar * 2.0 * (tp - 1) / tp * model.hidden_size * ACT_BYTES / bw


@functools.cache
def _sibling_nvlink_bw(profile: str) -> float:
    """The NVLink bandwidth of a built-in GPU profile (read once per process)."""
    from kvtier.hardware import load_gpu

    return load_gpu(profile).nvlink_bw


def nvlink_extra_s_per_token(hardware: Hardware, model: ModelProfile) -> float:
    """What a GPU whose measured tables are a sibling's with faster NVLink (A800 reads the
    A100's, H800 the H100's) spends more on all-reduce per batch token than the tables hold:
    the ring all-reduce at its own NVLink less the same at the sibling's (0 at tp 1, or for a
    GPU measured as itself)."""
    tp = hardware.topology.tp
    sibling = NVLINK_SIBLING.get(hardware.gpu.name)
    if tp <= 1 or sibling is None or not hardware.gpu.nvlink_bw:
        return 0.0
    fast = _sibling_nvlink_bw(sibling[1])
    own = hardware.gpu.nvlink_bw
    if own >= fast:
        return 0.0
    return allreduce_s_per_token(tp, model, own) - allreduce_s_per_token(tp, model, fast)


def _peak(hardware: Hardware, model: ModelProfile) -> float:
    """FP8 weights run FP8 GEMMs where the GPU has them; others the BF16 peak."""
    if fp8_weights(model) and hardware.gpu.fp8_flops > 0:
        return hardware.gpu.fp8_flops
    return hardware.gpu.peak_flops


def roofline_timing(
    hardware: Hardware, model: ModelProfile, policy: Policy, kvb: float
) -> np.ndarray:
    """The improved roofline: separate prefill / decode MFU, FP8 peak, a TP all-reduce term and
    MoE weights read as the distinct experts a batch touches (docs/model.md); the framework's
    front-end costs per request and per prompt token (:mod:`kvtier.sim.steptime.frontend`;
    none per token for clients that send token ids), kept by the measured backend too."""
    tp = hardware.topology.tp
    eff = hardware.efficiency
    peak = _peak(hardware, model)
    ar_token = ar_fixed = 0.0
    if tp > 1:
        bw = hardware.gpu.nvlink_bw or hardware.gpu.pcie_bw
        lat = hardware.gpu.nvlink_latency_s
        # ring all-reduce: each GPU sends and receives 2 (tp - 1) / tp of the message
        ar_token = allreduce_s_per_token(tp, model, bw)
        ar_fixed = ALLREDUCES_PER_LAYER * model.layers * lat
    expert_bytes = 0.0
    frac = None
    dense_bytes = model.weight_bytes
    if model.moe is not None:
        expert_bytes = model.moe.expert_params * model.weight_dtype_bytes
        dense_bytes = model.weight_bytes - expert_bytes
        n = min(policy.serving.max_num_batched_tokens, MOE_TABLE_MAX) + 1
        miss = 1.0 - model.moe.active / model.moe.experts  # a token skips a given expert
        frac = 1.0 - miss ** np.arange(n, dtype=np.float64)
    if hardware.weights_in_hbf:
        # weights read from HBF: their bytes weighed by HBM's rate over HBF's, so the mem_rate
        # term reads them at the HBF's rate, after the KV (not overlapped: an assumption)
        slower = hardware.gpu.hbm_bw / hardware.gpu.hbf_bw
        dense_bytes, expert_bytes = dense_bytes * slower, expert_bytes * slower
    return roofline_params(
        flops_per_token=2.0 * model.active_params,
        # sliding-window layers attend to at most their window (128 tokens for gpt-oss): a
        # term linear in the tokens, under 1 % of a full layer's at a 16K context, left out
        attn_coef=2.0 * model.full_attention_layers * model.attention_heads * model.head_dim,
        prefill_rate=tp * peak * eff.mfu,
        decode_rate=tp * peak * (eff.decode_mfu or eff.mfu),
        weight_bytes=dense_bytes,
        kv_bytes_per_token=kvb,
        mem_rate=tp * hardware.gpu.hbm_bw * eff.mbu,
        step_overhead_s=eff.step_overhead_s + policy.serving.cpu_overhead_s,
        ar_s_per_token=ar_token,
        ar_fixed_s=ar_fixed,
        expert_bytes=expert_bytes,
        moe_fraction=frac,
        frontend_s=frontend_s(policy.serving.framework),
        frontend_token_s=(
            0.0 if policy.serving.token_ids_io else frontend_token_s(policy.serving.framework)
        ),
    )


def _missing(hardware: Hardware, model: ModelProfile, policy: Policy) -> str | None:
    """Why no measured data can cover the scenario (None: try it)."""
    if hardware.gpu.name not in AIC_SYSTEMS:
        return f"GPU {hardware.gpu.name!r} (measured: {', '.join(sorted(AIC_SYSTEMS))})"
    if not model.hf_id:
        return f"model {model.name!r} has no hf_id (the database's model id)"
    if policy.kv_dtype not in ("bf16", "fp8"):
        return f"kv_dtype {policy.kv_dtype!r} (measured: bf16, fp8)"
    return None


def step_timing(
    hardware: Hardware, model: ModelProfile, policy: Policy, kvb: float
) -> tuple[np.ndarray, str, str]:
    """(packed array, backend name, provenance) for a deployed hardware and model."""
    base = roofline_timing(hardware, model, policy, kvb)
    choice = policy.serving.step_time
    # the roofline has no kernel choice: its attention runs at the GPU's efficiency either way
    unmodelled = (
        f"; serving.attention_backend {policy.serving.attention_backend} not modelled there"
        if policy.serving.attention_backend != "default"
        else ""
    )
    if choice == "roofline":
        return base, "roofline", f"roofline (kvtier{unmodelled})"
    why = _missing(hardware, model, policy)
    if why is None and hardware.weights_in_hbf:
        why = "weights in HBF (measured tables read them from HBM)"
    if why is not None:
        if choice == "measured":
            raise InputError(f"no measured step-time data for {why}", option="serving.step_time")
        return base, "roofline", f"roofline (kvtier; no measured data for {why}{unmodelled})"
    try:
        key = measured_key(
            model.hf_id,
            hardware.gpu.name,
            policy.serving.framework,
            policy.serving.framework_version,
            hardware.topology.tp,
            weight_type(model),
            policy.kv_dtype,
        )
        tables = measured_tables(key)
    except InputError as err:
        if choice == "measured":
            raise
        return base, "roofline", f"roofline (kvtier; {err.message})"
    provenance = (
        f"measured (aiconfigurator-core {key.package}, {key.system} {key.framework} "
        f"{key.version}, tp={key.tp}, weights {key.weight_dtype}, kv {key.kv_dtype})"
    )
    # SGLang's Triton kernels where the tables measured its default (docs/model.md,
    # "Attention back end")
    if policy.serving.attention_backend == "triton":
        ratio = triton_ratio(
            key.system, model.head_dim, policy.kv_dtype, model.attention_heads / model.kv_heads
        )
        tables = with_triton_attention(tables, ratio)
        provenance += f", prefill attention x Triton's measured ratio ({ratio.source})"
    # the tables' short bursts ran at full clocks; a serving engine's compute-bound kernels run
    # at the board's power limit (docs/model.md, "Compute at the power limit")
    gpu = hardware.gpu
    ridge = functools.partial(
        ridge_tokens, _peak(hardware, model), model.weight_dtype_bytes, gpu.hbm_bw
    )
    gemm_scale, attn_scale = scale_for(gpu, key.weight_dtype), scale_for(gpu, policy.kv_dtype)
    if gemm_scale > 1.0 or attn_scale > 1.0:
        tables = at_power_limit(tables, gemm_scale, attn_scale, ridge())
        provenance += (
            f", compute-bound GEMMs x{gemm_scale:g} and prefill attention x{attn_scale:g} at the"
            " power limit"
        )
    # a profile calibrated on its own cluster (kvtier calibrate --backend measured)
    eff = hardware.efficiency
    memory, compute = eff.measured_memory_scale, eff.measured_compute_scale
    if memory != 1.0 or compute != 1.0:
        tables = at_cluster_scale(tables, memory, compute, ridge())
        provenance += f", calibrated x{memory:g} memory-bound and x{compute:g} compute-bound work"
    # a GPU read from a sibling's tables pays its own, slower NVLink on every batch token
    extra = nvlink_extra_s_per_token(hardware, model)
    if extra > 0:
        provenance += f", + {extra * 1e6:.2f} us per token of all-reduce at the {gpu.name}'s NVLink"
    # the measured operator times carry the GPU work; the scheduler's own per-step CPU time is
    # not in them: only the framework's, when the scenario states it (docs/model.md)
    overhead = policy.serving.cpu_overhead_s
    return pack_measured(base, tables, overhead, extra), "measured", provenance
