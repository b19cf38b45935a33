"""JSON records with their line numbers, and typed field access that names the failing field.

Text sources (request logs, conversation datasets) are nested JSON, which the columnar readers
of :mod:`.common` do not fit: they are read record by record here. A JSON Lines file gives one
record per non-blank line; a JSON array file (ShareGPT) gives one record per element, located
at the line where the element starts. Every error names the file, the line and the field path
(``request.messages[2].content``).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

from kvtier.errors import InputError
from kvtier.trace.importers.common import read_bytes

_MISSING = object()


def json_records(path: str, *, allow_array: bool = False) -> Iterator[tuple[int, Any]]:
    """``(line, record)`` for each record of a JSON Lines file (or, with ``allow_array``, of a
    file holding one JSON array of records); malformed JSON names its line."""
    text = read_bytes(path).decode("utf-8")
    if allow_array and text.lstrip().startswith("["):
        yield from _array_records(path, text)
        return
    for number, raw in enumerate(text.split("\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            yield number, json.loads(line)
        except json.JSONDecodeError as err:
            raise InputError(f"malformed JSON: {err.msg}", path=path, line=number) from None


def _array_records(path: str, text: str) -> Iterator[tuple[int, Any]]:
    decoder = json.JSONDecoder()
    pos = text.index("[") + 1
    expect_value = True
    counted, line = 0, 1  # newlines are counted once, forward, as the array is walked

    def line_at(at: int) -> int:
        nonlocal counted, line
        line += text.count("\n", counted, at)
        counted = at
        return line

    def fail(message: str, at: int) -> InputError:
        return InputError(message, path=path, line=line_at(at))

    while True:
        while pos < len(text) and text[pos] in " \t\r\n":
            pos += 1
        if pos >= len(text):
            raise fail("malformed JSON: the array is not closed", pos)
        if text[pos] == "]":
            if text[pos + 1 :].strip():
                raise fail("malformed JSON: extra data after the array", pos + 1)
            return
        if not expect_value:
            if text[pos] != ",":
                raise fail("malformed JSON: expected ',' or ']'", pos)
            pos += 1
            expect_value = True
            continue
        try:
            value, end = decoder.raw_decode(text, pos)
        except json.JSONDecodeError as err:
            raise InputError(f"malformed JSON: {err.msg}", path=path, line=err.lineno) from None
        yield line_at(pos), value
        pos, expect_value = end, False


class Record:
    """One JSON object and where it came from, for typed access with located errors."""

    def __init__(self, path: str, line: int, obj: Any, prefix: str = "") -> None:
        self.path, self.line, self.obj, self.prefix = path, line, obj, prefix
        if not isinstance(obj, dict):
            raise self.error("expected a JSON object", None)

    def error(self, message: str, field: str | None) -> InputError:
        column = f"{self.prefix}{field}" if field is not None else (self.prefix or None)
        return InputError(message, path=self.path, line=self.line, column=column)

    def has(self, key: str) -> bool:
        return self.obj.get(key) is not None

    def get(self, key: str, types: type | tuple[type, ...], default: Any = _MISSING) -> Any:
        """``obj[key]``, checked to be of ``types``; missing or null raises unless a default."""
        value = self.obj.get(key)
        if value is None:
            if default is not _MISSING:
                return default
            raise self.error("missing field", key)
        if isinstance(value, bool) and bool not in _as_tuple(types):
            raise self.error(f"unexpected value {value!r}", key)
        if not isinstance(value, types):
            raise self.error(f"expected {_type_names(types)}, got {_json_type(value)}", key)
        return value

    def child(self, key: str) -> Record:
        return Record(self.path, self.line, self.get(key, dict), f"{self.prefix}{key}.")

    def items(self, key: str) -> list[Record]:
        """The objects of list field ``key``, each a :class:`Record` named ``key[i].``."""
        values = self.get(key, list)
        return [
            Record(self.path, self.line, v, f"{self.prefix}{key}[{i}].")
            for i, v in enumerate(values)
        ]


def _as_tuple(types: type | tuple[type, ...]) -> tuple[type, ...]:
    return types if isinstance(types, tuple) else (types,)


_NAMES = {str: "a string", int: "an integer", float: "a number", list: "a list", dict: "an object"}


def _type_names(types: type | tuple[type, ...]) -> str:
    return " or ".join(_NAMES.get(t, t.__name__) for t in _as_tuple(types))


def _json_type(value: Any) -> str:
    for t, name in _NAMES.items():
        if isinstance(value, t) and not isinstance(value, bool):
            return name
    return "true/false" if isinstance(value, bool) else type(value).__name__
