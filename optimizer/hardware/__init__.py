"""Model, GPU and hardware profiles (TOML in package data) as frozen dataclasses."""

from __future__ import annotations

from kvtier.hardware.loader import builtin_names, load_gpu, load_hardware, load_model
from kvtier.hardware.types import (
    GB,
    KV_DTYPE_BYTES,
    MLA,
    Efficiency,
    GPUProfile,
    Hardware,
    ModelProfile,
    Topology,
)

__all__ = [
    "GB",
    "KV_DTYPE_BYTES",
    "MLA",
    "Efficiency",
    "GPUProfile",
    "Hardware",
    "ModelProfile",
    "Topology",
    "builtin_names",
    "load_gpu",
    "load_hardware",
    "load_model",
]
