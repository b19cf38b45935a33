"""Request logs as tables of lengths: the shared core of the Azure, BurstGPT and mapped importers.

A source row gives an arrival (a wall-clock timestamp, or seconds / milliseconds from any
origin), prompt and output token counts, and optionally a request id, a session id, a tenant
and, in JSON Lines, a list of chained block hash ids. Without hashes the trace has no prefix
information (``kvtier.prefix_info = false``): stats and replays then say so plainly.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import polars as pl
import pyarrow as pa

from kvtier.errors import InputError
from kvtier.trace.format import Trace
from kvtier.trace.importers.common import check_hash_ids, check_rows, list_arrays, validated

ARRIVAL_KINDS = ("auto", "timestamp", "s", "ms")  # auto: seconds if every value is a number
NOMINAL_BLOCK_TOKENS = 16  # a trace without hashes has no granularity of its own


@dataclass(frozen=True)
class ColumnMap:
    """Which source column holds each trace field (None: absent)."""

    arrival: str
    input: str
    output: str
    arrival_kind: str = "auto"  # one of ARRIVAL_KINDS
    request_id: str | None = None
    session_id: str | None = None
    tenant: str | None = None
    hashes: str | None = None
    block_tokens: int = NOMINAL_BLOCK_TOKENS  # granularity of ``hashes``
    keep: tuple[tuple[str, str], ...] = ()  # (trace column, source column) kept as they are

    def used(self) -> dict[str, str]:
        """Trace column -> source column, for error messages in the source's own terms."""
        out = {"arrival_s": self.arrival, "input_tokens": self.input, "output_tokens": self.output}
        for trace_col, src in (
            ("request_id", self.request_id),
            ("session_id", self.session_id),
            ("tenant", self.tenant),
            ("block_hashes", self.hashes),
        ):
            if src is not None:
                out[trace_col] = src
        return out


def _timestamp_parts(name: str) -> tuple[pl.Expr, pl.Expr]:
    """The naive and the UTC-offset readings of column ``name`` (each null where the text is
    not of its kind)."""
    s = pl.col(name).str.strip_chars().str.replace(r"^(\d{4}-\d\d-\d\d)T", "${1} ")
    s = s.str.replace(r"Z$", "+00:00").str.replace(r"^(.*\.\d{6})\d+", "${1}")
    naive = s.str.to_datetime("%Y-%m-%d %H:%M:%S%.f", strict=False, time_unit="us")
    aware = s.str.to_datetime(
        "%Y-%m-%d %H:%M:%S%.f%:z", strict=False, time_unit="us", time_zone="UTC"
    )
    return naive, aware


def timestamp_expr(name: str) -> pl.Expr:
    """Microseconds since the epoch of the wall-clock timestamps in column ``name``, null
    where unparseable.

    Accepts ``2023-11-16 18:17:03.9799600`` (naive, read as UTC; digits past microseconds are
    cut), ``2024-05-10 00:00:00.009930+00:00`` (with a UTC offset), a ``T`` separator and a
    trailing ``Z``; the fraction is optional.
    """
    naive, aware = _timestamp_parts(name)
    return naive.dt.epoch("us").fill_null(aware.dt.epoch("us")).cast(pl.Float64)


def timestamp_aware_expr(name: str) -> pl.Expr:
    """Whether each timestamp of column ``name`` carries a UTC offset (null if unparseable).

    A log mixing the two kinds is refused: a naive time is read as UTC, which is a guess that
    a log writing offsets elsewhere says is wrong (it may be local time)."""
    naive, aware = _timestamp_parts(name)
    return pl.when(naive.is_not_null()).then(False).when(aware.is_not_null()).then(True)


TIMESTAMP_MIX = (
    "a timestamp {0} a UTC offset, the first one {1}: a log must not mix naive and "
    "UTC-offset timestamps"
)


def mixed_timestamp(aware: np.ndarray, first: bool | None) -> tuple[int, str] | None:
    """The first row whose timestamp kind (``aware``, no nulls) differs from ``first`` (the
    log's first row's, or this batch's first if None), with the message naming both."""
    if len(aware) == 0:
        return None
    want = bool(aware[0]) if first is None else first
    other = np.flatnonzero(aware != want)
    if len(other) == 0:
        return None
    row = int(other[0])
    has = "with" if aware[row] else "without"
    first_has = "with one" if want else "without"
    return row, TIMESTAMP_MIX.format(has, first_has)


def parse_timestamps(text: pl.Series) -> pl.Series:
    """:func:`timestamp_expr` of a series of strings."""
    return pl.DataFrame({"t": text}).select(timestamp_expr("t")).to_series()


def _where(keep: pl.Series, values: pl.Series) -> pl.Series:
    """``values`` with null wherever ``keep`` is false or null."""
    frame = pl.DataFrame({"keep": keep, "v": values})
    return frame.select(pl.when(pl.col("keep")).then(pl.col("v")).otherwise(None)).to_series()


def _integers(df: pl.DataFrame, name: str) -> pl.Series:
    col = df.get_column(name)
    if col.dtype == pl.String:
        col = col.str.strip_chars()
    if col.dtype.is_float():
        whole = col.is_finite() & (col == col.floor())
        return _where(whole, col).cast(pl.Int64, strict=False)
    return col.cast(pl.Int64, strict=False)


def _floats(df: pl.DataFrame, name: str) -> pl.Series:
    col = df.get_column(name)
    if col.dtype == pl.String:
        col = col.str.strip_chars()
    out = col.cast(pl.Float64, strict=False)
    return _where(out.is_finite(), out)


@dataclass
class ArrivalState:
    """What a streamed import carries from batch to batch of a log: how arrivals read
    (decided on the first batch), the first arrival (the trace's origin) and the last one."""

    kind: str | None = None
    aware: bool | None = None  # timestamps: whether the first carried a UTC offset
    origin: float | None = None
    last: float = -np.inf

    def check_order(self, path: str, lines: np.ndarray, t: np.ndarray, column: str) -> None:
        """Refuse a row arriving before the row above it (sorting would need the whole log)."""
        previous = np.concatenate(([self.last], t[:-1]))
        unsorted = t < previous
        if unsorted.any():
            raise InputError(
                "earlier than the row before: a streamed import needs rows in arrival order "
                "(sort the file first)",
                path=path,
                line=int(lines[int(np.flatnonzero(unsorted)[0])]),
                column=column,
            )
        if self.origin is None:
            self.origin = float(t[0])
        self.last = float(t[-1])


def lengths_trace(
    path: str,
    df: pl.DataFrame,
    lines: np.ndarray,
    cmap: ColumnMap,
    source: str,
    state: ArrivalState | None = None,
) -> Trace:
    """Build and validate the trace of ``df`` under ``cmap``; errors name line and column.

    With ``state``, ``df`` is one batch of a streamed import: arrivals read as in the first
    batch, count from the first batch's first arrival and must be in order.
    """
    for name in cmap.used().values():
        if name not in df.columns:
            raise InputError(
                f"missing column (the file has: {', '.join(df.columns)})", path=path, column=name
            )
    if df.height == 0:
        raise InputError("trace has no requests (only a header)", path=path)
    kind = cmap.arrival_kind if state is None or state.kind is None else state.kind
    if kind == "auto":
        numeric = _floats(df, cmap.arrival)
        kind = "s" if numeric.null_count() == 0 else "timestamp"
    if kind == "timestamp":
        when = parse_timestamps(df.get_column(cmap.arrival).cast(pl.String))
        arrival_bad = "not a timestamp like 2023-11-16 18:17:03.97 or 2024-05-10 00:00:00+00:00"
    else:
        when = _floats(df, cmap.arrival)
        arrival_bad = "not a finite number"
    inp = _integers(df, cmap.input)
    out = _integers(df, cmap.output)
    check_rows(
        path,
        lines,
        [
            (cmap.arrival, when.is_null().to_numpy(), arrival_bad),
            (cmap.input, inp.is_null().to_numpy(), "not an integer"),
            (cmap.output, out.is_null().to_numpy(), "not an integer"),
        ],
    )
    if kind == "timestamp":
        aware = (
            pl.DataFrame({"t": df.get_column(cmap.arrival).cast(pl.String)})
            .select(timestamp_aware_expr("t"))
            .to_series()
            .to_numpy()
            .astype(bool)
        )
        mixed = mixed_timestamp(aware, None if state is None else state.aware)
        if mixed is not None:
            raise InputError(mixed[1], path=path, line=int(lines[mixed[0]]), column=cmap.arrival)
        if state is not None and state.aware is None:
            state.aware = bool(aware[0])
    t = when.to_numpy().astype(np.float64)
    scale = {"timestamp": 1e-6, "s": 1.0, "ms": 1e-3}[kind]
    if state is None:
        arrival = (t - t.min()) * scale
    else:
        state.kind = kind
        state.check_order(path, lines, t, cmap.arrival)
        arrival = (t - state.origin) * scale
    extra: dict[str, pa.Array] = {}
    if cmap.request_id is not None:
        extra["request_id"] = _id_column(df, cmap.request_id)
    if cmap.session_id is not None:
        ids = _integers(df, cmap.session_id)
        check_rows(path, lines, [(cmap.session_id, ids.is_null().to_numpy(), "not an integer")])
        extra["session_id"] = pa.array(ids.to_numpy(), type=pa.int64())
    if cmap.tenant is not None:
        tenant = df.get_column(cmap.tenant).cast(pl.String)
        check_rows(path, lines, [(cmap.tenant, tenant.is_null().to_numpy(), "missing tenant")])
        extra["tenant"] = tenant.to_arrow().dictionary_encode()
    for trace_col, src in cmap.keep:
        if src in df.columns:
            extra[trace_col] = df.get_column(src).cast(pl.String).to_arrow().dictionary_encode()
    n = df.height
    if cmap.hashes is not None:
        offsets, ids = list_arrays(df.get_column(cmap.hashes))
        check_hash_ids(path, lines, offsets, ids)
        hashes, prefix, block = ids.astype(np.uint64), True, cmap.block_tokens
    else:
        offsets = np.zeros(n + 1, dtype=np.int64)
        hashes, prefix, block = np.zeros(0, dtype=np.uint64), False, NOMINAL_BLOCK_TOKENS
    return validated(
        path,
        lines,
        lambda: Trace.from_arrays(
            arrival_s=arrival,
            input_tokens=inp.to_numpy(),
            output_tokens=out.to_numpy(),
            hash_offsets=offsets,
            hashes=hashes,
            block_tokens=block,
            source=f"{source}:{os.path.basename(path)}",
            has_prefix_info=prefix,
            extra_columns=extra,
        ),
        cmap.used(),
    )


def _id_column(df: pl.DataFrame, name: str) -> pa.Array:
    col = df.get_column(name)
    as_int = _integers(df, name) if col.dtype != pl.String else col.cast(pl.Int64, strict=False)
    if as_int.null_count() == 0:
        return pa.array(as_int.to_numpy(), type=pa.int64())
    return col.cast(pl.String).to_arrow()
