"""Where kvtier meets NVIDIA's aiconfigurator-core: which of the package's systems a GPU
profile is, and the package's installed version.

Both the measured step times (:mod:`kvtier.sim.steptime.measured`) and the engines' KV budget
(:mod:`kvtier.deploy.kv_budget`, the package's memory model) read the package; this module is
what they share, below both.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from kvtier.errors import InputError

if TYPE_CHECKING:
    from kvtier.hardware.types import ModelProfile

# the aiconfigurator-core release the tables were built and checked with (pyproject pins it)
AIC_VERSION_PIN = "0.12.0"

# kvtier GPU profile name -> aiconfigurator system name
AIC_SYSTEMS: dict[str, str] = {
    "H100-SXM": "h100_sxm",
    "H200": "h200_sxm",
    "B200": "b200_sxm",
    "L40S": "l40s",
    "A100-SXM": "a100_sxm",
}
# GPUs aiconfigurator-core has no system for, read from a sibling's tables whose NVLink is
# faster: GPU name -> (the sibling's GPU name, its built-in profile). The tables' all-reduce ran
# at the sibling's NVLink; the step time adds the difference per batch token
# (backend.nvlink_extra_s_per_token; docs/model.md, "The measured backend"). A800: A100
# compute and HBM, NVLink cut to 400 GB/s ([NVIDIA-A800]); H800: the same of the H100
# ([NVIDIA-H800]).
NVLINK_SIBLING: dict[str, tuple[str, str]] = {
    "A800-SXM": ("A100-SXM", "a100-sxm"),
    # (the 40 GB A100: the same NVLink, its HBM 1,555 GB/s against the tables' 2,039)
    "A100-SXM-40GB": ("A100-SXM", "a100-sxm"),
    "H800-SXM": ("H100-SXM", "h100-sxm"),
}
AIC_SYSTEMS.update({gpu: AIC_SYSTEMS[name] for gpu, (name, _) in NVLINK_SIBLING.items()})


def aic_version() -> str:
    """The installed aiconfigurator-core's version; a one-line error when it is missing."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("aiconfigurator-core")
    except PackageNotFoundError:
        raise InputError(
            "the measured step-time backend needs aiconfigurator-core "
            f"(pip install aiconfigurator-core=={AIC_VERSION_PIN}); or pass --set "
            "serving.step_time=roofline"
        ) from None


def quiet_aic() -> None:
    """Silence the package's loggers: it logs a line per fallback table it loads, and a
    replay's output stays clean."""
    for name in ("aiconfigurator_core", "aiconfigurator"):
        logging.getLogger(name).setLevel(logging.ERROR)


def fp8_weights(model: ModelProfile) -> bool:
    """One-byte weights (FP8). Sub-byte checkpoints (gpt-oss's MXFP4 experts: 0.56 bytes per
    parameter in all) are dequantised to BF16 inside the GEMM on GPUs without FP4 tensor
    cores (vLLM's w4a16 MoE kernels on H100), so they run at the BF16 peak."""
    return 0.75 < model.weight_dtype_bytes <= 1.0


def weight_type(model: ModelProfile) -> str:
    """The package's weight type for ``model`` as deployed: FP8, BF16, or for a sub-byte
    checkpoint its own (native) quantisation, which the package reads from the model's config
    (gpt-oss: MXFP4 experts, w4a16_mxfp4 MoE tables)."""
    if fp8_weights(model):
        return "fp8"
    return "native" if model.weight_dtype_bytes < 1.0 else "bf16"


def quant_mode(dtype: str) -> str | None:
    """The package's quantisation mode for a kvtier element type: ``fp8``, else none (the
    model's own)."""
    return "fp8" if dtype == "fp8" else None
