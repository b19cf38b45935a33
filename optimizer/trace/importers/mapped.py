"""Any CSV or JSON Lines request log, by a column mapping (``--columns``).

``--columns arrival=TIMESTAMP,input=Request tokens,output=Response tokens`` names the source
columns of the trace fields; the fields are listed in :data:`FIELDS`. ``arrival_unit`` says
how to read the arrival column: ``timestamp`` (wall clock), ``s`` or ``ms`` from any origin;
by default numbers are seconds and anything else a timestamp. ``hashes`` (JSON Lines only)
names a list of chained prefix hash ids, of ``block_tokens`` tokens each (required with it).
"""

from __future__ import annotations

import numpy as np
import polars as pl

from kvtier.errors import InputError
from kvtier.trace.format import Trace
from kvtier.trace.importers.azure import read_csv_strings
from kvtier.trace.importers.common import (
    content_line_numbers,
    note_ignored,
    read_bytes,
    scan_keys,
)
from kvtier.trace.importers.registry import ImportOptions, register
from kvtier.trace.importers.tabular import ARRIVAL_KINDS, ColumnMap, lengths_trace

FIELDS = {
    "arrival": "arrival time column (required)",
    "input": "prompt token count column (required)",
    "output": "output token count column (required)",
    "arrival_unit": f"how arrivals read: {', '.join(ARRIVAL_KINDS)} (default auto)",
    "request_id": "request id column",
    "session_id": "integer session / conversation id column",
    "tenant": "tenant column (blocks are not shared across tenants by default)",
    "hashes": "list of chained prefix hash ids (JSON Lines only)",
    "block_tokens": "tokens per hash id (required with hashes)",
}


def column_map(columns: dict[str, str], *, allow_hashes: bool) -> ColumnMap:
    """Validate a ``--columns`` mapping into a :class:`ColumnMap`."""
    valid = ", ".join(FIELDS)
    for key in columns:
        if key not in FIELDS:
            raise InputError(f"unknown field '{key}' (valid: {valid})", option="--columns")
    for key in ("arrival", "input", "output"):
        if key not in columns:
            raise InputError(f"field '{key}' is required (valid: {valid})", option="--columns")
    unit = columns.get("arrival_unit", "auto")
    if unit not in ARRIVAL_KINDS:
        raise InputError(
            f"arrival_unit must be one of {', '.join(ARRIVAL_KINDS)}, got '{unit}'",
            option="--columns",
        )
    if "hashes" in columns and not allow_hashes:
        raise InputError("hashes apply to JSON Lines input only", option="--columns")
    block = 16
    if "hashes" in columns:
        text = columns.get("block_tokens")
        if text is None or not text.isdigit() or int(text) < 1:
            raise InputError(
                "hashes need block_tokens=N (tokens per hash id, N >= 1)", option="--columns"
            )
        block = int(text)
    elif "block_tokens" in columns:
        raise InputError("block_tokens applies with hashes only", option="--columns")
    return ColumnMap(
        arrival=columns["arrival"],
        input=columns["input"],
        output=columns["output"],
        arrival_kind=unit,
        request_id=columns.get("request_id"),
        session_id=columns.get("session_id"),
        tenant=columns.get("tenant"),
        hashes=columns.get("hashes"),
        block_tokens=block,
    )


def _need_columns(options: ImportOptions, kind: str) -> dict[str, str]:
    if not options.columns:
        raise InputError(
            f"--from {kind} needs --columns arrival=COL,input=COL,output=COL", option="--columns"
        )
    return options.columns


@register("csv", "any CSV request log, mapped with --columns", options=("columns",))
def import_csv(path: str, options: ImportOptions) -> Trace:
    cmap = column_map(_need_columns(options, "csv"), allow_hashes=False)
    df, lines = read_csv_strings(path)
    return lengths_trace(path, df, lines, cmap, "csv")


@register("jsonl", "any JSON Lines request log, mapped with --columns", options=("columns",))
def import_jsonl(path: str, options: ImportOptions) -> Trace:
    cmap = column_map(_need_columns(options, "jsonl"), allow_hashes=True)
    data = read_bytes(path)
    lines = content_line_numbers(data)
    try:
        df = pl.read_ndjson(data, infer_schema_length=None)
    except Exception as err:
        from kvtier.trace.importers.common import first_bad_json_line

        error = first_bad_json_line(data, {})
        if error.line is None:
            error = InputError(f"malformed JSON Lines: {' '.join(str(err).split())[:200]}")
        raise error.with_path(path) from None
    if len(lines) != df.height:
        raise InputError("could not match JSON rows to lines", path=path)
    keys = scan_keys(data, path)
    trace = lengths_trace(path, df, np.asarray(lines), cmap, "jsonl")
    note_ignored(path, keys, set(cmap.used().values()))
    return trace
