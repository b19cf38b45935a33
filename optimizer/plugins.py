"""Plug-ins from outside the package: modules named in ``KVTIER_PLUGINS`` that register
mechanisms (a router, a write policy, a load rule, a transfer path, a tier kind) in kvtier's
registries when imported.

``KVTIER_PLUGINS=my_pkg.sticky_router,my_pkg.fabric`` imports each module once, when the
first registry is imported (:mod:`kvtier.tier_kinds` and :mod:`kvtier.policy.registries`
call :func:`load_plugins` once their own entries are defined), so every layer sees the
same registries: the policy loader's choices, the docs tables, the
reference engine (which loads a plug-in's module by its ``impl``) and the numba kernels, whose
dispatch :mod:`kvtier.sim.gen` writes for the registries as they are
(:func:`kvtier.sim.gen.twin`). A module registers with ``Registry.register`` and holds what a
built-in plug-in's module holds (docs/design.md, "How to add a plug-in").

The numba kernels compiled with plug-ins inline their twins, so they are cached apart from
the built-in kernels: in a subfolder of the cache named for the plug-ins and their sources
(:func:`activate_cache`), set before any kernel is compiled. A plug-in's own kernels are its
own to keep current (kvtier's :mod:`kvtier.jitcache` follows kvtier's sources only).
"""

from __future__ import annotations

import hashlib
import importlib
import os
import sys
from pathlib import Path

from kvtier.errors import InputError

ENV = "KVTIER_PLUGINS"

_loaded: tuple[str, ...] | None = None
_folder: Path | None = None
_error: InputError | None = None


def plugin_names() -> tuple[str, ...]:
    """The module names ``KVTIER_PLUGINS`` lists (comma-separated, blanks ignored)."""
    return tuple(n.strip() for n in os.environ.get(ENV, "").split(",") if n.strip())


def load_plugins() -> tuple[str, ...]:
    """Import every plug-in module once. A module that cannot be imported, or whose
    registration a registry refuses, is kept as a one-line :class:`InputError` naming it and
    the variable, raised by :func:`check` (the CLI calls it first, and so does every kernel
    build): an import-time error would reach the user as a traceback."""
    global _loaded, _folder, _error
    if _loaded is not None:
        return _loaded
    names = plugin_names()
    _loaded = names
    for name in names:
        try:
            importlib.import_module(name)
        except ImportError as err:
            _error = InputError(f"cannot import plug-in module {name!r}: {err}", option=ENV)
            return names
        except ValueError as err:  # a registration refused by its registry
            _error = InputError(f"plug-in module {name!r}: {err}", option=ENV)
            return names
    if names:
        _folder = activate_cache(names)
    return names


def check() -> None:
    """Raise the error met loading the plug-ins, if any."""
    load_plugins()
    if _error is not None:
        raise _error


def plugin_key(names: tuple[str, ...]) -> str:
    """A short digest of the plug-in modules and their sources: the kernels compiled with
    them are kept under this name."""
    h = hashlib.sha256()
    for name in names:
        h.update(name.encode())
        module = sys.modules.get(name)
        source = getattr(module, "__file__", None)
        if source:
            h.update(Path(source).read_bytes())
    return h.hexdigest()[:16]


def cache_root() -> Path:
    """Where kernels compiled with plug-ins, and the dispatch written for them, are kept:
    ``NUMBA_CACHE_DIR`` when set, else the user's cache directory."""
    base = os.environ.get("NUMBA_CACHE_DIR") or os.environ.get("XDG_CACHE_HOME")
    root = Path(base) if base else Path.home() / ".cache"
    return root / "kvtier-plugins"


def activate_cache(names: tuple[str, ...]) -> Path:
    """Point numba's cache at the plug-ins' own folder, before any kernel is compiled (a
    kernel module imported earlier keeps the folder it was compiled for)."""
    folder = cache_root() / plugin_key(names)
    folder.mkdir(parents=True, exist_ok=True)
    os.environ["NUMBA_CACHE_DIR"] = str(folder / "numba")
    if "numba" in sys.modules:
        from numba.core import config

        config.CACHE_DIR = str(folder / "numba")
    return folder


def active_folder() -> Path | None:
    """The plug-ins' cache folder when plug-ins are loaded, else None."""
    check()
    return _folder
