"""The step-time functions of :mod:`kvtier.sim.timing`, compiled for the numba kernels.

numba resolves a function's globals when it compiles it, so each function of ``timing`` is
rebuilt over a copy of the module's globals in which the helpers it calls are already the
compiled ones (in dependency order). The source, and so every operation, stays the one the
reference runs as Python: both engines give bit-identical step times.

numba stamps a cached kernel with the hash of its own source file only, so a kernel of
``kvtier.sim.nb`` compiled with these functions inlined would be loaded unchanged after
``timing.py`` changed, and run the old step time. :func:`_refresh_dependants` keeps a hash of
``timing.py`` and this file beside those kernels' cache and drops their cache indexes when it
differs, so they are recompiled.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import types
from pathlib import Path

from numba import njit

from kvtier.sim import timing

# the modules whose kernels call (and so embed) the compiled step-time functions
DEPENDANTS = ("nb", "nb_tiers")

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
        out[name] = njit(cache=True, nogil=True)(copy)
        scope[name] = out[name]
    return out


def _cache_dirs(py_file: Path) -> list[Path]:
    """Where numba may keep the cache of ``py_file``'s kernels: the ``__pycache__`` beside it,
    and NUMBA_CACHE_DIR's subfolder for it when that is set."""
    from numba.core import config

    dirs = [py_file.parent / "__pycache__"]
    if config.CACHE_DIR:
        # numba's own mapping of a source path into the cache directory (internal: guarded)
        with contextlib.suppress(Exception):
            from numba.core.caching import _CacheLocator

            sub = _CacheLocator.get_suitable_cache_subpath(str(py_file))
            dirs.append(Path(config.CACHE_DIR) / sub)
    return dirs


def _refresh_dependants() -> None:
    """Drop the cache indexes of :data:`DEPENDANTS`' kernels compiled against another
    ``timing.py`` (see the module docstring)."""
    here = Path(__file__)
    stamp = hashlib.sha256(Path(timing.__file__).read_bytes() + here.read_bytes()).hexdigest()
    sim = Path(timing.__file__).parent
    for d in {p for name in DEPENDANTS for p in _cache_dirs(sim / f"{name}.py")}:
        mark = d / "kvtier-steptime.stamp"
        try:
            if not d.is_dir() or (mark.is_file() and mark.read_text() == stamp):
                continue
            for name in DEPENDANTS:
                for index in d.glob(f"{name}.*.nbi"):
                    index.unlink(missing_ok=True)
            tmp = d / f".kvtier-steptime.{os.getpid()}"
            tmp.write_text(stamp)
            tmp.replace(mark)
        except OSError:
            continue  # a read-only cache: numba cannot write there either


_refresh_dependants()
_JIT = _compile()
step_time_nb = _JIT["step_time"]
prefill_attn_ns_nb = _JIT["prefill_attn_ns"]
prefill_out_of_range_nb = _JIT["prefill_out_of_range"]
step_extrapolated_nb = _JIT["step_extrapolated"]
prefill_seconds_nb = _JIT["prefill_seconds"]
