"""The measurement window of a replay or a miss-ratio curve: which requests count.

Apart from :mod:`kvtier.cache.trace_replay` (which re-exports it) because that module imports
every cache kernel, and the one-pass LRU curve needs none of them.
"""

from __future__ import annotations

import math

from kvtier.errors import InputError


def warmup_start(n_requests: int, warmup: float) -> int:
    """Index of the first measured request: ``floor(warmup * n_requests)``."""
    if not (isinstance(warmup, int | float) and math.isfinite(warmup) and 0.0 <= warmup < 1.0):
        raise InputError(f"warmup must be a fraction in [0, 1), but got {warmup!r}")
    return int(math.floor(warmup * n_requests))
