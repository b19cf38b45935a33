"""``least_loaded``: the instance with the fewest waiting plus running requests (lower index on
ties)."""

from __future__ import annotations

from typing import TYPE_CHECKING

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_state import Sim
from kvtier.sim.routers.base_nb import n_routed_nb

if TYPE_CHECKING:
    from kvtier.sim.routers import RouteView


def route(view: RouteView, req: object) -> int:
    loads = [inst.load for inst in view.routed]
    return loads.index(min(loads))


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def route_nb(sim: Sim, i: int) -> int:
    ist = sim.ist
    prm = sim.prm
    q_len = ist.q_len
    n_running = ist.n_running
    k = 0
    best_load = q_len[0] + n_running[0]
    for kk in range(1, n_routed_nb(prm)):
        ld = q_len[kk] + n_running[kk]
        if ld < best_load:
            best_load = ld
            k = kk
    return k
