"""Trial parameters as an overlay on a policy dict.

A search parameter's name is a dotted path into the policy file: ``block_tokens``,
``serving.routing``, ``tiers.cxl.capacity_gb``. In ``tiers.NAME.FIELD`` the middle part names
a tier of the ``[[tiers]]`` list (not an index), and ``tiers.NAME.enabled = false`` removes
that tier, so a space can switch tiers on and off.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any

from kvtier.errors import InputError
from kvtier.policy.model import Policy, policy_from_dict, policy_to_dict


def _tier(data: dict[str, Any], name: str) -> dict[str, Any]:
    tiers = data.setdefault("tiers", [{"name": "hbm"}])
    for tier in tiers:
        if tier.get("name") == name:
            return tier
    tier = {"name": name}
    tiers.append(tier)
    return tier


def overlay(base: Mapping[str, Any], values: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the policy dict ``base`` with ``values`` set at their dotted paths."""
    data = copy.deepcopy(dict(base))
    disabled: set[str] = set()
    for name, value in values.items():
        parts = name.split(".")
        if parts[0] == "tiers":
            if len(parts) != 3:
                raise InputError(
                    f"tier parameters are named tiers.TIER.FIELD, got {name!r}", column=name
                )
            if parts[2] == "enabled":
                if not value:
                    disabled.add(parts[1])
                else:
                    _tier(data, parts[1])
                continue
            _tier(data, parts[1])[parts[2]] = value
            continue
        node = data
        for part in parts[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise InputError(f"{part!r} is not a section of the policy", column=name)
            node = child
        node[parts[-1]] = value
    if disabled:
        if "hbm" in disabled:
            raise InputError("the hbm tier cannot be disabled", column="tiers.hbm.enabled")
        data["tiers"] = [t for t in data.get("tiers", []) if t.get("name") not in disabled]
    return data


def apply(base: Policy, values: Mapping[str, Any], source: str = "<trial>") -> Policy:
    """The policy ``base`` with trial ``values`` applied, validated like a policy file."""
    return policy_from_dict(overlay(policy_to_dict(base), values), source)
