"""The releases every export is written for, and the names each release reads.

``PACKAGES`` pins one version of every package an exporter writes flags, environment variables
or configuration keys for; ``TARGET_RELEASES`` says which of them each target's files are read
by. The lists beside this module (``PACKAGE-VERSION.json``) are generated from the released
wheels by ``scripts/pin_releases.py``: the command-line flags the release declares, the
environment variables it reads and the configuration keys it accepts (docs/export.md,
"Pinned releases").
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

# package -> version: the current release of each, read from its wheel
PACKAGES: dict[str, str] = {
    "vllm": "0.34.0",
    "sglang": "0.5.23",
    "lmcache": "0.5.6",
    "ai-dynamo": "1.6.1",
    "kvbm": "1.6.1",
    # ai-dynamo[vllm] 1.6.1 requires vllm==0.31.0: the engine flags its workers pass through
    "vllm@dynamo": "0.31.0",
    "mooncake-transfer-engine": "0.3.13.post1",
    "nixl-cu12": "1.5.1",  # the newest nixl-cu12 wheel (nixl 1.5.2 needs a 1.5.2 not published)
}

# target -> the pinned packages whose names its files use
TARGET_RELEASES: dict[str, tuple[str, ...]] = {
    "vllm": ("vllm", "lmcache", "nixl-cu12"),
    "lmcache": ("lmcache",),
    "sglang": ("sglang", "mooncake-transfer-engine"),
    "dynamo": ("ai-dynamo", "kvbm", "vllm@dynamo", "nixl-cu12"),
    "mooncake": ("mooncake-transfer-engine",),
}


def pins() -> list[tuple[str, str]]:
    """Every ``(package, version)`` to read from a wheel (``vllm@dynamo`` is vLLM's)."""
    return sorted({(name.split("@")[0], version) for name, version in PACKAGES.items()})


@dataclass(frozen=True)
class Release:
    """The names one released wheel reads."""

    package: str
    version: str
    flags: frozenset[str]
    env: frozenset[str]
    config: dict[str, frozenset[str]]
    flags_by_module: dict[str, frozenset[str]]  # "dynamo/vllm" -> the flags declared there

    def flags_of(self, *modules: str) -> frozenset[str]:
        """The flags declared under ``modules`` (first two path parts, e.g. ``dynamo/vllm``)."""
        return frozenset().union(*(self.flags_by_module.get(m, frozenset()) for m in modules))

    @property
    def label(self) -> str:
        return f"{self.package} {self.version}"


@cache
def release(name: str) -> Release:
    """The pinned release of ``name`` (a key of :data:`PACKAGES`)."""
    package = name.split("@")[0]
    version = PACKAGES[name]
    text = resources.files(__name__).joinpath(f"{package}-{version}.json").read_text()
    doc = json.loads(text)
    return Release(
        package,
        version,
        frozenset(doc["flags"]),
        frozenset(doc["env"]),
        {k: frozenset(v) for k, v in doc["config"].items()},
        {k: frozenset(v) for k, v in doc.get("flags_by_module", {}).items()},
    )


def target_release(target: str) -> str:
    """``vllm 0.34.0, lmcache 0.5.6, ...``: the releases ``target``'s files are written for."""
    return ", ".join(f"{n.split('@')[0]} {PACKAGES[n]}" for n in TARGET_RELEASES[target])
