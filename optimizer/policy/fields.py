"""Policy settings declared once: default, help, type and domain in dataclass field metadata.

Each scalar field of a policy dataclass is declared with :func:`setting` (as Vidur does with
``field(default=..., metadata={"help": ...})``). Everything else reads that declaration: the
TOML loader (:func:`read_settings` derives every default instead of restating it), the
``--set`` / ``--pin`` validation (``kvtier.policy.overrides``), the CLI's help and the docs
table (:func:`settings_table`). Changing a default in the dataclass changes it everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import MISSING, Field, dataclass, field, fields
from typing import Any

from kvtier.toml_fields import Table

KINDS = ("int", "float", "bool", "str")
# Upper bounds of every count and size a policy can state: far above any deployment, far
# below what overflows the simulator's 64-bit counts (docs/policy.md, "Limits").
MAX_COUNT = 1 << 30  # instances, token budgets, sequences, block sizes: as kvtier.trace.format
MAX_CAPACITY_GB = 1e6  # a tier of one petabyte


def setting(
    default: Any,
    help: str,
    *,
    kind: str | None = None,
    choices: tuple[str, ...] = (),
    minimum: int = 1,
    nonneg: bool = False,
    maximum: float | None = None,
) -> Any:
    """A dataclass field whose metadata describes it fully.

    ``kind`` is inferred from the default unless the default is None (then it must be given).
    ``choices`` (strings) usually come from a plug-in registry's ``names``. ``minimum`` bounds
    integers; floats must be > 0 unless ``nonneg``. ``maximum`` bounds both from above
    (integers: :data:`MAX_COUNT` unless given).
    """
    kind = kind or type(default).__name__
    if kind not in KINDS:
        raise TypeError(f"setting kind must be one of {KINDS}, got {kind!r}")
    meta = {"help": help, "kind": kind, "choices": tuple(choices), "minimum": minimum}
    meta["nonneg"] = nonneg
    meta["maximum"] = MAX_COUNT if maximum is None and kind == "int" else maximum
    return field(default=default, metadata=meta)


@dataclass(frozen=True)
class Setting:
    """One declared field: what :func:`setting` recorded, plus the field's name and default."""

    name: str
    default: Any
    help: str
    kind: str
    choices: tuple[str, ...] = ()
    minimum: int = 1
    nonneg: bool = False
    maximum: float | None = None

    @property
    def optional(self) -> bool:
        return self.default is None

    def read(self, table: Table, *, choices: tuple[str, ...] | None = None) -> Any:
        """The field's value from ``table`` (its default when absent), type- and range-checked.

        ``choices`` narrows the declared ones (the hbm tier evicts lru only).
        """
        key = self.name
        if not table.has(key):
            table.used.add(key)
            return self.default
        if self.kind == "int":
            return table.integer(key, minimum=self.minimum, maximum=self.maximum)
        if self.kind == "float":
            return table.number(
                key, positive=not self.nonneg, nonneg=self.nonneg, at_most=self.maximum
            )
        if self.kind == "bool":
            return table.boolean(key)
        return table.string(key, choices=self.choices if choices is None else choices)

    def type_text(self) -> str:
        """How the docs and error messages describe the value."""
        if self.choices:
            text = "one of " + ", ".join(self.choices)
        elif self.kind == "int":
            text = f"integer >= {self.minimum}"
        elif self.kind == "float":
            text = "number >= 0" if self.nonneg else "number > 0"
        elif self.kind == "bool":
            text = "true or false"
        else:
            text = "text"
        if self.maximum is not None and self.kind == "int":
            text += f", <= 2^{int(self.maximum).bit_length() - 1}"
        elif self.maximum is not None and self.kind == "float":
            text += f", <= {self.maximum:g}"
        return text


def _setting(f: Field[Any]) -> Setting:
    m = f.metadata
    default = f.default if f.default is not MISSING else None
    return Setting(
        f.name,
        default,
        m["help"],
        m["kind"],
        m["choices"],
        m["minimum"],
        m["nonneg"],
        m.get("maximum"),
    )


def settings(cls: type) -> tuple[Setting, ...]:
    """The declared scalar fields of dataclass ``cls`` (nested sections are not settings)."""
    return tuple(_setting(f) for f in fields(cls) if "help" in f.metadata)


def read_settings(
    cls: type,
    table: Table,
    *,
    skip: tuple[str, ...] = (),
    narrow: Callable[[Setting], tuple[str, ...] | None] | None = None,
) -> dict[str, Any]:
    """Keyword arguments for ``cls`` from ``table``: every declared field not in ``skip``."""
    out: dict[str, Any] = {}
    for s in settings(cls):
        if s.name not in skip:
            out[s.name] = s.read(table, choices=narrow(s) if narrow else None)
    return out


def check_settings(obj: Any) -> None:
    """Refuse (``ValueError``) a declared field of dataclass ``obj`` outside its domain.

    Called from ``__post_init__`` so a policy built in code is held to what the loader checks.
    """
    for s in settings(type(obj)):
        value = getattr(obj, s.name)
        if value is None and s.optional:
            continue
        if s.kind == "bool":
            ok = isinstance(value, bool)
        elif s.kind == "int":
            ok = isinstance(value, int) and not isinstance(value, bool) and value >= s.minimum
        elif s.kind == "float":
            ok = isinstance(value, int | float) and not isinstance(value, bool)
            ok = ok and math.isfinite(value) and (value >= 0 if s.nonneg else value > 0)
        else:
            ok = isinstance(value, str) and bool(value) and (not s.choices or value in s.choices)
        if ok and s.maximum is not None and s.kind in ("int", "float"):
            ok = value <= s.maximum
        if not ok:
            raise ValueError(f"{s.name} must be {s.type_text()}, got {value!r}")


def settings_table(rows: list[tuple[str, Setting]]) -> str:
    """A markdown table of ``(dotted key, setting)`` rows for the docs."""
    lines = ["| key | value | default | what it is |", "|---|---|---|---|"]
    for key, s in rows:
        default = "(unset)" if s.default is None else f"`{s.default}`"
        if isinstance(s.default, bool):
            default = f"`{str(s.default).lower()}`"
        value = ", ".join(f"`{c}`" for c in s.choices) if s.choices else s.type_text()
        lines.append(f"| `{key}` | {value} | {default} | {s.help} |")
    return "\n".join(lines)
