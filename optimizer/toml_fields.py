"""Strict reading of TOML tables: typed fields, unknown keys rejected, errors name file and key.

Profiles and policy files are hand-written, so a typo must fail loudly (``tp`` vs ``tpp``) and
the message must say which file and which dotted key, on one line (exit code 2 from the CLI).
"""

from __future__ import annotations

import difflib
import math
import re
import tomllib
from pathlib import Path
from typing import Any

from kvtier.errors import InputError

_INT_TEXT = re.compile(r"[+-]?[0-9]{1,30}")
_FLOAT_TEXT = re.compile(r"[+-]?([0-9]+(\.[0-9]*)?|\.[0-9]+)([eE][+-]?[0-9]+)?")


def strict_int(text: str) -> int | None:
    """The integer ``text`` spells in plain decimal digits, else None.

    Python's ``int()`` also takes ``"1_6"`` (16), surrounding spaces and other scripts' digits:
    for a number in a file's metadata or an option that leniency turns a typo into a value.
    """
    return int(text) if isinstance(text, str) and _INT_TEXT.fullmatch(text) else None


def strict_float(text: str) -> float | None:
    """The finite number ``text`` spells in plain decimal notation (``1``, ``0.25``, ``1e-3``),
    else None: no ``_``, spaces, ``nan`` or ``inf``, which ``float()`` accepts."""
    if not isinstance(text, str) or len(text) > 64 or not _FLOAT_TEXT.fullmatch(text):
        return None
    value = float(text)
    return value if math.isfinite(value) else None


def read_toml(path: Path) -> dict[str, Any]:
    """Parse a TOML file, turning I/O and syntax errors into :class:`InputError`."""
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except FileNotFoundError:
        raise InputError("file not found", path=str(path)) from None
    except OSError as err:
        raise InputError(f"cannot read file: {err.strerror}", path=str(path)) from None
    except tomllib.TOMLDecodeError as err:
        raise InputError(f"invalid TOML: {err}", path=str(path)) from None
    except UnicodeDecodeError as err:
        raise InputError(
            f"invalid TOML: not UTF-8 (byte {err.object[err.start]:#04x} at offset {err.start})",
            path=str(path),
        ) from None
    except RecursionError:
        raise InputError("invalid TOML: nested too deeply", path=str(path)) from None


class Table:
    """A TOML table being read: getters check type and range, :meth:`done` rejects leftovers."""

    def __init__(self, data: Any, path: str, prefix: str = "") -> None:
        self.path = path
        self.prefix = prefix
        if not isinstance(data, dict):
            raise self.error(prefix.rstrip(".") or "<root>", "must be a table")
        self.data: dict[str, Any] = data
        self.used: set[str] = set()

    def error(self, key: str, message: str) -> InputError:
        return InputError(f"key '{key}': {message}", path=self.path)

    def _key(self, key: str) -> str:
        return f"{self.prefix}{key}"

    def has(self, key: str) -> bool:
        self.used.add(key)  # a key the reader knows, present or not
        return key in self.data

    def _get(self, key: str, default: Any, required: bool) -> Any:
        self.used.add(key)
        if key not in self.data:
            if required:
                raise self.error(self._key(key), "is required")
            return default
        return self.data[key]

    def string(self, key: str, default: str | None = None, *, choices: tuple[str, ...] = ()) -> str:
        value = self._get(key, default, default is None)
        if not isinstance(value, str) or not value:
            raise self.error(self._key(key), f"must be a non-empty string, got {value!r}")
        if choices and value not in choices:
            raise self.error(self._key(key), f"must be one of {', '.join(choices)}, got {value!r}")
        return value

    def number(
        self,
        key: str,
        default: float | None = None,
        *,
        positive: bool = False,
        nonneg: bool = False,
        at_most: float | None = None,
    ) -> float:
        value = self._get(key, default, default is None)
        is_num = isinstance(value, int | float) and not isinstance(value, bool)
        if not is_num or not math.isfinite(value):
            raise self.error(self._key(key), f"must be a finite number, got {value!r}")
        if positive and value <= 0:
            raise self.error(self._key(key), f"must be > 0, got {value}")
        if nonneg and value < 0:
            raise self.error(self._key(key), f"must be >= 0, got {value}")
        if at_most is not None and value > at_most:
            raise self.error(self._key(key), f"must be <= {at_most}, got {value}")
        return float(value)

    def boolean(self, key: str, default: bool | None = None) -> bool:
        value = self._get(key, default, default is None)
        if not isinstance(value, bool):
            raise self.error(self._key(key), f"must be true or false, got {value!r}")
        return value

    def integer(
        self,
        key: str,
        default: int | None = None,
        *,
        minimum: int = 1,
        maximum: float | None = None,
    ) -> int:
        value = self._get(key, default, default is None)
        if isinstance(value, bool) or not isinstance(value, int):
            raise self.error(self._key(key), f"must be an integer, got {value!r}")
        if value < minimum:
            raise self.error(self._key(key), f"must be >= {minimum}, got {value}")
        if maximum is not None and value > maximum:
            raise self.error(self._key(key), f"must be <= {int(maximum)}, got {value}")
        return int(value)

    def optional_integer(self, key: str, *, minimum: int = 1) -> int | None:
        if key not in self.data:
            self.used.add(key)
            return None
        return self.integer(key, minimum=minimum)

    def optional_number(self, key: str, *, positive: bool = True) -> float | None:
        if key not in self.data:
            self.used.add(key)
            return None
        return self.number(key, positive=positive)

    def table(self, key: str, *, required: bool = False) -> Table | None:
        value = self._get(key, None, required)
        if value is None:
            return None
        return Table(value, self.path, f"{self._key(key)}.")

    def tables(self, key: str) -> list[Table]:
        """An array of tables (``[[key]]``); empty when absent."""
        value = self._get(key, [], False)
        if not isinstance(value, list):
            raise self.error(self._key(key), "must be an array of tables")
        return [Table(v, self.path, f"{self._key(key)}[{i}].") for i, v in enumerate(value)]

    def done(self) -> None:
        """Reject keys nobody asked for: they are typos or unsupported options. The message
        lists the keys the table takes (every key its reader asked for)."""
        for key in self.data:
            if key not in self.used:
                close = difflib.get_close_matches(str(key), sorted(self.used), n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                valid = ", ".join(sorted(self.used)) or "none"
                raise self.error(self._key(key), f"unknown key{hint}; valid keys: {valid}")
