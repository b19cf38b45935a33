"""The deployment a spatial sample replays on: :mod:`kvtier.trace.sample_correction`'s rules
applied to a policy on hardware."""

from __future__ import annotations

from dataclasses import replace

from kvtier.hardware.types import GB, Hardware
from kvtier.policy.model import Policy
from kvtier.policy.registries import ROUTERS
from kvtier.trace import sample_correction as rules


def cluster_shared_tiers(policy: Policy, hardware: Hardware) -> list[str]:
    """The lower tiers of ``policy`` that the whole cluster shares (CXL, RDMA pools)."""
    return [
        t.name
        for t in policy.tiers
        if t.name != "hbm" and t.name in hardware.tiers and not hardware.tiers[t.name].per_host
    ]


def content_blind(policy: Policy) -> bool:
    """Whether ``policy``'s router places a request without looking at its blocks (the
    router registry's ``content_blind`` trait)."""
    return bool(ROUTERS[policy.serving.routing].traits.get("content_blind", False))


def fan_out_applies(policy: Policy, hardware: Hardware) -> bool:
    """Whether a sample's replay of ``policy`` restores the full cluster's routing fan-out
    (:func:`kvtier.trace.sample_correction.fan_out_applies`)."""
    return rules.fan_out_applies(content_blind(policy), cluster_shared_tiers(policy, hardware))


def sample_bias(policy: Policy, hardware: Hardware, fraction: float) -> str | None:
    """Which way a ``fraction`` sample's hit ratios are biased under ``policy``, or None
    (:func:`kvtier.trace.sample_correction.sample_bias`)."""
    if fraction == 1.0:
        return None
    shared = cluster_shared_tiers(policy, hardware)
    return rules.sample_bias(policy.serving.routing, content_blind(policy), shared, fraction)


def scaled_for_sample(
    policy: Policy, hardware: Hardware, fraction: float
) -> tuple[Policy, Hardware]:
    """The deployment a spatial sample (``kvtier trace sample``) of ``fraction`` replays on.

    The sample holds about ``fraction`` of the sessions and of the load, so the cluster keeps
    its per-instance load and cache pressure only if it shrinks by the same fraction: the
    instance count is multiplied by it (it must come out whole,
    :func:`kvtier.trace.sample_correction.sample_instances`), and each shared pool (CXL, RDMA)
    keeps ``fraction`` of its capacity and of its pool link's bandwidth. Per-host tiers (DRAM,
    SSD) keep :func:`kvtier.trace.sample_correction.host_share` of their size, and so do the
    host's ports to them when the host's instances share them (``attach = "host"``). The
    policy a user sees and stores stays the full deployment's.
    """
    topo = hardware.topology
    full = policy.serving.instances if policy.serving.instances is not None else topo.max_instances
    instances = rules.sample_instances(full, fraction)
    per_host = max(topo.gpus_per_host // (policy.serving.tp or topo.tp), 1)
    host_share = rules.host_share(full, instances, per_host, fraction)
    tiers = []
    scaled_hw = dict(hardware.tiers)
    for tier in policy.tiers:
        hw_tier = hardware.tiers.get(tier.name)
        if tier.name == "hbm" or hw_tier is None:
            tiers.append(tier)
            continue
        capacity = (
            tier.capacity_gb if tier.capacity_gb is not None else (hw_tier.capacity_bytes / GB)
        )
        if not hw_tier.per_host:
            tier = replace(tier, capacity_gb=capacity * fraction)
            scaled_hw[tier.name] = replace(hw_tier, pool_bw=hw_tier.pool_bw * fraction)
        elif abs(host_share - 1) > 1e-9:
            tier = replace(tier, capacity_gb=capacity * host_share)
            if hw_tier.attach == "host":  # shared by the host's instances (not one per GPU)
                scaled_hw[tier.name] = replace(
                    hw_tier,
                    port_read_bw=hw_tier.port_read_bw * host_share,
                    port_write_bw=hw_tier.port_write_bw * host_share,
                )
        tiers.append(tier)
    run_policy = replace(
        policy, serving=replace(policy.serving, instances=instances), tiers=tuple(tiers)
    )
    return run_policy, replace(hardware, tiers=scaled_hw)
