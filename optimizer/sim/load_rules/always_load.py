"""``always_load``: every lower-tier hit is loaded."""

from __future__ import annotations

from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)


def choose(lower: Any, inst: int, now: float, src: list[int], hbm_hits: int, B: int) -> int:
    return len(src)


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def choose_nb(tp, lk, k, now, src, n_src, hbm_hits, B, counts, timing, path):  # noqa: ANN001, ANN201
    return n_src
