"""How the replay of a spatial sample (``kvtier trace sample``) is corrected toward the full
trace's, as rules on plain values.

A sample of ``F`` of the roots replays on a cluster shrunk by ``F`` (:func:`sample_instances`,
:func:`host_share`), with the routing fan-out of the full cluster restored under a router
blind to content (:func:`fan_out_applies`, :mod:`kvtier.trace.fanout`), its latencies
post-stratified by prompt length (:func:`sample_weighting`, :mod:`kvtier.trace.strata`), and
a warning where the validation (docs/traces.md, "How faithful a sample's replay is") found
its hit ratios biased (:func:`sample_bias`). :mod:`kvtier.deploy.sample` applies these rules
to a policy on hardware.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

from kvtier.errors import InputError
from kvtier.trace.format import META_SAMPLE_FRACTION, Trace


def fan_out_applies(content_blind: bool, cluster_shared: Sequence[str]) -> bool:
    """Whether a sample's replay renames root-private blocks per request colour
    (:mod:`kvtier.trace.fanout`): under a router blind to content (it places a request without
    looking at its blocks: the router registry's ``content_blind`` trait; a content-affine one
    sends a turn to its prefix) and with no tier shared by the whole cluster
    (``cluster_shared`` empty: no CXL or RDMA pool), where a turn finds its prefix whichever
    instance it lands on, so colours would hide reuse the full cluster has."""
    return content_blind and not cluster_shared


def sample_bias(
    routing: str, content_blind: bool, cluster_shared: Sequence[str], fraction: float
) -> str | None:
    """One line saying which way a ``fraction`` sample's hit ratios are biased under
    ``routing`` (``content_blind`` or not) with the lower tiers ``cluster_shared`` shared by
    the whole cluster, or None where the validation (docs/traces.md, "How faithful a sample's
    replay is") found them within its target."""
    if fraction == 1.0:
        return None
    if content_blind and cluster_shared:
        shared = "/".join(cluster_shared)
        return (
            f"a {fraction:g} sample under {routing} with the cluster-shared "
            f"{shared} tier: its HBM hit ratio is biased high and the "
            f"{shared} hit ratio low (docs/traces.md, sampling)"
        )
    if not content_blind:
        return (
            f"a {fraction:g} sample under {routing}: its hit ratios are biased high against the "
            "full trace's, content-affine routing concentrating less (docs/traces.md, sampling)"
        )
    return None


def sample_weighting(trace: Trace) -> str | None:
    """One line saying how a replay of ``trace`` weights its latencies: post-stratified by
    prompt length when it is a sample with strata (:mod:`kvtier.trace.strata`), else None."""
    strata = trace.sample_strata
    return None if strata is None else strata.describe()


def sample_instance_step(fraction: float) -> int:
    """The smallest instance count a ``fraction`` sample scales to a whole number of instances
    (10 for 0.1 and 0.3, 4 for 0.25): every full deployment it replays must be a multiple."""
    from fractions import Fraction

    return Fraction(fraction).limit_denominator(1_000_000).denominator


def sample_instances(full: int, fraction: float) -> int:
    """The instance count a ``fraction`` sample of a trace served by ``full`` instances replays
    on: ``full x fraction``, which must come out whole (an :class:`InputError` naming the
    multiple to use otherwise)."""
    scaled = full * fraction
    instances = round(scaled)
    if instances < 1 or abs(scaled - instances) > 1e-6 * max(1.0, scaled):
        raise InputError(
            f"the trace is a {fraction:g} sample ({META_SAMPLE_FRACTION}), so the {full} "
            f"instances of the policy must shrink to {scaled:g}, which is not a whole number; "
            f"set serving.instances to a multiple of {sample_instance_step(fraction)} (policy "
            "file, --set or --pin) or sample another fraction"
        )
    return instances


def host_share(full: int, instances: int, per_host: int, fraction: float) -> float:
    """The share of each per-host pool (and of a host's ports to it) a sample's hosts keep.

    Per-host tiers (DRAM, SSD) shrink with the hosts, but the sample's ``instances`` may fill
    fewer hosts than ``fraction`` of the ``full`` deployment's (4 of 40 instances on 8-GPU
    hosts: half a host, yet one whole host's DRAM), ``per_host`` instances to a host: each
    per-host pool then keeps ``fraction x full hosts / hosts used`` of its size, so that the
    sample's per-host tiers hold ``fraction`` of the full deployment's in all.
    """
    return fraction * math.ceil(full / per_host) / math.ceil(instances / per_host)
