"""The cache engine: eviction policies over dense block ids, one-pass miss-ratio curves.

Public API:

- :class:`TierState` - one tier (capacity in blocks + policy) as preallocated arrays, with the
  primitives ``contains`` / ``access`` (reports the evicted block) / ``remove``, and
  ``arrays()`` for kernels in :mod:`kvtier.cache.nb`.
- :func:`replay` - replay a ``BlockedTrace`` (prefix or flat semantics, warm-up) ->
  :class:`ReplayResult` with per-request hit blocks.
- :func:`parse_policy` / :class:`PolicySpec` - ``"s3fifo(small=0.1,ghost=0.9,threshold=2)"``.
- :func:`miss_ratio_curve` - exact one-pass LRU curve (stack distances) or replay sweeps.
- :mod:`kvtier.cache.reference` - the plain-Python specification.
"""

from __future__ import annotations

from kvtier.cache.mrc import MrcPoint, MrcResult, default_capacities, miss_ratio_curve
from kvtier.cache.policies import PolicySpec, parse_policy, policy_names
from kvtier.cache.replay import ReplayResult, replay, warmup_start
from kvtier.cache.state import TierState

__all__ = [
    "MrcPoint",
    "MrcResult",
    "PolicySpec",
    "ReplayResult",
    "TierState",
    "default_capacities",
    "miss_ratio_curve",
    "parse_policy",
    "policy_names",
    "replay",
    "warmup_start",
]
