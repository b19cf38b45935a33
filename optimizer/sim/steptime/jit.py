"""The step-time functions of :mod:`kvtier.sim.timing`, compiled for the numba kernels.

numba resolves a function's globals when it compiles it, so each function of ``timing`` is
rebuilt over a copy of the module's globals in which the helpers it calls are already the
compiled ones (in dependency order). The source, and so every operation, stays the one the
reference runs as Python: both engines give bit-identical step times.

The kernels of ``kvtier.sim.nb`` inline these functions; :mod:`kvtier.jitcache` drops their
cache when ``timing.py`` (or any other source they compile) changes.
"""

from __future__ import annotations

import types

from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.sim import timing
from kvtier.sim.nb_state import INNER

_ORDER = (
    "_cell",
    "_interp2",
    "_offsets",
    "_grid_cell",
    "prefill_attn_s",
    "prefill_attn_ns",
    "prefill_out_of_range",
    "_non_attention_s",
    "_decode_attn_s",
    "step_extrapolated",
    "_weights_read",
    "step_time",
    "prefill_seconds",
)


def _compile() -> dict[str, object]:
    scope = dict(vars(timing))
    out: dict[str, object] = {}
    for name in _ORDER:
        f = getattr(timing, name)
        copy = types.FunctionType(f.__code__, scope, name, f.__defaults__, f.__closure__)
        copy.__qualname__ = f.__qualname__
        copy.__module__ = f.__module__
        out[name] = njit(cache=True, nogil=True, **INNER)(copy)
        scope[name] = out[name]
    return out


_JIT = _compile()
step_time_nb = _JIT["step_time"]
prefill_attn_ns_nb = _JIT["prefill_attn_ns"]
prefill_out_of_range_nb = _JIT["prefill_out_of_range"]
step_extrapolated_nb = _JIT["step_extrapolated"]
prefill_seconds_nb = _JIT["prefill_seconds"]
