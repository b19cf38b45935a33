"""Policy files: the ``Policy`` dataclass, its TOML loader, dict conversion and presets.

``LOWER_TIERS`` (the tiers below HBM, in lookup order) and ``TIER_NAMES`` are defined once,
in ``kvtier.policy.model``; import them from there or from here.
"""

from __future__ import annotations

from kvtier.policy.model import (
    LOWER_TIERS,
    POLICY_FORMAT,
    ROUTERS,
    SLO,
    TIER_NAMES,
    Policy,
    ServingPolicy,
    TierPolicy,
    load_policy,
    policy_from_dict,
    policy_to_dict,
)
from kvtier.policy.presets import load_preset, preset_names, preset_path

__all__ = [
    "LOWER_TIERS",
    "POLICY_FORMAT",
    "ROUTERS",
    "TIER_NAMES",
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
