"""Registries of the serving plug-ins a policy names: routers, write policies, load rules.

The policy loader takes its choices from here, ``kvtier.sim.config`` and ``kvtier.sim.tiers``
their integer codes, the serving kernels (``kvtier.sim.nb``, ``kvtier.sim.reference``) branch
on the code constants below, and the docs tables are printed from the same entries. Eviction
policies have their own registry beside the cache engine (``kvtier.cache.registry``) and are
re-exported here so a policy's every plug-in kind can be found in one module.
"""

from __future__ import annotations

from kvtier.cache.registry import EVICTIONS
from kvtier.registry import Entry, Registry

# ---- routers (ServingPolicy.routing): codes the serving kernels branch on ----------------------
ROUND_ROBIN, LEAST_LOADED, PREFIX_AFFINITY = 0, 1, 2
ROUTERS = Registry(
    "router",
    [
        Entry("round_robin", ROUND_ROBIN, "requests go to the instances in turn"),
        Entry(
            "least_loaded",
            LEAST_LOADED,
            "the instance with the fewest waiting plus running requests (lower index on ties)",
        ),
        Entry(
            "prefix_affinity",
            PREFIX_AFFINITY,
            "the instance with the most HBM-resident prefix blocks among those whose load is "
            "at most the least load plus serving.affinity_overload",
        ),
    ],
)

# ---- write policies (Policy.write_policy): how computed blocks reach the lower tiers -----------
WRITE_THROUGH, WRITE_BACK, WRITE_SELECTIVE = 0, 1, 2
WRITE_POLICIES = Registry(
    "write policy",
    [
        Entry(
            "write_through",
            WRITE_THROUGH,
            "newly computed blocks are copied into every lower tier (only the first if exclusive)",
        ),
        Entry(
            "write_back",
            WRITE_BACK,
            "a block is copied into the next tier down when the tier above evicts it",
        ),
        Entry(
            "write_through_selective",
            WRITE_SELECTIVE,
            "write_through, only for blocks sighted at least selective_k times (SGLang HiCache)",
        ),
    ],
)

# ---- load rules (Policy.load_rule): when a lower-tier hit is loaded instead of recomputed -----
ALWAYS_LOAD, COST_AWARE = 0, 1
LOAD_RULES = Registry(
    "load rule",
    [
        Entry("always_load", ALWAYS_LOAD, "every lower-tier hit is loaded"),
        Entry(
            "cost_aware",
            COST_AWARE,
            "a lower-tier hit is loaded only when loading it is faster than recomputing it",
        ),
    ],
)

__all__ = [
    "ALWAYS_LOAD",
    "COST_AWARE",
    "EVICTIONS",
    "LEAST_LOADED",
    "LOAD_RULES",
    "PREFIX_AFFINITY",
    "ROUND_ROBIN",
    "ROUTERS",
    "WRITE_BACK",
    "WRITE_POLICIES",
    "WRITE_SELECTIVE",
    "WRITE_THROUGH",
]
