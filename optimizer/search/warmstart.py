"""Warm start: enqueue trials at the knees of the trace's LRU miss-ratio curve, and at the
presets that met the SLO.

A cache much smaller than a curve's knee wastes its hits; one much larger buys little. So the
first trials try each tier capacity of the space at the capacities where the exact one-pass
LRU curve (``kvtier.cache``) bends: the point farthest from the chord of the curve on a
log-capacity axis (the "Kneedle" rule of Satopaa et al., 2011), and where the curve reaches
90% and 99% of the hit ratio an unbounded cache gets.

The shipped presets are replayed on the same trace before the search
(:func:`kvtier.search.run.compare_baselines`); each that met the SLO is enqueued too, at its
fewest instances and as far as the space can state it (:func:`preset_trials`), so the search
starts from the known systems that work and its winner is not beaten by a point of the space
it never tried.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from kvtier.hardware.types import ModelProfile
from kvtier.policy.model import Policy
from kvtier.search.space import Param, SearchSpace, condition_holds
from kvtier.trace.blocked import BlockedTrace

GB = 1e9


def curve_knees(capacities: np.ndarray, hit_ratio: np.ndarray) -> list[int]:
    """Capacities (blocks) at the curve's knee and at 90% / 99% of its final hit ratio."""
    caps = np.asarray(capacities, dtype=np.float64)
    hits = np.asarray(hit_ratio, dtype=np.float64)
    if len(caps) < 3 or hits[-1] <= 0:
        return []
    x = (np.log(caps) - np.log(caps[0])) / max(np.log(caps[-1]) - np.log(caps[0]), 1e-12)
    y = (hits - hits[0]) / max(hits[-1] - hits[0], 1e-12)
    knees = {int(caps[int(np.argmax(y - x))])}
    for share in (0.9, 0.99):
        knees.add(int(caps[int(np.argmax(hits >= share * hits[-1]))]))
    return sorted(knees)


def knee_capacities_gb(
    blocked: BlockedTrace, model: ModelProfile, kv_dtype: str = "bf16", points: int = 40
) -> list[float]:
    """The knees of ``blocked``'s LRU curve (prefix semantics) in GB of KV."""
    from kvtier.cache import default_capacities, miss_ratio_curve
    from kvtier.cache.curve import working_set_blocks

    working = working_set_blocks(blocked)
    if working < 3:
        return []
    curve = miss_ratio_curve(blocked, "lru", default_capacities(working, points))
    caps = np.array([p.capacity_blocks for p in curve.points])
    ratio = np.array([p.hit_ratio_tokens for p in curve.points])
    block_bytes = blocked.block_tokens * model.kv_bytes_per_token(kv_dtype)
    return [c * block_bytes / GB for c in curve_knees(caps, ratio)]


def _clip(param: Param, value: float) -> float | int:
    v = min(max(value, float(param.low)), float(param.high))  # type: ignore[arg-type]
    return int(round(v)) if param.integer else v


def _capacity_params(space: SearchSpace) -> list[Param]:
    """The free capacity parameters of lower tiers that the space can switch on."""
    free_names = {p.name for p in space.free()}

    def reachable(p: Param) -> bool:
        # its conditions can hold: each is on a free parameter, or pinned to the needed value
        return all(k in free_names or condition_holds(space.pinned.get(k), v) for k, v in p.when)

    return [
        p
        for p in space.free()
        if p.name.endswith(".capacity_gb")
        and p.choices is None
        and reachable(p)
        and space.pinned.get(p.name.rsplit(".", 1)[0] + ".enabled", True) is not False
    ]


def tier_additions(space: SearchSpace, knees_gb: list[float]) -> list[dict[str, Any]]:
    """For each lower tier the space can switch on: the values that add it at the largest knee.

    Each dict switches the tier on, sizes it at ``max(knees_gb)`` (clipped to the space's
    range) and gives every other parameter that becomes active with it its first choice (its
    eviction: the space lists LRU first), so that it completes an HBM-only trial's values
    (:func:`kvtier.search.tiering.with_tier_values`).
    """
    if not knees_gb:
        return []
    free = space.free()
    free_names = {p.name for p in free}
    out = []
    for param in _capacity_params(space):
        enabled = param.name.rsplit(".", 1)[0] + ".enabled"
        values: dict[str, Any] = {param.name: _clip(param, max(knees_gb))}
        if enabled in free_names:
            values[enabled] = True
        values.update({k: v for k, v in param.when if k in free_names})
        for other in free:
            if (
                other.name not in values
                and other.choices is not None
                and other.when
                and all(values.get(k) == v for k, v in other.when)
            ):
                values[other.name] = other.choices[0]
        out.append(values)
    return out


def warm_start_trials(
    space: SearchSpace, blocked: BlockedTrace, model: ModelProfile, policy: Policy
) -> list[dict[str, Any]]:
    """Parameter sets to enqueue: each free capacity parameter at each knee, tier switched on."""
    free_names = {p.name for p in space.free()}
    capacity_params = _capacity_params(space)
    if not capacity_params:
        return []
    knees = knee_capacities_gb(blocked, model, policy.kv_dtype)
    trials = []
    for param in capacity_params:
        enabled = param.name.rsplit(".", 1)[0] + ".enabled"
        for gb in knees:
            values: dict[str, Any] = {param.name: _clip(param, gb)}
            if enabled in free_names:
                values[enabled] = True
            values.update(
                {k: v[0] if isinstance(v, tuple) else v for k, v in param.when if k in free_names}
            )
            trials.append(values)
    return trials


def policy_value(policy: Policy, name: str) -> Any:
    """The value a search parameter ``name`` (a dotted path, :mod:`kvtier.search.overlay`) has
    in ``policy``; None where the policy leaves it unset or has no such tier."""
    parts = name.split(".")
    if parts[0] == "tiers" and len(parts) == 3:
        tier = policy.tier(parts[1])
        if parts[2] == "enabled":
            return tier is not None
        return None if tier is None else getattr(tier, parts[2], None)
    if parts[0] == "serving" and len(parts) == 2:
        if parts[1] == "prefill_share" and policy.serving.prefill_instances:
            return None  # a fixed count of prefill instances is not a share of the instances
        return getattr(policy.serving, parts[1], None)
    return getattr(policy, name, None) if len(parts) == 1 else None


def preset_trials(
    space: SearchSpace, presets: list[Policy], default_tp: int
) -> list[dict[str, Any]]:
    """Parameter sets to enqueue, one per preset (each at the instances it ran on): every free
    parameter whose condition holds takes the preset's value where the space's domain has it
    (an unset ``serving.tp`` is the hardware's ``default_tp``); the sampler picks the rest."""
    out: list[dict[str, Any]] = []
    for policy in presets:
        values: dict[str, Any] = dict(space.pinned)
        for param in space.free():
            if not param.active(values):
                continue
            value = policy_value(policy, param.name)
            if value is None and param.name == "serving.tp":
                value = default_tp
            if value is None or (param.step is not None and param.choices is None):
                continue  # unset, or a stepped range the value may not sit on
            try:
                param.check(value)
            except ValueError:
                continue
            values[param.name] = value
        chosen = {k: v for k, v in values.items() if k not in space.pinned}
        if chosen and chosen not in out:
            out.append(chosen)
    return out
