"""Routers: which instance an arriving request joins, one module each.

A router module holds its two twins side by side, with the same rule in the same float
operations:

* ``route(view, req) -> int``: the reference step, a plain function over :class:`RouteView`
  (the reference engine's instances and the replay-wide values a router reads);
* ``route_nb(i, rq, ist, pool, ts, tp, prm, ty, buf) -> int``: its numba twin over the kernel's
  named tuples (:mod:`kvtier.sim.nb_state`), called through the dispatch that
  ``python -m kvtier.sim.gen`` writes from the registry (:mod:`kvtier.sim.routers.dispatch`).

Its name, code, help and traits (``content_blind``: the choice never reads the cache, so a
sample's replay may restore the full cluster's fan-out) are one entry of
:data:`kvtier.policy.registries.ROUTERS`, whose ``impl`` names the module. The router chooses
among the prefill instances of a disaggregated deployment, else among all
(:func:`n_routed`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np

    from kvtier.sim.config import SimConfig


@dataclass
class RouteView:
    """What a reference router reads: the instances (each with ``load``, ``pool.lookup`` and
    ``active_blocks``), the routed count, the configuration, whether the HBM prefix cache is
    on, the lower tiers (or None), the kv_aware weights, the round-robin turn and, for
    ``llmd_epp``, when each instance last took a request no instance had cached and the EPP's
    indexes of where it sent prompts, when it reads them (the values a router changes)."""

    instances: list[Any]
    n_route: int
    cfg: SimConfig
    prefix: bool
    lower: Any
    route_w: np.ndarray
    turn: int = 0
    cold_stamp: list[int] = field(default_factory=list)
    epp_index: Any = None  # llmd_epp: the EPP's approximate indexes (routers.epp_index.EppIndex)
    # llmd_epp: the instances' last steps' metrics (routers.epp_metrics; None: exact state)
    epp_metrics: Any = None

    @property
    def routed(self) -> list[Any]:
        return self.instances[: self.n_route]


def n_routed(n_prefill: int, n_instances: int) -> int:
    """The instances a router chooses among: the prefill pool when disaggregated, else all."""
    return n_prefill if n_prefill > 0 else n_instances
