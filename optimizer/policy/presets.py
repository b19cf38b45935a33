"""Built-in presets: policy files of known systems in ``policies/presets/`` (policy + hardware).

(Installed from a wheel, the directory is found by :func:`kvtier.builtin.policies_dir`.)

Each preset is an ordinary policy file naming its hardware and model profiles, with a first
comment line saying what it models and a source for every parameter. ``kvtier replay --preset
NAME`` loads one; ``$KVTIER_PRESET_PATH`` (``:``-separated directories) is searched first, so a
user's file overrides a built-in one of the same name.
"""

from __future__ import annotations

import os
from pathlib import Path

from kvtier.builtin import policies_dir
from kvtier.errors import InputError
from kvtier.policy.model import Policy, load_policy

BUILTIN_DIR = policies_dir() / "presets"


def _dirs() -> list[Path]:
    extra = [Path(p) for p in os.environ.get("KVTIER_PRESET_PATH", "").split(":") if p]
    return [*extra, BUILTIN_DIR]


def preset_names() -> list[str]:
    """Names of the built-in presets, sorted."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def preset_path(name: str) -> Path:
    """The file of preset ``name`` (case-insensitive); :class:`InputError` if unknown."""
    for directory in _dirs():
        path = directory / f"{name.lower()}.toml"
        if path.is_file():
            return path
    known = ", ".join(preset_names()) or "none installed"
    raise InputError(f"unknown preset {name!r} (built-in: {known})")


def load_preset(name: str) -> Policy:
    """The policy of preset ``name``, validated like any policy file."""
    return load_policy(preset_path(name))
