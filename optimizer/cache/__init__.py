"""The cache engine: eviction policies over dense block ids, one-pass miss-ratio curves.

Public API:

- :class:`TierState` - one tier (capacity in blocks + policy) as preallocated arrays, with the
  primitives ``contains`` / ``access`` (reports the evicted block) / ``remove``, and
  ``arrays()`` (a :class:`~kvtier.cache.nb_state.TierArrays`) for kernels in
  :mod:`kvtier.cache.nb`.
- :func:`replay` - replay a ``BlockedTrace`` (prefix or flat semantics, warm-up) ->
  :class:`ReplayResult` with per-request hit blocks.
- :func:`parse_policy` / :class:`PolicySpec` - ``"s3fifo(small=0.1,ghost=0.9,threshold=2)"``.
- :func:`miss_ratio_curve` - exact one-pass LRU curve (stack distances) or replay sweeps.
- :mod:`kvtier.cache.reference` - the plain-Python specification.
"""

from __future__ import annotations

from kvtier.lazy import lazy_getattr

# Public name -> defining module. Imported on first attribute access (PEP 562), so that
# ``kvtier.cache.registry`` (policy names for the CLI and the policy loader) does not import
# numba through this package's kernels.
_EXPORTS = {
    "MrcPoint": "kvtier.cache.curve",
    "MrcResult": "kvtier.cache.curve",
    "default_capacities": "kvtier.cache.curve",
    "miss_ratio_curve": "kvtier.cache.curve",
    "PolicySpec": "kvtier.cache.policies",
    "parse_policy": "kvtier.cache.policies",
    "policy_names": "kvtier.cache.policies",
    "ReplayResult": "kvtier.cache.trace_replay",
    "replay": "kvtier.cache.trace_replay",
    "warmup_start": "kvtier.cache.warmup",
    "TierState": "kvtier.cache.state",
}

__all__ = sorted(_EXPORTS)


__getattr__ = lazy_getattr(__name__, _EXPORTS)
