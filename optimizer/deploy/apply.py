"""A hardware and model profile as a policy deploys them (``serving.tp``, ``serving.weight_dtype``).

The simulator (:func:`kvtier.sim.config.build_config`) and the exporters
(:func:`kvtier.export.common.deployment`) both start from this, so a policy's tensor
parallelism and weight type mean the same in a replay and in the launch scripts.
"""

from __future__ import annotations

from dataclasses import replace
from typing import TYPE_CHECKING

from kvtier.errors import InputError
from kvtier.hardware.types import GPUProfile, Hardware, ModelProfile

if TYPE_CHECKING:
    from kvtier.policy.model import Policy


def apply_deployment(
    hardware: Hardware, model: ModelProfile, policy: Policy
) -> tuple[Hardware, ModelProfile]:
    """The hardware and model as ``serving.tp`` and ``serving.weight_dtype`` deploy them: the
    topology cut into instances of ``tp`` GPUs, the weights at the chosen element type."""
    serving = policy.serving
    topo = hardware.topology
    if serving.tp is not None and serving.tp != topo.tp:
        if topo.gpus % serving.tp:
            raise InputError(
                f"{topo.gpus} GPUs of {hardware.name!r} do not split into instances of "
                f"tp={serving.tp}",
                option="serving.tp",
            )
        hardware = replace(hardware, topology=replace(topo, tp=serving.tp))
    if serving.weight_dtype is not None:
        if serving.weight_dtype == "fp8" and hardware.gpu.fp8_flops <= 0:
            raise InputError(
                f"GPU {hardware.gpu.name!r} has no FP8 compute (choices: bf16)",
                option="serving.weight_dtype",
            )
        wbytes = 1.0 if serving.weight_dtype == "fp8" else 2.0
        model = replace(model, weight_dtype_bytes=wbytes)
    if serving.weights_in_hbf:
        check_hbf(hardware.gpu, model, hardware.topology.tp)
        hardware = replace(hardware, weights_in_hbf=True)
    return hardware, model


def check_hbf(gpu: GPUProfile, model: ModelProfile, tp: int) -> None:
    """Raise InputError unless ``tp`` GPUs of ``gpu`` hold ``model``'s weights in HBF."""
    if gpu.hbf_bytes <= 0:
        raise InputError(
            f"GPU {gpu.name!r} has no HBF (a GPU profile with hbf_gb and hbf_bw_gbps)",
            option="serving.weights_in_hbf",
        )
    if model.weight_bytes > tp * gpu.hbf_bytes:
        raise InputError(
            f"{model.weight_bytes / 1e9:.0f} GB of weights do not fit {tp} x "
            f"{gpu.hbf_bytes / 1e9:g} GB of HBF on {gpu.name!r}",
            option="serving.weights_in_hbf",
        )
