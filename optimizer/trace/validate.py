"""Validation of request-trace/1 tables.

Every check is vectorised (pyarrow / numpy / polars) and reports the *first* offending row as
an :class:`~kvtier.errors.InputError` naming the file, the row and the column, so that a
user can open the file at that place. Nothing is dropped silently: a table either passes whole
or is refused. The one repair made is ordering: rows not sorted by ``arrival_s`` are sorted
stably, with a warning, because many public traces are merged from shards.
"""

from __future__ import annotations

import warnings

import numpy as np
import pyarrow as pa

from kvtier.errors import InputError
from kvtier.trace.format import HASH_TYPE, MAX_TOKENS, REQUIRED_COLUMNS, arrow_of, numpy_of

# Arrivals are seconds from the trace's start in float64; a value at which consecutive floats lie
# more than a microsecond apart (from 2**33 s, about 272 years, on) cannot order the events of
# a step-time model that works in microseconds, so such a trace is refused rather than replayed
# with its times silently rounded. Readers also shift arrivals to start at 0 (kvtier.trace.io).
ARRIVAL_RESOLUTION_S = 1e-6
ARRIVAL_LIMIT_S = float(2**33)


class UnsortedTraceWarning(UserWarning):
    """The trace's rows were not in arrival order and have been sorted stably."""


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _column(table: pa.Table, name: str) -> pa.Array:
    col = table.column(name)
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _check_no_nulls(arr: pa.Array, name: str, path: str | None) -> None:
    if arr.null_count:
        row = _first(np.asarray(arr.is_null().to_numpy(zero_copy_only=False)))
        raise InputError("missing value", path=path, row=row, column=name)


def _numeric(table: pa.Table, name: str, path: str | None, kind: str) -> np.ndarray:
    """The column as numpy, after checking its Arrow type is of ``kind`` (float or int)."""
    arr = _column(table, name)
    t = arr.type
    ok = pa.types.is_floating(t) if kind == "float" else pa.types.is_integer(t)
    if not ok:
        want = "a floating-point type (float64)" if kind == "float" else "an integer type"
        raise InputError(f"has type {t}, expected {want}", path=path, column=name)
    _check_no_nulls(arr, name, path)
    return numpy_of(arr)


def _token_counts(table: pa.Table, name: str, path: str | None, minimum: int) -> np.ndarray:
    """A token-count column as int64, checked in its own type first (an unsigned or huge value
    must not wrap around on the cast and then be reported as nonsense)."""
    raw = _numeric(table, name, path, "int")
    if len(raw) and raw.dtype.kind == "i" and (raw < minimum).any():
        relation = "> 0" if minimum == 1 else ">= 0"
        raise InputError(
            f"{name} must be {relation}", path=path, row=_first(raw < minimum), column=name
        )
    if len(raw) and (raw > MAX_TOKENS).any():
        row = _first(raw > MAX_TOKENS)
        raise InputError(
            f"{name} {int(raw[row])} is above the supported maximum of {MAX_TOKENS:,} tokens",
            path=path,
            row=row,
            column=name,
        )
    counts = raw.astype(np.int64, copy=False)
    if (counts < minimum).any():  # unsigned zero
        relation = "> 0" if minimum == 1 else ">= 0"
        raise InputError(
            f"{name} must be {relation}", path=path, row=_first(counts < minimum), column=name
        )
    return counts


def _check_hash_type(arr: pa.Array, path: str | None) -> pa.Array:
    t = arr.type
    if not (pa.types.is_list(t) or pa.types.is_large_list(t)) or not pa.types.is_integer(
        t.value_type
    ):
        raise InputError(f"has type {t}, expected list<uint64>", path=path, column="block_hashes")
    _check_no_nulls(arr, "block_hashes", path)
    if arr.values.null_count:
        bad = np.asarray(arr.values.is_null().to_numpy(zero_copy_only=False))
        offsets = numpy_of(arr.offsets)
        row = int(np.searchsorted(offsets, _first(bad) + offsets[0], side="right") - 1)
        raise InputError("null hash in list", path=path, row=row, column="block_hashes")
    if pa.types.is_signed_integer(t.value_type) and len(arr.values):
        values = numpy_of(arr.values)
        if values.min() < 0:
            offsets = numpy_of(arr.offsets)
            row = int(np.searchsorted(offsets, _first(values < 0) + offsets[0], side="right") - 1)
            raise InputError("negative hash", path=path, row=row, column="block_hashes")
    return arr.cast(HASH_TYPE) if t != HASH_TYPE else arr


# Up to this many hashes are checked with NumPy's sort (0.03 s of CPU for 250,000, and no polars
# to import, which costs 0.2 s); more with polars' hash grouping, which is faster on millions.
NUMPY_CHECK_MAX = 1 << 20


def check_chained(offsets: np.ndarray, hashes: np.ndarray, path: str | None = None) -> None:
    """Refuse hashes that cannot be chained prefix hashes.

    A chained hash stands for its whole prefix, so one hash must always appear at the same
    block position and after the same parent hash. The first row that breaks this is reported.
    """
    if len(hashes) == 0:
        return
    counts = np.diff(offsets)
    rows = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
    pos = np.arange(len(hashes), dtype=np.int64) - np.repeat(offsets[:-1], counts)
    parent = np.empty_like(hashes)
    parent[0] = 0
    parent[1:] = hashes[:-1]
    parent[pos == 0] = 0  # position 0 has no parent; the position check covers it
    if len(hashes) <= NUMPY_CHECK_MAX:
        # each hash's first position and parent, by NumPy's sort (no polars to import)
        _, first, inv = np.unique(hashes, return_index=True, return_inverse=True)
        pos0 = pos[first][inv]
        wrong = (pos != pos0) | (parent != parent[first][inv])
        if wrong.any():
            i = _first(wrong)
            raise chain_error(int(pos[i]), int(pos0[i]), path=path, row=int(rows[i]))
        return
    import polars as pl

    df = pl.DataFrame({"h": hashes, "pos": pos, "parent": parent, "row": rows})
    bad = (
        df.with_columns(
            pl.col("pos").first().over("h").alias("pos0"),
            pl.col("parent").first().over("h").alias("parent0"),
        )
        .filter((pl.col("pos") != pl.col("pos0")) | (pl.col("parent") != pl.col("parent0")))
        .select("row", "pos", "pos0")
        .head(1)
    )
    if bad.height:
        row, p, p0 = bad.row(0)
        raise chain_error(p, p0, path=path, row=row)


def chain_error(p: int, p0: int, *, path: str | None, row: int) -> InputError:
    """The error of a hash at block ``p`` of ``row`` that was first seen at block ``p0`` (or,
    when ``p == p0``, after another parent hash)."""
    what = (
        f"hash at block {p} also appears at block {p0}"
        if p != p0
        else f"hash at block {p} follows a different parent hash than before"
    )
    return InputError(
        f"hashes are not chained prefix hashes: {what}", path=path, row=row, column="block_hashes"
    )


def validate_table(
    table: pa.Table,
    *,
    block_tokens: int,
    path: str | None = None,
    has_prefix_info: bool = True,
) -> pa.Table:
    """Check ``table`` against request-trace/1 and return it normalised and sorted by arrival.

    Normalisation casts ``arrival_s`` to float64, token counts to int64 and ``block_hashes`` to
    list<uint64>; other columns are kept unchanged. Raises :class:`InputError` on the first
    problem found.
    """
    if not 0 < block_tokens <= MAX_TOKENS:
        raise InputError(
            f"block_tokens must be in [1, {MAX_TOKENS:,}], got {block_tokens}", path=path
        )
    for name in REQUIRED_COLUMNS:
        if name not in table.column_names:
            raise InputError("missing required column", path=path, column=name)
    if table.num_rows == 0:
        raise InputError("trace has no requests (empty table)", path=path)

    arrival = _numeric(table, "arrival_s", path, "float").astype(np.float64, copy=False)
    bad = ~np.isfinite(arrival)
    if bad.any():
        raise InputError(
            "arrival is NaN or infinite", path=path, row=_first(bad), column="arrival_s"
        )
    if (arrival < 0).any():
        raise InputError(
            "arrival is negative", path=path, row=_first(arrival < 0), column="arrival_s"
        )
    latest = int(np.argmax(arrival))
    if np.spacing(arrival[latest]) > ARRIVAL_RESOLUTION_S:
        raise InputError(
            f"arrival {arrival[latest]:.6g} s is too large to tell microseconds apart (float64 "
            f"steps of {np.spacing(arrival[latest]):.3g} s there; from about "
            f"{ARRIVAL_LIMIT_S:.3g} s on): give arrivals in seconds from the trace's start "
            "(an epoch timestamp, or milliseconds read as seconds?)",
            path=path,
            row=latest,
            column="arrival_s",
        )
    inp = _token_counts(table, "input_tokens", path, 1)
    out = _token_counts(table, "output_tokens", path, 0)

    hashes = _check_hash_type(_column(table, "block_hashes"), path)
    offsets = numpy_of(hashes.offsets).astype(np.int64)
    counts = np.diff(offsets)
    if has_prefix_info:
        expected = (inp + block_tokens - 1) // block_tokens
        wrong = counts != expected
        if wrong.any():
            row = _first(wrong)
            raise InputError(
                f"has {counts[row]} hashes, expected ceil({inp[row]} / {block_tokens}) = "
                f"{expected[row]}",
                path=path,
                row=row,
                column="block_hashes",
            )
        values = numpy_of(hashes.values)[offsets[0] : offsets[-1]]
        check_chained(offsets - offsets[0], np.ascontiguousarray(values, dtype=np.uint64), path)
    elif counts.any():
        raise InputError(
            "trace says it has no prefix information but lists hashes",
            path=path,
            row=_first(counts != 0),
            column="block_hashes",
        )

    session = _check_optional_columns(table, path)

    columns = {name: table.column(name) for name in table.column_names}
    if session is not None:
        columns["session_id"] = session
    columns["arrival_s"] = arrow_of(arrival, pa.float64())
    columns["input_tokens"] = arrow_of(inp, pa.int64())
    columns["output_tokens"] = arrow_of(out, pa.int64())
    columns["block_hashes"] = hashes
    result = pa.table(columns, metadata=table.schema.metadata)

    if (np.diff(arrival) < 0).any():
        warnings.warn(
            f"{path or 'trace'}: rows were not sorted by arrival_s; sorted them (stable)",
            UnsortedTraceWarning,
            stacklevel=2,
        )
        result = result.take(pa.array(np.argsort(arrival, kind="stable")))
    return result


def _repeated(col: pa.Array) -> np.ndarray:
    """Rows whose value appeared on an earlier row. Arrow's dictionary encoding numbers values
    in order of first appearance, so a row is a first one iff its code exceeds every earlier
    code."""
    import pyarrow.compute as pc

    codes = numpy_of(pc.dictionary_encode(col).indices).astype(np.int64)
    seen = np.maximum.accumulate(np.concatenate(([-1], codes[:-1])))
    return codes <= seen


def _check_optional_columns(table: pa.Table, path: str | None) -> pa.Array | None:
    """Check the optional columns; returns ``session_id`` normalised to int64 (or None)."""
    names = table.column_names
    session = None
    if "request_id" in names:
        col = _column(table, "request_id")
        if not (
            pa.types.is_integer(col.type)
            or pa.types.is_string(col.type)
            or pa.types.is_large_string(col.type)
        ):
            raise InputError(
                f"has type {col.type}, expected int64 or string", path=path, column="request_id"
            )
        _check_no_nulls(col, "request_id", path)
        repeated = _repeated(col)
        if repeated.any():
            # the first row whose id was already used earlier
            raise InputError(
                "duplicate request id", path=path, row=_first(repeated), column="request_id"
            )
    if "session_id" in names:
        col = _column(table, "session_id")
        if not pa.types.is_integer(col.type):
            raise InputError(f"has type {col.type}, expected int64", path=path, column="session_id")
        _check_no_nulls(col, "session_id", path)
        ids = numpy_of(col)
        if ids.dtype == np.uint64 and len(ids) and (ids > np.iinfo(np.int64).max).any():
            row = _first(ids > np.iinfo(np.int64).max)
            raise InputError(
                f"session id {int(ids[row])} does not fit int64",
                path=path,
                row=row,
                column="session_id",
            )
        session = arrow_of(ids.astype(np.int64, copy=False), pa.int64())
    if "tenant" in names:
        col = _column(table, "tenant")
        t = col.type.value_type if pa.types.is_dictionary(col.type) else col.type
        if not (pa.types.is_string(t) or pa.types.is_large_string(t)):
            raise InputError(f"has type {col.type}, expected string", path=path, column="tenant")
        _check_no_nulls(col, "tenant", path)
    if "pass" in names:
        col = _column(table, "pass")
        if not pa.types.is_integer(col.type):
            raise InputError(f"has type {col.type}, expected int32", path=path, column="pass")
        _check_no_nulls(col, "pass", path)
    return session
