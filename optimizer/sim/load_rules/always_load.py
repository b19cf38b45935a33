"""``always_load``: every lower-tier hit is loaded."""

from __future__ import annotations

from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)


def choose(lower: Any, inst: int, now: float, src: list[int], hbm_hits: int, B: int) -> int:
    return len(src)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def choose_nb(sim, k, now, n_src, hbm_hits, timing):  # noqa: ANN001, ANN201
    return n_src
