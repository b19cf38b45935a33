"""Policy files: the ``Policy`` dataclass, its TOML loader, dict conversion and presets."""

from __future__ import annotations

from kvtier.policy.model import (
    POLICY_FORMAT,
    ROUTERS,
    SLO,
    Policy,
    ServingPolicy,
    TierPolicy,
    load_policy,
    policy_from_dict,
    policy_to_dict,
)
from kvtier.policy.presets import load_preset, preset_names, preset_path

__all__ = [
    "POLICY_FORMAT",
    "ROUTERS",
    "SLO",
    "Policy",
    "ServingPolicy",
    "TierPolicy",
    "load_policy",
    "load_preset",
    "policy_from_dict",
    "policy_to_dict",
    "preset_names",
    "preset_path",
]
