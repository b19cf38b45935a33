"""Trial parameters as an overlay on a policy dict.

A search parameter's name is a dotted path into the policy file: ``block_tokens``,
``serving.routing``, ``tiers.cxl.capacity_gb``. In ``tiers.NAME.FIELD`` the middle part names
a tier of the ``[[tiers]]`` list (not an index), and ``tiers.NAME.enabled = false`` removes
that tier, so a space can switch tiers on and off. The overlay itself is the policy's
(``kvtier.policy.overrides``), shared with ``--set``; this module applies a trial's values.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from kvtier.policy.model import Policy, policy_from_dict, policy_to_dict
from kvtier.policy.overrides import overlay

__all__ = ["apply", "overlay"]


def apply(base: Policy, values: Mapping[str, Any], source: str = "<trial>") -> Policy:
    """The policy ``base`` with trial ``values`` applied, validated like a policy file."""
    return policy_from_dict(overlay(policy_to_dict(base), values), source)
