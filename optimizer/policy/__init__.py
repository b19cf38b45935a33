"""Policy files: the ``Policy`` dataclass, its TOML loader, dict conversion and presets.

``LOWER_TIERS`` (the tiers below HBM, in lookup order) and ``TIER_NAMES`` are defined once,
in ``kvtier.policy.model``; import them from there or from here. The names load on first
use, so that importing one module of the package (the registries, which plug-ins import while
the tier kinds load) does not import the rest.
"""

from __future__ import annotations

from kvtier.lazy import lazy_getattr

_WHERE = {
    "LOWER_TIERS": "kvtier.policy.model",
    "POLICY_FORMAT": "kvtier.policy.model",
    "ROUTERS": "kvtier.policy.model",
    "SLO": "kvtier.policy.model",
    "TIER_NAMES": "kvtier.policy.model",
    "Policy": "kvtier.policy.model",
    "ServingPolicy": "kvtier.policy.model",
    "TierPolicy": "kvtier.policy.model",
    "load_policy": "kvtier.policy.model",
    "policy_from_dict": "kvtier.policy.model",
    "policy_to_dict": "kvtier.policy.model",
    "load_preset": "kvtier.policy.presets",
    "preset_names": "kvtier.policy.presets",
    "preset_path": "kvtier.policy.presets",
}

__all__ = sorted(_WHERE)


__getattr__ = lazy_getattr(__name__, _WHERE)
