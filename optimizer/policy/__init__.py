"""Policy files: the ``Policy`` dataclass and its TOML loader."""

from __future__ import annotations

from optimizer.policy.model import (
    POLICY_FORMAT,
    ROUTERS,
    SLO,
    Policy,
    ServingPolicy,
    TierPolicy,
    load_policy,
)

__all__ = [
    "POLICY_FORMAT",
    "ROUTERS",
    "SLO",
    "Policy",
    "ServingPolicy",
    "TierPolicy",
    "load_policy",
]
