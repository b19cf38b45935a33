"""What every importer shares: reading bytes, line numbers, row checks, source column names.

Parsing is vectorised (polars); a Python loop runs only after a parse failure, to find and
report the first malformed line by its line number.
"""

from __future__ import annotations

import csv
import gzip
import io
import json
import math
import zlib
from collections.abc import Callable

import numpy as np
import polars as pl
import pyarrow as pa

from kvtier.errors import InputError
from kvtier.trace.format import Trace
from kvtier.trace.io import read_input

_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
_INT64_MAX = (1 << 63) - 1


def read_bytes(path: str) -> bytes:
    """The file's bytes: gzip-compressed files are decompressed, a UTF-8 byte-order mark is
    dropped (line numbers are unchanged by either), and text that is not UTF-8 is refused."""
    data = read_input(path)
    if data.startswith(_GZIP_MAGIC):
        try:
            data = gzip.decompress(data)
        except (OSError, EOFError, zlib.error) as err:
            raise InputError(f"corrupt gzip file: {err}", path=path) from None
    data = check_utf8(path, 1, data.removeprefix(_UTF8_BOM))
    if not data.strip():
        raise InputError("empty file", path=path)
    return data


def check_utf8(path: str, first_line: int, data: bytes) -> bytes:
    """``data`` (lines of ``path`` from ``first_line`` on) if it is UTF-8 text, else a one-line
    error naming the line of the first bad byte."""
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"not UTF-8 text (byte 0x{data[err.start]:02x}); is the file compressed?",
            path=path,
            line=first_line + data.count(b"\n", 0, err.start),
        ) from None
    return data


def content_line_numbers(data: bytes) -> np.ndarray:
    """1-based line numbers of the non-blank lines, i.e. of the parsed rows, in order.

    A line of only spaces, tabs or ``\\r`` is blank, as the JSON Lines reader skips it. A line
    that starts with a visible byte holds content; only lines starting with white space are
    looked at further (few in any real log).
    """
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == ord("\n"))
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [len(buf)]))
    if len(buf) == 0:
        return np.zeros(0, dtype=np.int64)
    white = np.frombuffer(b" \t\r\n", dtype=np.uint8)
    nonempty = ends > starts
    leading = np.isin(buf[np.minimum(starts, len(buf) - 1)], white)
    content = nonempty & ~leading
    unsure = np.flatnonzero(nonempty & leading)
    if len(unsure) > 1_000:  # many indented lines: count visible bytes over the whole buffer
        visible = ~np.isin(buf, white)
        cum = np.concatenate(([0], np.cumsum(visible, dtype=np.int64)))
        return np.flatnonzero(cum[ends] - cum[starts] > 0) + 1
    for i in unsure:
        content[i] = bool(data[starts[i] : ends[i]].strip(b" \t\r\n"))
    return np.flatnonzero(content) + 1


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


def first_bad_json_line(data: bytes, fields: dict[str, type | tuple[type, ...]]) -> InputError:
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


# every JSON string, with the colon after it when it is an object key: matched left to right,
# string tokens of valid JSON are found from their opening quote, so values never read as keys
_JSON_STRING = r'"(?:[^"\\]|\\.)*"\s*:?'
_EXACT_SIGNATURES = 64  # distinct key sequences whose first line is parsed for its own keys


class _DuplicateKey(ValueError):
    def __init__(self, key: str) -> None:
        super().__init__(key)
        self.key = key


def _refuse_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    """``object_pairs_hook`` for :func:`json.loads` that raises on a key given twice."""
    seen: set[str] = set()
    for key, _ in pairs:
        if key in seen:
            raise _DuplicateKey(key)
        seen.add(key)
    return dict(pairs)


def _key_counts(data: bytes) -> np.ndarray:
    """Per line of ``data``, the colons that follow a closing quote (white space between
    allowed): the keys of a line whose strings hold no such colon."""
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == ord("\n"))
    colons = np.flatnonzero(buf == ord(":"))
    prev = colons - 1
    white = np.frombuffer(b" \t\r\n", dtype=np.uint8)
    while True:
        step = (prev >= 0) & np.isin(buf[np.maximum(prev, 0)], white)
        if not step.any():
            break
        prev[step] -= 1
    keyed = colons[(prev >= 0) & (buf[np.maximum(prev, 0)] == ord('"'))]
    return np.bincount(np.searchsorted(newlines, keyed), minlength=len(newlines) + 1)


def scan_keys(data: bytes, path: str, first_line: int = 1, required: int | None = None) -> set[str]:
    """The field names of the objects on the JSON Lines ``data`` (the file's lines from
    ``first_line`` on); a key given twice in one object is refused by line and key.

    A JSON reader keeps the last of two values under one key without a word. Python's
    ``object_pairs_hook`` on every line would cost as much as the parse itself, so the keys
    are first listed by a vectorised scan of string tokens; only a line where a key repeats
    (or holds an escape, which may spell another key) is parsed exactly, and a repeat in two
    different nested objects is not an error.
    """
    if required is None:
        text = data.decode("utf-8")
        frame = pl.DataFrame({"line": text.split("\n")}).with_row_index("i")
    else:
        # every line is known to hold the ``required`` fields: one with exactly that many key
        # tokens repeats none and has no other; only the rest are scanned
        other = np.flatnonzero(_key_counts(data) != required)
        if len(other) == 0:
            return set()
        pieces = data.split(b"\n")
        picked = [pieces[k].decode("utf-8") for k in other]
        frame = pl.DataFrame(
            {"i": pl.Series(other, dtype=pl.UInt32), "line": pl.Series(picked, dtype=pl.String)}
        )
    frame = frame.with_columns(
        pl.col("line")
        .str.extract_all(_JSON_STRING)
        .list.eval(pl.element().filter(pl.element().str.ends_with(":")))
        .list.eval(pl.element().str.replace(r"\s*:$", ""))
        .alias("keys")
    )
    suspect = frame.filter(
        (pl.col("keys").list.len() != pl.col("keys").list.n_unique())
        | pl.col("keys").list.eval(pl.element().str.contains("\\", literal=True)).list.any()
    )
    for i, line in suspect.select("i", "line").iter_rows():
        try:
            json.loads(line, object_pairs_hook=_refuse_duplicates)
        except _DuplicateKey as dup:
            raise InputError(
                "key given twice in one object (a reader would keep the last value)",
                path=path,
                line=first_line + int(i),
                column=dup.key,
            ) from None
        except ValueError:
            continue  # malformed: the parser reports it
    signatures = (
        frame.filter(pl.col("keys").list.len() > 0)
        .with_columns(pl.col("keys").list.join("\x00").alias("sig"))
        .unique(subset="sig", keep="first", maintain_order=True)
    )
    found: set[str] = set()
    for n, (line, keys) in enumerate(signatures.select("line", "keys").iter_rows()):
        obj = None
        if n < _EXACT_SIGNATURES:
            try:
                obj = json.loads(line)
            except ValueError:
                obj = None
        if isinstance(obj, dict):
            found.update(obj)
        else:  # many shapes: the keys of any object on the line
            found.update(str(json.loads(k)) for k in keys)
    return found


class IgnoredFieldsNote(UserWarning):
    """Fields of a JSON Lines log that its format does not read (said once per import)."""

    label = "note"


def note_ignored(path: str, keys: set[str], used: set[str]) -> None:
    """Say once which fields of ``path`` the import does not read, so none is dropped
    silently."""
    ignored = sorted(keys - used)
    if ignored:
        import warnings

        warnings.warn(
            f"{path}: fields not read by this format, ignored: {', '.join(ignored)}",
            IgnoredFieldsNote,
            stacklevel=3,
        )


def read_jsonl(
    path: str, schema: dict[str, pl.DataType], fields: dict
) -> tuple[pl.DataFrame, np.ndarray]:
    """The JSON Lines file ``path`` read whole with ``schema``, and each row's line number;
    fields the schema does not read are named in a note."""
    keys: set[str] = set()
    df, lines = parse_jsonl(read_bytes(path), path, schema, fields, keys=keys)
    note_ignored(path, keys, set(schema))
    return df, lines


def parse_jsonl(
    data: bytes,
    path: str,
    schema: dict[str, pl.DataType],
    fields: dict,
    first_line: int = 1,
    keys: set[str] | None = None,
) -> tuple[pl.DataFrame, np.ndarray]:
    """Rows of JSON Lines ``data`` (the file's lines from ``first_line`` on) under ``schema``,
    and each row's line number; the first malformed line, missing field or key given twice
    is reported. The field names seen are added to ``keys`` when given."""
    try:
        df = pl.read_ndjson(data, schema=schema)
    except Exception:  # polars raises several error types for bad input
        raise _shifted(first_bad_json_line(data, fields), first_line).with_path(path) from None
    lines = content_line_numbers(data) + (first_line - 1)
    if len(lines) != df.height:  # whitespace-only lines or other oddities: find the line
        raise _shifted(first_bad_json_line(data, fields), first_line).with_path(path)
    seen = scan_keys(data, path, first_line, required=len(schema)) | set(schema)
    if keys is not None:
        keys.update(seen)
    for name in schema:
        nulls = df.get_column(name).is_null().to_numpy()
        if nulls.any():
            row = int(np.flatnonzero(nulls)[0])
            raise InputError(
                "missing field or null value", path=path, line=int(lines[row]), column=name
            )
    return df, lines


def _shifted(err: InputError, first_line: int) -> InputError:
    """``err`` with its line counted from the file's start, not from a chunk's."""
    if err.line is not None and first_line != 1:
        err.line += first_line - 1
        err.args = (err.format(),)
    return err


def check_rows(path: str, lines: np.ndarray, checks: list[tuple[str, np.ndarray, str]]) -> None:
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


def validated(
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


def check_hash_ids(path: str, lines: np.ndarray, offsets: np.ndarray, ids: np.ndarray) -> None:
    if len(ids) and ids.min() < 0:
        row = int(np.searchsorted(offsets, int(np.flatnonzero(ids < 0)[0]), side="right") - 1)
        raise InputError("negative hash id", path=path, line=int(lines[row]), column="hash_ids")


def list_arrays(series: pl.Series) -> tuple[np.ndarray, np.ndarray]:
    arr = series.to_arrow()
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = arr.cast(pa.large_list(pa.int64()))
    offsets = arr.offsets.to_numpy().astype(np.int64)
    values = arr.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], values


# -- CSV -------------------------------------------------------------------------------------------
def blank_record(row: list[str]) -> bool:
    """A CSV record of an empty or white-space-only line (skipped, as JSON Lines skips blank
    lines); a line of separators only (``,,``) is a record of empty fields, not blank."""
    return not row or (len(row) == 1 and not row[0].strip())


def csv_row_lines(data: bytes, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """1-based line number where each data row starts (line 1 is the header), and which rows
    are blank lines (a CSV reader makes a row of nulls of each; the caller drops them).

    Without quote characters every row is one line; a quoted field may hold newlines, and then
    the rows are counted by Python's csv reader (which tracks physical lines).
    """
    if b'"' not in data:
        buf = np.frombuffer(data, dtype=np.uint8)
        newlines = np.flatnonzero(buf == ord("\n"))
        starts = np.concatenate(([0], newlines + 1))[1 : n_rows + 1]
        ends = np.concatenate((newlines, [len(buf)]))[1 : n_rows + 1]
        visible = ~np.isin(buf, np.frombuffer(b" \t\r\n", dtype=np.uint8))
        cum = np.concatenate(([0], np.cumsum(visible, dtype=np.int64)))
        blank = cum[ends] - cum[starts] == 0
        return np.arange(len(starts), dtype=np.int64) + 2, blank
    reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
    starts = []
    blanks = []
    line = 1
    for row in reader:
        starts.append(line)
        blanks.append(blank_record(row))
        line = reader.line_num + 1
    return (
        np.asarray(starts[1 : n_rows + 1], dtype=np.int64),
        np.asarray(blanks[1 : n_rows + 1], dtype=bool),
    )


def check_header(header: list[str], path: str) -> None:
    """Refuse a header naming a column twice: a CSV reader would keep one of the two (polars
    renames the second), so the other's values would be dropped without a word."""
    seen: set[str] = set()
    for name in header:
        if name in seen:
            raise InputError("column named twice in the header", path=path, line=1, column=name)
        seen.add(name)


def header_of(data: bytes) -> list[str]:
    """The column names of CSV ``data`` (its first record, quoted as CSV allows)."""
    first = data.split(b"\n", 1)[0]
    return next(csv.reader([first.decode("utf-8")]), [])


def check_field_counts(data: bytes, path: str) -> None:
    """Refuse rows with fewer fields than the header (a CSV reader would fill them with nulls).

    Vectorised over the bytes when no field is quoted; with quotes, the csv module counts.
    """
    if b'"' in data:
        error = first_bad_csv_line(data, path, ValueError("ragged row"))
        if error.line is not None:
            raise error
        return
    buf = np.frombuffer(data, dtype=np.uint8)
    newlines = np.flatnonzero(buf == ord("\n"))
    starts = np.concatenate(([0], newlines + 1))
    ends = np.concatenate((newlines, [len(buf)]))
    commas = np.concatenate(([0], np.cumsum(buf == ord(","), dtype=np.int64)))
    visible = ~np.isin(buf, np.frombuffer(b" \t\r\n", dtype=np.uint8))
    cum = np.concatenate(([0], np.cumsum(visible, dtype=np.int64)))
    fields = commas[ends] - commas[starts] + 1
    content = cum[ends] - cum[starts] > 0
    if not content.any():
        return
    header = int(fields[np.flatnonzero(content)[0]])
    bad = content & (fields != header)
    if bad.any():
        line = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"row has {int(fields[line])} fields, the header {header}", path=path, line=line + 1
        )


def first_bad_csv_line(data: bytes, path: str, err: Exception) -> InputError:
    """The first row with a field count other than the header's (error path only)."""
    reader = csv.reader(io.StringIO(data.decode("utf-8"), newline=""))
    try:
        header = next(reader)
        start = reader.line_num + 1
        for row in reader:
            if not blank_record(row) and len(row) != len(header):
                return InputError(
                    f"row has {len(row)} fields, the header {len(header)}", path=path, line=start
                )
            start = reader.line_num + 1
    except csv.Error as cerr:
        return InputError(f"malformed CSV: {cerr}", path=path, line=reader.line_num)
    return InputError(f"malformed CSV: {' '.join(str(err).split())[:200]}", path=path)
