"""Importers from public trace formats to request-trace/1.

=========  ===================================  ======  =====================================
source     file                                 G       notes
=========  ===================================  ======  =====================================
mooncake   JSONL: timestamp (ms), input_length,  512     hash_ids are already chained prefix
           output_length, hash_ids                      ids (checked on load)
bailian    JSONL: chat_id, parent_chat_id,      16      hash_ids hash each block's content
           timestamp (s), input_length,                 alone, so they are chained here;
           output_length, type, turn, hash_ids          sessions follow parent_chat_id
azure      CSV: TIMESTAMP, ContextTokens,       -       no prefix information: empty hash
           GeneratedTokens                              lists, ``kvtier.prefix_info=false``
=========  ===================================  ======  =====================================

Parsing is vectorised (polars); a Python loop runs only after a parse failure, to find and
report the first malformed line by its line number.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import os
import zlib
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa

from kvtier.errors import InputError
from kvtier.trace.format import Trace
from kvtier.trace.hashing import chain_hashes

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake FAST'25 traces: one hash id per 512-token block
BAILIAN_BLOCK_TOKENS = 16  # Qwen-Bailian traces: "16 tokens per block" (dataset README)

IMPORTERS: dict[str, Callable[[str], Trace]] = {}


def _register(name: str) -> Callable[[Callable[[str], Trace]], Callable[[str], Trace]]:
    def wrap(fn: Callable[[str], Trace]) -> Callable[[str], Trace]:
        IMPORTERS[name] = fn
        return fn

    return wrap


def import_trace(kind: str, path: str | os.PathLike[str]) -> Trace:
    """Import ``path`` written in the public format ``kind`` (mooncake, bailian, azure)."""
    if kind not in IMPORTERS:
        raise InputError(f"unknown trace format '{kind}'; choose one of {sorted(IMPORTERS)}")
    return IMPORTERS[kind](str(path))


# -- shared helpers -------------------------------------------------------------------------------
_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_INT64_MAX = (1 << 63) - 1


def _read_bytes(path: str) -> bytes:
    """The file's bytes: gzip-compressed files are decompressed, a UTF-8 byte-order mark is
    dropped (line numbers are unchanged by either), and text that is not UTF-8 is refused."""
    try:
        with open(path, "rb") as fh:
            data = fh.read()
    except FileNotFoundError:
        raise InputError("no such file", path=path) from None
    except IsADirectoryError:
        raise InputError("is a directory, not a trace file", path=path) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror}", path=path) from None
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise InputError(f"corrupt gzip file: {err}", path=path) from None
    if data.startswith(_UTF8_BOM):
        data = data[len(_UTF8_BOM) :]
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise InputError(
            f"not UTF-8 text (byte 0x{data[err.start]:02x}); is the file compressed?",
            path=path,
            line=line,
        ) from None
    if not data.strip():
        raise InputError("empty file", path=path)
    return data


def _content_line_numbers(data: bytes) -> np.ndarray:
    """1-based line numbers of the non-blank lines, i.e. of the parsed rows, in order.

    A line of only spaces, tabs or ``\\r`` is blank, as the JSON Lines reader skips it.
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == ord("\n"))
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [len(buf)]))
    visible = ~np.isin(buf, np.frombuffer(b" \t\r\n", dtype=np.uint8))
    cum = np.concatenate(([0], np.cumsum(visible, dtype=np.int64)))
    return np.flatnonzero(cum[ends] - cum[starts] > 0) + 1


def _bad_value(value: object, types: type | tuple[type, ...]) -> str | None:
    """Why a JSON value does not fit the field's types (int64 integers, finite numbers)."""
    if isinstance(value, bool) or not isinstance(value, types):
        return f"unexpected value {value!r}"
    if isinstance(value, float) and not math.isfinite(value):
        return f"{value!r} is not a finite number"
    if isinstance(value, int) and not -_INT64_MAX - 1 <= value <= _INT64_MAX:
        return f"integer {value} does not fit int64"
    if isinstance(value, list):
        for v in value:
            if isinstance(v, bool) or not isinstance(v, int):
                return "list holds a non-integer"
            if not -_INT64_MAX - 1 <= v <= _INT64_MAX:
                return f"list holds {v}, which does not fit int64"
    return None


def _first_bad_json_line(data: bytes, fields: dict[str, type | tuple[type, ...]]) -> InputError:
    """Scan line by line (error path only) for the first line that does not parse or fit."""
    for number, raw in enumerate(data.split(b"\n"), start=1):
        line = raw.strip()
        if not line:
            continue
        try:
            obj = json.loads(line)
        except json.JSONDecodeError as err:
            return InputError(f"malformed JSON: {err.msg}", line=number)
        except UnicodeDecodeError:
            return InputError("not UTF-8 text", line=number)
        if not isinstance(obj, dict):
            return InputError("expected a JSON object", line=number)
        for name, types in fields.items():
            if name not in obj:
                return InputError("missing field", line=number, column=name)
            reason = _bad_value(obj[name], types)
            if reason is not None:
                return InputError(reason, line=number, column=name)
    return InputError("could not parse the file as JSON Lines")


def _read_jsonl(
    path: str, schema: dict[str, pl.DataType], fields: dict
) -> tuple[pl.DataFrame, np.ndarray]:
    data = _read_bytes(path)
    try:
        df = pl.read_ndjson(data, schema=schema)
    except Exception:  # polars raises several error types for bad input
        raise _first_bad_json_line(data, fields).with_path(path) from None
    lines = _content_line_numbers(data)
    if len(lines) != df.height:  # whitespace-only lines or other oddities: find the line
        raise _first_bad_json_line(data, fields).with_path(path)
    for name in schema:
        nulls = df.get_column(name).is_null().to_numpy()
        if nulls.any():
            row = int(np.flatnonzero(nulls)[0])
            raise InputError(
                "missing field or null value", path=path, line=int(lines[row]), column=name
            )
    return df, lines


def _check_rows(path: str, lines: np.ndarray, checks: list[tuple[str, np.ndarray, str]]) -> None:
    """Raise for the first row flagged by any check (name, bad-mask, message)."""
    first: tuple[int, str, str] | None = None
    for column, bad, message in checks:
        if bad.any():
            row = int(np.flatnonzero(bad)[0])
            if first is None or row < first[0]:
                first = (row, column, message)
    if first is not None:
        row, column, message = first
        raise InputError(message, path=path, line=int(lines[row]), column=column)


JSONL_COLUMNS = {
    "arrival_s": "timestamp",
    "input_tokens": "input_length",
    "output_tokens": "output_length",
    "block_hashes": "hash_ids",
}


def _validated(
    path: str,
    lines: np.ndarray,
    build: Callable[[], Trace],
    columns: dict[str, str] = JSONL_COLUMNS,
) -> Trace:
    """Run ``build``; validation errors name the source line and the source's own column name
    (``columns``: trace column -> source field) instead of the table row and column."""
    try:
        return build()
    except InputError as err:
        if err.row is not None and err.line is None and err.row < len(lines):
            err.line, err.row = int(lines[err.row]), None
        if err.column in columns:
            err.column = columns[err.column]
        err.path = path
        err.args = (err.format(),)
        raise


def _check_hash_ids(path: str, lines: np.ndarray, offsets: np.ndarray, ids: np.ndarray) -> None:
    if len(ids) and ids.min() < 0:
        row = int(np.searchsorted(offsets, int(np.flatnonzero(ids < 0)[0]), side="right") - 1)
        raise InputError("negative hash id", path=path, line=int(lines[row]), column="hash_ids")


def _list_arrays(series: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    arr = series.to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_list(pa.int64()))
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], values


# -- Mooncake -------------------------------------------------------------------------------------
@_register("mooncake")
def import_mooncake(path: str) -> Trace:
    """Mooncake FAST'25 JSONL (timestamp in ms, 512-token hash ids that are already chained)."""
    schema = {
        "timestamp": pl.Float64,
        "input_length": pl.Int64,
        "output_length": pl.Int64,
        "hash_ids": pl.List(pl.Int64),
    }
    fields = {
        "timestamp": (int, float),
        "input_length": int,
        "output_length": int,
        "hash_ids": list,
    }
    df, lines = _read_jsonl(path, schema, fields)
    offsets, ids = _list_arrays(df.get_column("hash_ids"))
    _check_hash_ids(path, lines, offsets, ids)
    return _validated(
        path,
        lines,
        lambda: Trace.from_arrays(
            arrival_s=df.get_column("timestamp").to_numpy() / 1000.0,
            input_tokens=df.get_column("input_length").to_numpy(),
            output_tokens=df.get_column("output_length").to_numpy(),
            hash_offsets=offsets,
            hashes=ids.astype(np.uint64),
            block_tokens=MOONCAKE_BLOCK_TOKENS,
            source=f"mooncake:{os.path.basename(path)}",
        ),
    )


# -- Qwen-Bailian ---------------------------------------------------------------------------------
def _session_roots(chat_id: np.ndarray, parent: np.ndarray) -> np.ndarray | None:
    """Row index of each row's root request, following parent_chat_id; None on a cycle.

    A parent that is not in the trace (the trace is a time window) makes its child a root.
    Pointer jumping resolves chains of any depth in O(log depth) vectorised steps.
    """
    order = np.argsort(chat_id, kind="stable")
    sorted_ids = chat_id[order]
    pos = np.clip(np.searchsorted(sorted_ids, parent), 0, len(order) - 1)
    found = (parent >= 0) & (sorted_ids[pos] == parent)
    up = np.where(found, order[pos], np.arange(len(chat_id)))
    for _ in range(64):
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    # a true root has no parent in the trace; anything else sits on a cycle
    return None if found[up].any() else up


@_register("bailian")
def import_bailian(path: str) -> Trace:
    """Qwen-Bailian JSONL (timestamp in s, 16-token per-block content hashes, chat sessions)."""
    schema = {
        "chat_id": pl.Int64,
        "parent_chat_id": pl.Int64,
        "timestamp": pl.Float64,
        "input_length": pl.Int64,
        "output_length": pl.Int64,
        "type": pl.String,
        "turn": pl.Int64,
        "hash_ids": pl.List(pl.Int64),
    }
    fields = {
        "chat_id": int,
        "parent_chat_id": int,
        "timestamp": (int, float),
        "input_length": int,
        "output_length": int,
        "type": str,
        "turn": int,
        "hash_ids": list,
    }
    df, lines = _read_jsonl(path, schema, fields)
    offsets, ids = _list_arrays(df.get_column("hash_ids"))
    _check_hash_ids(path, lines, offsets, ids)
    chat_id = df.get_column("chat_id").to_numpy()
    roots = _session_roots(chat_id, df.get_column("parent_chat_id").to_numpy())
    if roots is None:
        raise InputError("parent_chat_id links form a cycle", path=path, column="parent_chat_id")
    extra = {
        "request_id": pa.array(chat_id, type=pa.int64()),
        "session_id": pa.array(chat_id[roots], type=pa.int64()),
        "type": pa.array(df.get_column("type").to_numpy().astype(str)).dictionary_encode(),
        "turn": pa.array(df.get_column("turn").to_numpy(), type=pa.int64()),
    }
    return _validated(
        path,
        lines,
        lambda: Trace.from_arrays(
            arrival_s=df.get_column("timestamp").to_numpy(),
            input_tokens=df.get_column("input_length").to_numpy(),
            output_tokens=df.get_column("output_length").to_numpy(),
            hash_offsets=offsets,
            hashes=chain_hashes(offsets, ids.astype(np.uint64)),
            block_tokens=BAILIAN_BLOCK_TOKENS,
            source=f"bailian:{os.path.basename(path)}",
            extra_columns=extra,
        ),
    )


# -- CSV ------------------------------------------------------------------------------------------
def _csv_row_lines(data: bytes, n_rows: int) -> np.ndarray:
    """1-based line number where each data row starts (line 1 is the header).

    Without quote characters every row is one line; a quoted field may hold newlines, and then
    the rows are counted by Python's csv reader (which tracks physical lines).
    """
    if b'"' not in data:
        return np.arange(n_rows, dtype=np.int64) + 2
    reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
    starts = []
    line = 1
    for _ in reader:
        starts.append(line)
        line = reader.line_num + 1
    return np.asarray(starts[1 : n_rows + 1], dtype=np.int64)


def _first_bad_csv_line(data: bytes, path: str, err: Exception) -> InputError:
    """The first row with a field count other than the header's (error path only)."""
    reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
    try:
        header = next(reader)
        start = reader.line_num + 1
        for row in reader:
            if row and len(row) != len(header):
                return InputError(
                    f"row has {len(row)} fields, the header {len(header)}", path=path, line=start
                )
            start = reader.line_num + 1
    except csv.Error as cerr:
        return InputError(f"malformed CSV: {cerr}", path=path, line=reader.line_num)
    return InputError(f"malformed CSV: {' '.join(str(err).split())[:200]}", path=path)


# -- Azure ----------------------------------------------------------------------------------------
AZURE_COLUMNS = ("TIMESTAMP", "ContextTokens", "GeneratedTokens")


@_register("azure")
def import_azure(path: str) -> Trace:
    """Azure LLM inference CSV (2023/2024): wall-clock arrivals and lengths, no prefix hashes."""
    data = _read_bytes(path)
    try:
        df = pl.read_csv(data, infer_schema=False)
    except Exception as err:
        raise _first_bad_csv_line(data, path, err) from None
    for name in AZURE_COLUMNS:
        if name not in df.columns:
            raise InputError("missing CSV column", path=path, column=name)
    if df.height == 0:
        raise InputError("trace has no requests (only a header)", path=path)
    lines = _csv_row_lines(data, df.height)
    stamp = df.get_column("TIMESTAMP").str.strip_chars()
    # 7 fractional digits (100 ns) do not fit %.f's microseconds: keep 6, exact to 1 us
    stamp = stamp.str.replace(r"^(.*\.\d{6})\d+$", "${1}")
    when = stamp.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    context = df.get_column("ContextTokens").str.strip_chars().cast(pl.Int64, strict=False)
    generated = df.get_column("GeneratedTokens").str.strip_chars().cast(pl.Int64, strict=False)
    _check_rows(
        path,
        lines,
        [
            ("TIMESTAMP", when.is_null().to_numpy(), "not a timestamp like 2023-11-16 18:17:03.97"),
            ("ContextTokens", context.is_null().to_numpy(), "not an integer"),
            ("GeneratedTokens", generated.is_null().to_numpy(), "not an integer"),
        ],
    )
    micros = when.dt.epoch("us").to_numpy()
    arrival = (micros - micros.min()) / 1e6
    n = df.height
    return _validated(
        path,
        lines,
        lambda: Trace.from_arrays(
            arrival_s=arrival,
            input_tokens=context.to_numpy(),
            output_tokens=generated.to_numpy(),
            hash_offsets=np.zeros(n + 1, dtype=np.int64),
            hashes=np.zeros(0, dtype=np.uint64),
            block_tokens=16,  # nominal: the trace has no hashes, so no granularity of its own
            source=f"azure:{os.path.basename(path)}",
            has_prefix_info=False,
        ),
        {
            "arrival_s": "TIMESTAMP",
            "input_tokens": "ContextTokens",
            "output_tokens": "GeneratedTokens",
        },
    )
