"""``round_robin``: requests go to the instances in turn."""

from __future__ import annotations

from typing import TYPE_CHECKING

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_state import C_RR, Sim
from kvtier.sim.routers.base_nb import n_routed_nb

if TYPE_CHECKING:
    from kvtier.sim.routers import RouteView


def route(view: RouteView, req: object) -> int:
    k = view.turn % view.n_route
    view.turn += 1
    return k


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def route_nb(sim: Sim, i: int) -> int:
    prm = sim.prm
    ty = sim.ty
    ints = ty.ints
    k = ints[C_RR] % n_routed_nb(prm)
    ints[C_RR] += 1
    return k
