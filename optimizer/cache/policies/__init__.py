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

from kvtier.cache.registry import EVICTIONS
from kvtier.errors import InputError

_SPEC_RE = re.compile(r"^\s*([a-z0-9_]+)\s*(?:\((.*)\))?\s*$")


def module(code: int) -> ModuleType:
    """The module implementing the policy of ``code`` (see ``kvtier.cache.policies.base``)."""
    return EVICTIONS.by_code(code).load()


@dataclass(frozen=True)
class PolicySpec:
    """An eviction policy with all its parameters (defaults filled in)."""

    code: int
    params: tuple[tuple[str, float], ...] = ()

    def __post_init__(self) -> None:
        if not 0 <= self.code < len(EVICTIONS):
            raise InputError(f"unknown policy code {self.code}")
        if self.params or EVICTIONS.by_code(self.code).defaults:
            # a policy without parameters has none to check: its module (numba kernels) is
            # not imported until a cache is built
            self.module.check(dict(self.params))

    @property
    def module(self) -> ModuleType:
        return module(self.code)

    @property
    def base(self) -> str:
        return EVICTIONS.by_code(self.code).name

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
    if base not in EVICTIONS:
        raise InputError(f"unknown policy {base!r}; choose from {', '.join(EVICTIONS.names)}")
    entry = EVICTIONS[base]
    values: dict[str, float] = {k: float(v) for k, v in entry.defaults.items()}
    if inner is not None and inner.strip():
        for item in inner.split(","):
            key, sep, raw = item.partition("=")
            key = key.strip()
            if not sep or key not in entry.defaults:
                allowed = ", ".join(entry.defaults) or "none"
                raise InputError(
                    f"policy {base!r}: unknown parameter {item.strip()!r} (allowed: {allowed})"
                )
            try:
                values[key] = float(raw)
            except ValueError:
                raise InputError(
                    f"policy {base!r}: {key}={raw.strip()!r} is not a number"
                ) from None
    return PolicySpec(entry.code, tuple((k, values[k]) for k in entry.defaults))


def policy_names() -> list[str]:
    """Base names of all policies, in code order."""
    return list(EVICTIONS.names)
