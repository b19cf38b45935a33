"""Eviction policies: one module per policy (numba primitives + Python-side description).

A policy is named by a string that carries its parameters, e.g. ``lru`` or
``s3fifo(small=0.1,ghost=0.9,threshold=2)``; :func:`parse_policy` turns such a string into a
:class:`PolicySpec` with every default filled in, and ``spec.name`` prints it back canonically, so
every result row describes itself.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from types import ModuleType

from kvtier.cache import enums
from kvtier.cache.policies import fifo, gdsf, lfu, lru, s3fifo, sieve
from kvtier.errors import InputError

MODULES: dict[int, ModuleType] = {
    enums.LRU: lru,
    enums.FIFO: fifo,
    enums.LFU: lfu,
    enums.S3FIFO: s3fifo,
    enums.SIEVE: sieve,
    enums.GDSF: gdsf,
}
CODES: dict[str, int] = {mod.NAME: code for code, mod in MODULES.items()}

_SPEC_RE = re.compile(r"^\s*([a-z0-9_]+)\s*(?:\((.*)\))?\s*$")


@dataclass(frozen=True)
class PolicySpec:
    """An eviction policy with all its parameters (defaults filled in)."""

    code: int
    params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if self.code not in MODULES:
            raise InputError(f"unknown policy code {self.code}")
        p = dict(self.params)
        if self.code == enums.S3FIFO:
            if not 0.0 <= p["small"] < 1.0:
                raise InputError(f"s3fifo: 0 <= small < 1 must hold, but got small={p['small']}")
            if p["ghost"] < 0.0:
                raise InputError(f"s3fifo: ghost >= 0 must hold, but got ghost={p['ghost']}")
            t = p["threshold"]
            if t != int(t) or t < 1:
                raise InputError(
                    f"s3fifo: threshold must be an integer >= 1, but got threshold={t}"
                )

    @property
    def base(self) -> str:
        return MODULES[self.code].NAME

    def param(self, key: str) -> float:
        return dict(self.params)[key]

    @property
    def name(self) -> str:
        """Canonical name with parameters, e.g. ``s3fifo(small=0.1,ghost=0.9,threshold=2)``."""
        if not self.params:
            return self.base
        inner = ",".join(f"{k}={_fmt(v)}" for k, v in self.params)
        return f"{self.base}({inner})"

    def __str__(self) -> str:
        return self.name


def _fmt(v: float) -> str:
    return str(int(v)) if float(v).is_integer() else repr(float(v))


def parse_policy(text: str | PolicySpec) -> PolicySpec:
    """``"lru"``, ``"s3fifo"``, ``"s3fifo(small=0.2,threshold=1)"`` -> :class:`PolicySpec`.

    Unknown names and parameters, and values that do not parse, raise :class:`InputError`.
    """
    if isinstance(text, PolicySpec):
        return text
    m = _SPEC_RE.match(text.lower())
    if not m:
        raise InputError(f"policy {text!r} does not parse; expected NAME or NAME(key=value,...)")
    base, inner = m.group(1), m.group(2)
    if base not in CODES:
        raise InputError(f"unknown policy {base!r}; choose from {', '.join(CODES)}")
    mod = MODULES[CODES[base]]
    values: dict[str, float] = dict(mod.DEFAULTS)
    if inner is not None and inner.strip():
        for item in inner.split(","):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in mod.DEFAULTS:
                allowed = ", ".join(mod.DEFAULTS) or "none"
                raise InputError(
                    f"policy {base!r}: unknown parameter {item.strip()!r} (allowed: {allowed})"
                )
            try:
                values[key] = float(raw)
            except ValueError:
                raise InputError(
                    f"policy {base!r}: {key}={raw.strip()!r} is not a number"
                ) from None
    return PolicySpec(CODES[base], tuple((k, values[k]) for k in mod.DEFAULTS))


def policy_names() -> list[str]:
    """Base names of all policies, in code order."""
    return [MODULES[c].NAME for c in sorted(MODULES)]
