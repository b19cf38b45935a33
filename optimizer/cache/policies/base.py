"""What every eviction policy module provides, and the parts most of them share.

A policy module (``kvtier.cache.policies.<name>``, registered in ``kvtier.cache.registry``)
supplies, over one tier's state ``tier`` (a :class:`kvtier.cache.nb_state.TierArrays`: every
hook of every policy takes the same bundle and reads the fields it needs by name):

* numba hooks ``hit_nb(tier, b)``, ``admit_nb(tier, b) -> flag`` (-1: the block may not
  enter; otherwise a flag handed to insert), ``insert_nb(tier, b, flag) -> inserted``,
  ``evict_nb(tier) -> victim`` and ``remove_nb(tier, b)``, dispatched on the policy's code by
  ``kvtier.cache.hooks`` (generated from the registry);
* constants ``ADMIT_FIRST``, ``REMOVE_ABSENT``, ``USES_HEAP``, ``USES_COST``;
* ``check(params)`` and ``configure(meta, params, capacity)`` for its parameters;
* ``Reference``: the plain-Python specification the numba hooks must match
  (``kvtier.cache.reference``).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.cache.nb_state import TierArrays


@njit(cache=True, nogil=True, _nrt=False)
def admit_nb(tier: TierArrays, b: int) -> int:
    """Every missed block may be inserted (flag 0)."""
    return 0


def check(params: Mapping[str, float]) -> None:
    """A policy without parameters accepts any (there are none to check)."""


def configure(meta: np.ndarray, params: Mapping[str, float], capacity: int) -> None:
    """A policy without parameters keeps nothing in ``meta``."""


class ReferenceBase:
    """Defaults of the reference side: every missed block may enter (flag 0)."""

    clock = 0  # the tier's access count, set by RefTier before each access

    def __init__(self, params: Mapping[str, float], capacity: int, cost: Any) -> None:
        self.params = params

    def admit(self, b: int) -> int:
        return 0
