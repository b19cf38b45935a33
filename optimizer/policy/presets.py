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


# Presets of a past release, kept for the validation scenario that measured them (their names
# say the release and the scenario): a preset named for a system models its current release,
# so these are not among the known systems a search or a comparison is set against by default
# (they still load by name: `kvtier replay --preset`, `validate beluga`).
PAST_RELEASE_PRESETS = {
    "lmcache-0.3-mooncake-beluga": "LMCache 0.3's Mooncake Store path as the Beluga paper ran "
    "it, kept for validate beluga; mooncake-rdma is its current release",
    "vllm-0.8.5-hbm-beluga": "vLLM 0.8.5 as the Beluga paper ran it, kept for validate beluga; "
    "vllm-hbm is its current release",
}


def preset_names() -> list[str]:
    """Names of the built-in presets, sorted."""
    return sorted(p.stem for p in BUILTIN_DIR.glob("*.toml"))


def current_preset_names() -> list[str]:
    """The built-in presets of current releases (:data:`PAST_RELEASE_PRESETS` left out), sorted:
    the known systems a search and a comparison are set against by default."""
    return [name for name in preset_names() if name not in PAST_RELEASE_PRESETS]


def available() -> dict[str, Path]:
    """Every preset name that can be asked for (lower case) and its file: the user's
    directories first, then the built-in ones."""
    found: dict[str, Path] = {}
    for directory in _dirs():
        for path in sorted(directory.glob("*.toml")):
            if path.is_file():
                found.setdefault(path.stem.lower(), path)
    return found


def preset_path(name: str) -> Path:
    """The file of preset ``name`` (case-insensitive); :class:`InputError` if unknown.

    A preset is a name from the registry (the files of the preset directories), never a
    path: ``../spaces/default`` or an absolute path is refused like any unknown name (a
    policy file of one's own is given with ``--policy PATH``).
    """
    path = available().get(name.lower()) if name.strip() else None
    if path is not None:
        return path
    known = ", ".join(preset_names()) or "none installed"
    hint = " (a policy file is given with --policy PATH)" if "/" in name or "\\" in name else ""
    raise InputError(f"unknown preset {name!r}{hint}; built-in: {known}", option="--preset")


def load_preset(name: str) -> Policy:
    """The policy of preset ``name``, validated like any policy file."""
    return load_policy(preset_path(name))
