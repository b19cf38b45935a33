"""Helpers the routers' numba twins share."""

from __future__ import annotations

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim.nb_state import Params


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def n_routed_nb(prm: Params) -> int:
    """:func:`kvtier.sim.routers.n_routed` of the kernel's parameters."""
    return prm.n_prefill if prm.n_prefill > 0 else prm.n_instances
