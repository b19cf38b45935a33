"""``write_through_selective``: write-through for blocks sighted at least ``selective_k`` times
at admission (SGLang HiCache); an HBM hit reaching that count is copied then (the registry's
``sightings`` trait)."""

from __future__ import annotations

from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)


def chosen(lower: Any, blocks: list[int]) -> list[int]:
    return [b for b in blocks if lower.sightings[b] >= lower.cfg.selective_k]


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def chosen_nb(ts, tp, buf, nbuf):  # noqa: ANN001, ANN201
    n = 0
    for x in range(nbuf):
        if ts.sightings[buf[x]] >= tp.selective_k:
            buf[n] = buf[x]
            n += 1
    return n
