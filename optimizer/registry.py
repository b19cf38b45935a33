"""A registry of one kind of plug-in: names, integer codes, help, defaults and implementation.

kvtier has several kinds of plug-in (eviction policies, routers, write policies, load rules,
exporters). Each kind has exactly one :class:`Registry`, and every place that needs a plug-in's
name, code, help text or defaults reads it from there: the policy loader's choices, the CLI's
``click.Choice``, the docs tables, and the integer codes the numba kernels branch on. Adding a
plug-in is then one implementation plus one :class:`Entry`.

Registries hold plain data and import nothing heavy: the implementation is named by a dotted
module path and imported only by :meth:`Entry.load`, so listing choices never imports numba.
"""

from __future__ import annotations

import difflib
import importlib
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType, ModuleType
from typing import Any

from kvtier.errors import InputError


@dataclass(frozen=True)
class Entry:
    """One plug-in: its user-facing ``name``, the ``code`` kernels see, what it does, defaults.

    ``defaults`` are the plug-in's own parameters (e.g. S3-FIFO's ``small``), in the order its
    canonical name prints them. ``impl`` is the module implementing it (empty when the plug-in
    is a branch of a kernel that owns all entries of its kind, e.g. routers), or
    ``"module:attribute"`` to name one function of it. ``traits`` are facts other layers
    read without importing the implementation (a router's ``content_blind``).
    """

    name: str
    code: int
    help: str
    defaults: Mapping[str, Any] = field(default_factory=dict)
    impl: str = ""
    traits: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        object.__setattr__(self, "defaults", MappingProxyType(dict(self.defaults)))
        object.__setattr__(self, "traits", MappingProxyType(dict(self.traits)))

    def load(self) -> Any:
        """The implementation, imported on first use: the module ``impl`` names, or for
        ``"package.module:attribute"`` that attribute of the module."""
        if not self.impl:
            raise LookupError(f"{self.name!r} has no implementing module")
        module, _, attr = self.impl.partition(":")
        loaded: ModuleType = importlib.import_module(module)
        return getattr(loaded, attr) if attr else loaded


class Registry:
    """The entries of one plug-in kind, by name and by code.

    Codes are dense (0, 1, ... in registration order) so kernels can index arrays with them and
    a dispatcher can be checked for covering every code.
    """

    def __init__(self, kind: str, entries: Iterable[Entry]) -> None:
        self.kind = kind
        self._entries: tuple[Entry, ...] = tuple(entries)
        self._by_name = {e.name: e for e in self._entries}
        if len(self._by_name) != len(self._entries):
            raise ValueError(f"{kind}: duplicate names in {[e.name for e in self._entries]}")
        codes = [e.code for e in self._entries]
        if codes != list(range(len(codes))):
            raise ValueError(f"{kind}: codes must be 0, 1, ... in order, got {codes}")

    def __iter__(self) -> Iterator[Entry]:
        return iter(self._entries)

    def register(self, entry: Entry) -> Entry:
        """Add a plug-in from outside the package (:mod:`kvtier.plugins`); its code must be
        the next one, its name new."""
        if entry.name in self._by_name:
            raise ValueError(f"{self.kind} {entry.name!r} is registered already")
        if entry.code != len(self._entries):
            raise ValueError(
                f"{self.kind} {entry.name!r}: code must be {len(self._entries)} (the next one), "
                f"got {entry.code}"
            )
        self._entries = (*self._entries, entry)
        self._by_name[entry.name] = entry
        return entry

    def next_code(self) -> int:
        """The code the next registered entry takes."""
        return len(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._by_name

    def __getitem__(self, name: str) -> Entry:
        return self._by_name[name]

    @property
    def names(self) -> tuple[str, ...]:
        """Names in code order (the order choices are listed in)."""
        return tuple(e.name for e in self._entries)

    @property
    def codes(self) -> dict[str, int]:
        """``{name: code}``."""
        return {e.name: e.code for e in self._entries}

    def by_code(self, code: int) -> Entry:
        if not 0 <= code < len(self._entries):
            raise LookupError(f"{self.kind}: no entry with code {code}")
        return self._entries[code]

    def code(self, name: str) -> int:
        return self._by_name[name].code

    def get(self, name: str, *, option: str | None = None, path: str | None = None) -> Entry:
        """The entry ``name``; an unknown name is an :class:`InputError` listing the choices."""
        entry = self._by_name.get(name)
        if entry is not None:
            return entry
        close = difflib.get_close_matches(name, self.names, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise InputError(
            f"unknown {self.kind} {name!r}{hint}; choose from {', '.join(self.names)}",
            option=option,
            path=path,
        )

    def help_table(self) -> str:
        """A markdown table of the entries (name, code, what it does, defaults) for the docs."""
        rows = ["| name | code | what it does | parameters (default) |", "|---|---|---|---|"]
        for e in self._entries:
            params = ", ".join(f"`{k}={v}`" for k, v in e.defaults.items()) or "none"
            rows.append(f"| `{e.name}` | {e.code} | {e.help} | {params} |")
        return "\n".join(rows)
