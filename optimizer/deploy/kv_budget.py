"""The HBM an instance gives its KV cache, as its serving engine sizes it at start-up.

Every engine sizes its KV budget once, at start-up, per GPU: it loads the weights, runs one
step of its largest batch to see what else it needs (activations, the runtime, communication
buffers) and gives the KV cache a share of what is left (docs/model.md, "The KV budget"):

- vLLM (``gpu_worker.determine_available_memory``) and SGLang take ``gpu_memory_utilization``
  (``mem_fraction_static``) of the memory the CUDA runtime reports, less all that is not KV;
- TensorRT-LLM takes ``free_gpu_memory_fraction`` (0.9) of the memory left free after it.

:meth:`kvtier.hardware.types.Hardware.kv_capacity_bytes` does that arithmetic; this module
supplies what is not KV besides the weights. For a GPU, model and framework that NVIDIA's
aiconfigurator-core covers, it is that package's memory model (``aiconfigurator_core.sdk.memory``:
activations at the engine's token budget, its runtime's fixed overhead and the NCCL buffers of
its tensor-parallel size); else the hardware profile's ``activation_reserve_gb``. The weights
are kvtier's own (the model profile at the deployment's element type), which each profile
sources as the engines load them.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import lru_cache
from typing import TYPE_CHECKING

from kvtier.hardware.aic import weight_type
from kvtier.hardware.types import GIB

if TYPE_CHECKING:
    from kvtier.hardware.types import Hardware, ModelProfile
    from kvtier.policy.model import Policy


@dataclass(frozen=True)
class KVBudget:
    """One instance's KV bytes, what each GPU holds besides weights and KV, and its source."""

    kv_bytes: float
    non_kv_per_gpu: float
    source: str


def kv_budget(hardware: Hardware, model: ModelProfile, policy: Policy, tp: int) -> KVBudget:
    """The KV budget of an instance of ``tp`` GPUs of ``hardware`` serving ``model`` as
    ``policy``'s framework sizes it (``hardware`` and ``model`` as deployed:
    :func:`kvtier.deploy.apply.apply_deployment`)."""
    serving = policy.serving
    estimate = aic_non_kv_bytes(
        model.hf_id,
        hardware.gpu.name,
        serving.framework,
        serving.framework_version,
        tp,
        weight_type(model),
        policy.kv_dtype,
        serving.max_num_batched_tokens,
        serving.max_num_seqs,
    )
    if estimate is None:
        non_kv = hardware.activation_reserve_bytes
        origin = f"{hardware.name}'s activation_reserve_gb"
    else:
        non_kv, origin = estimate
    kv = hardware.kv_capacity_bytes(model, tp, framework=serving.framework, non_kv_bytes=non_kv)
    hbm = hardware.gpu.engine_hbm_bytes / GIB
    if serving.framework == "trtllm":
        rule = f"{hardware.free_gpu_memory_fraction:g} of what weights and the rest leave free"
    else:
        rule = f"{hardware.gpu_memory_utilization:g} of it less weights and the rest"
    source = (
        f"{kv / 1e9:,.1f} GB per instance of tp={tp}: {hbm:.2f} GiB per GPU, {rule} "
        f"({non_kv / GIB:.2f} GiB per GPU besides weights and KV: {origin})"
    )
    return KVBudget(kv, non_kv, source)


@lru_cache(maxsize=256)
def aic_non_kv_bytes(
    hf_id: str,
    gpu_name: str,
    framework: str,
    version: str,
    tp: int,
    weight_dtype: str,
    kv_dtype: str,
    max_num_tokens: int,
    max_num_seqs: int,
) -> tuple[float, str] | None:
    """Per GPU, what aiconfigurator-core's memory model says an engine holds besides weights
    and KV (activations at ``max_num_tokens``, runtime, NCCL), with its provenance; None
    where the package does not cover the GPU, model, framework or version."""
    from kvtier.hardware.aic import AIC_SYSTEMS, aic_version, quant_mode, quiet_aic

    system = AIC_SYSTEMS.get(gpu_name)
    if system is None or not hf_id or kv_dtype not in ("bf16", "fp16", "fp8"):
        return None
    quiet_aic()
    try:
        package = aic_version()
        from aiconfigurator_core.sdk import perf_database
        from aiconfigurator_core.sdk.memory import KVCacheEstimator

        literal = perf_database.resolve_query_version(system, framework, version)
        if literal is None:
            return None
        breakdown = KVCacheEstimator.from_request(
            hf_id,
            system,
            framework,
            str(literal),
            max_num_tokens=int(max_num_tokens),
            max_batch_size=int(max_num_seqs),
            tp_size=int(tp),
            moe_tp_size=int(tp),  # vLLM's default: experts sharded by tensor parallelism
            gemm_quant_mode=quant_mode(weight_dtype),
            kvcache_quant_mode=quant_mode(kv_dtype),
        ).breakdown
    except Exception as err:  # noqa: BLE001 - the package raises many kinds for what it lacks
        logging.getLogger(__name__).debug("aiconfigurator-core memory model: %s", err)
        return None
    non_kv = (
        float(breakdown["activations_bytes"])
        + float(breakdown["runtime_overhead_bytes"])
        + float(breakdown["comm_overhead_bytes"])
    )
    return non_kv, f"aiconfigurator-core {package}'s memory model, {system} {framework} {literal}"
