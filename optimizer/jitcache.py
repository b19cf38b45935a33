"""numba's on-disk kernel cache, kept in step with every source a kernel compiles.

numba stamps a cached kernel with the modification time and size of its own source file only.
A kernel inlines functions and constants of other modules (the cache engine's policy hooks in
the tier kernel, the transfer and step-time formulas, the registries' integer codes), so after
one of those changed, numba would load the old machine code and run the old rule, in a working
checkout and after an in-place upgrade alike.

:func:`refresh` runs once per process, at the first import of a kernel module (each of
:data:`KERNEL_MODULES` imports this module before it defines a kernel). For each kernel module
it finds the kvtier modules the module imports, transitively (by reading their ``import``
statements), hashes their sources, and drops the module's cache indexes (``*.nbi``) when the
hash differs from the one recorded beside them; numba then recompiles those kernels. The
record also keeps each file's modification time and size, so an unchanged tree costs one
``stat`` per file. Commands that never import a kernel never run any of this.
"""

from __future__ import annotations

import ast
import contextlib
import hashlib
import json
import os
from pathlib import Path

PACKAGE = "kvtier"
ROOT = Path(__file__).resolve().parent

# every module of the package that defines a numba kernel with ``cache=True`` (checked against
# the source tree by tests/test_jitcache.py)
KERNEL_MODULES = (
    "cache/heap.py",
    "cache/hooks.py",
    "cache/kernels.py",
    "cache/lists.py",
    "cache/mrc.py",
    "cache/nb.py",
    "cache/policies/base.py",
    "cache/policies/fifo.py",
    "cache/policies/gdsf.py",
    "cache/policies/lfu.py",
    "cache/policies/lru.py",
    "cache/policies/s3fifo.py",
    "cache/policies/sieve.py",
    "cache/ring.py",
    "sim/fault_step.py",
    "sim/nb.py",
    "sim/nb_hbm.py",
    "sim/nb_loading.py",
    "sim/nb_prefetch.py",
    "sim/nb_tbt.py",
    "sim/nb_tiers.py",
    "sim/load_rules/always_load.py",
    "sim/load_rules/cost_aware.py",
    "sim/load_rules/dispatch.py",
    "sim/routers/base_nb.py",
    "sim/routers/dispatch.py",
    "sim/routers/epp_index.py",
    "sim/routers/epp_metrics.py",
    "sim/routers/kv_aware.py",
    "sim/routers/least_loaded.py",
    "sim/routers/llmd_epp.py",
    "sim/routers/prefix_affinity.py",
    "sim/routers/round_robin.py",
    "sim/steptime/jit.py",
    "sim/write_policies/dispatch.py",
    "sim/write_policies/write_back.py",
    "sim/write_policies/write_through.py",
    "sim/write_policies/write_through_selective.py",
    "trace/blocks_nb.py",
    "trace/crossbatch.py",
    "trace/hashing.py",
    "trace/idtable.py",
    "trace/shared.py",
    "trace/stats_stream.py",
    "trace/synth/content.py",
)

STAMP_SUFFIX = ".kvtier-sources.json"

_done = False


def _module_file(name: str) -> Path | None:
    """The source file of kvtier module ``name`` (``kvtier.sim.nb``), or None."""
    parts = name.split(".")
    if parts[0] != PACKAGE:
        return None
    base = ROOT.joinpath(*parts[1:])
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.is_file():
            return candidate
    return None


def _imports(path: Path) -> set[Path]:
    """The kvtier source files whose names ``path`` imports, read from its import statements
    wherever they are (imports inside functions count too). ``from kvtier.a import b`` reads
    ``a/b.py`` when ``b`` is a module, else ``a/__init__.py`` (where ``b`` is defined); a
    package's ``__init__`` that is only passed through is not followed, as its contents do not
    reach the kernel."""
    try:
        tree = ast.parse(path.read_bytes(), filename=str(path))
    except (OSError, SyntaxError, ValueError):
        return set()
    found: set[Path] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                f = _module_file(alias.name)
                if f is not None:
                    found.add(f)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            for alias in node.names:
                f = _module_file(f"{node.module}.{alias.name}")
                if f is None:
                    f = _module_file(node.module)
                if f is not None:
                    found.add(f)
    return found


def sources_of(module: Path) -> list[Path]:
    """``module`` and every kvtier source file it imports, transitively, sorted."""
    seen = {module}
    todo = [module]
    while todo:
        for f in _imports(todo.pop()):
            if f not in seen:
                seen.add(f)
                todo.append(f)
    return sorted(seen)


def _stats(files: list[Path]) -> dict[str, list[int]]:
    out: dict[str, list[int]] = {}
    for f in files:
        with contextlib.suppress(OSError):
            st = f.stat()
            out[str(f)] = [st.st_mtime_ns, st.st_size]
    return out


def _digest(files: list[Path]) -> str:
    h = hashlib.sha256()
    for f in files:
        h.update(str(f.relative_to(ROOT)).encode())
        with contextlib.suppress(OSError):
            h.update(f.read_bytes())
    return h.hexdigest()


def cache_dirs(py_file: Path) -> list[Path]:
    """Where numba may keep the cache of ``py_file``'s kernels: the ``__pycache__`` beside it,
    and NUMBA_CACHE_DIR's subfolder for it when that is set."""
    dirs = [py_file.parent / "__pycache__"]
    cache_dir = os.environ.get("NUMBA_CACHE_DIR")
    if cache_dir:
        # numba's own mapping of a source path into the cache directory (internal: guarded)
        with contextlib.suppress(Exception):
            from numba.core.caching import _CacheLocator

            sub = _CacheLocator.get_suitable_cache_subpath(str(py_file))
            dirs.append(Path(cache_dir) / sub)
    return dirs


def _refresh_module(module: Path) -> None:
    for d in cache_dirs(module):
        stamp = d / f"{module.stem}{STAMP_SUFFIX}"
        if not d.is_dir():
            # nothing cached yet: what numba writes next is compiled against today's sources
            recorded: dict = {"digest": None, "fresh": True}
        else:
            try:
                recorded = json.loads(stamp.read_text())
            except (OSError, ValueError):
                recorded = {}
        files_now = recorded.get("files", {})
        if files_now and _stats([Path(f) for f in files_now]) == files_now:
            continue  # no source changed since the record (the fast path)
        files = sources_of(module)
        digest = _digest(files)
        try:
            d.mkdir(parents=True, exist_ok=True)
            if not recorded.get("fresh") and recorded.get("digest") != digest:
                for index in d.glob(f"{module.stem}.*.nbi"):
                    index.unlink(missing_ok=True)
            tmp = d / f".{module.stem}{STAMP_SUFFIX}.{os.getpid()}"
            tmp.write_text(json.dumps({"digest": digest, "files": _stats(files)}))
            tmp.replace(stamp)
        except OSError:
            continue  # a read-only cache: numba cannot write there either


def refresh() -> None:
    """Drop the cached kernels of every kernel module whose sources changed (once per
    process; see the module docstring)."""
    global _done
    if _done:
        return
    _done = True
    for rel in KERNEL_MODULES:
        _refresh_module(ROOT / rel)


refresh()
