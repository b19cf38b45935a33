"""``write_back``: nothing is copied when computed; a block goes down when the tier above
evicts it (the registry's ``cascade`` trait)."""

from __future__ import annotations

from typing import Any

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)


def chosen(lower: Any, blocks: list[int]) -> list[int]:
    return []


@njit(cache=True, nogil=True, _nrt=False, inline="always")
def chosen_nb(ts, tp, buf, nbuf):  # noqa: ANN001, ANN201
    return 0
