"""Importing request logs larger than memory: lazy scan, streamed sink, validation by batches.

A CSV log of lengths (Azure, BurstGPT, ``--from csv``) is scanned lazily with polars and sunk
to a temporary Parquet file by polars' streaming engine; a second pass reads it back in record
batches, checks every row as :mod:`kvtier.trace.validate` does (the first bad row is reported
by its line), and writes the request-trace/1 file batch by batch. Memory stays bounded by the
batch size whatever the file's length. The in-memory importers remain for smaller files (and
for gzip input, which cannot be scanned lazily); both give identical traces.

Rows must arrive in order: a file that is not sorted by arrival is refused with the first
line out of order (sort it first), since sorting would need the whole file in memory.
"""

from __future__ import annotations

import csv
import itertools
import os
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, BinaryIO

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kvtier.errors import InputError
from kvtier.files import atomic_write
from kvtier.trace.format import (
    FORMAT_VERSION,
    HASH_TYPE,
    MAX_TOKENS,
    META_BLOCK_TOKENS,
    META_FORMAT,
    META_PREFIX_INFO,
    META_SOURCE,
)
from kvtier.trace.importers.common import blank_record, check_header
from kvtier.trace.importers.tabular import (
    NOMINAL_BLOCK_TOKENS,
    ColumnMap,
    mixed_timestamp,
    timestamp_aware_expr,
    timestamp_expr,
)
from kvtier.trace.progress import count, stage

_GZIP_MAGIC = b"\x1f\x8b"
_UTF8_BOM = b"\xef\xbb\xbf"
BATCH_ROWS = 1 << 20


@dataclass(frozen=True)
class StreamPlan:
    """A streamed import: the column mapping, the source's name, and whether rows of failed
    requests (no prompt tokens, as BurstGPT records them) are left out with a warning."""

    cmap: ColumnMap
    source: str
    skip_failed: bool = False


@dataclass(frozen=True)
class StreamSummary:
    n_requests: int
    duration_s: float
    failed_rows: int = 0
    block_tokens: int = NOMINAL_BLOCK_TOKENS
    has_prefix_info: bool = False


def _number_expr(name: str, integer: bool) -> pl.Expr:
    raw = pl.col(name).str.strip_chars()
    return raw.cast(pl.Int64, strict=False) if integer else raw.cast(pl.Float64, strict=False)


_BLANK_LINE = re.compile(rb"\n[ \t\r]*(?:\n|[ \t\r]\Z)")


def _scan(path: str) -> tuple[bool, bool]:
    """Whether the file holds a quote character, and whether it may hold a blank line (one
    pass; chunks overlap by a few bytes so that a blank line across two is seen)."""
    quoted = blank = False
    tail = b""
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 24):
            quoted = quoted or b'"' in chunk
            window = tail + chunk
            blank = blank or _BLANK_LINE.search(window) is not None
            cut = window.rfind(b"\n")
            tail = window[cut:] if cut >= 0 and len(window) - cut < 4096 else b""
            if quoted and blank:
                break
    return quoted, blank


def _blank_rows(path: str, quoted: bool) -> Iterator[bool]:
    """For each data row polars reads (every record after the header), whether it is a blank
    line; read line by line, only for a file that :func:`_scan` found blank lines in."""
    with open(path, "rb") as fh:
        if not quoted:
            fh.readline()
            for raw in fh:
                yield not raw.strip(b" \t\r\n")
            return
        text = (raw.decode("utf-8", "replace") for raw in fh)
        reader = csv.reader(text)
        next(reader, None)
        for row in reader:
            yield blank_record(row)


def _header(path: str) -> list[str]:
    """The column names on the first line (quoted as CSV allows, after a byte-order mark).

    A gzip file is refused: polars scans plain text only, and decompressing in memory would
    break the bound a streamed import promises.
    """
    with open(path, "rb") as fh:
        head = fh.readline()
        if head.startswith(_GZIP_MAGIC):
            raise InputError(
                "a gzip-compressed CSV cannot be scanned in bounded memory: decompress it "
                "first, or import it in memory (--no-stream)",
                path=path,
                option="--stream",
            )
        if not head.strip() and not fh.read(1 << 16).strip():
            raise InputError("empty file", path=path)
    try:
        text = head.removeprefix(_UTF8_BOM).decode("utf-8")
    except UnicodeDecodeError as err:
        raise InputError(
            f"not UTF-8 text (byte 0x{head[err.start]:02x}); is the file compressed?",
            path=path,
            line=1,
        ) from None
    return next(csv.reader([text]), [])


def _first_bad_line(path: str, until: int | None = None) -> InputError | None:
    """The first line (up to line ``until``) that is not UTF-8, is malformed CSV, or holds a
    row with a field count other than the header's, as the in-memory import reports it.

    Error path only: the file is read line by line, in constant memory.
    """

    def lines(fh: BinaryIO) -> Iterator[str]:
        for number, raw in enumerate(fh, start=1):
            if number == 1:
                raw = raw.removeprefix(_UTF8_BOM)
            try:
                yield raw.decode("utf-8")
            except UnicodeDecodeError as err:
                raise InputError(
                    f"not UTF-8 text (byte 0x{raw[err.start]:02x}); is the file compressed?",
                    path=path,
                    line=number,
                ) from None

    with open(path, "rb") as fh:
        reader = csv.reader(lines(fh))
        try:
            header = next(reader, None)
            if header is None:
                return None
            start = reader.line_num + 1
            for row in reader:
                if until is not None and start > until:
                    return None
                if not blank_record(row) and len(row) != len(header):
                    return InputError(
                        f"row has {len(row)} fields, the header {len(header)}",
                        path=path,
                        line=start,
                    )
                start = reader.line_num + 1
        except csv.Error as err:
            return InputError(f"malformed CSV: {err}", path=path, line=reader.line_num)
        except InputError as err:
            return err
    return None


def _line_of(path: str, row: int, quoted: bool) -> int:
    """The line where data row ``row`` starts (line 1 is the header)."""
    if not quoted:
        return row + 2
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.reader(fh)
        next(reader)
        start = reader.line_num + 1
        for i, _ in enumerate(reader):
            if i == row:
                return start
            start = reader.line_num + 1
    return row + 2


def stream_import(
    path: str, plan: StreamPlan, out: str, *, batch_rows: int = BATCH_ROWS
) -> StreamSummary:
    """Import the CSV log ``path`` as ``plan`` says to the trace file ``out`` (Parquet)."""
    cmap, source = plan.cmap, plan.source
    if Path(out).suffix.lower() != ".parquet":
        raise InputError("a streamed import writes Parquet: name the output .parquet", path=out)
    if (
        cmap.hashes is not None
        or cmap.request_id
        or cmap.session_id
        or cmap.tenant
        or (cmap.keep and not plan.skip_failed)
    ):
        raise InputError(
            "streamed import reads arrival and lengths only; import smaller files in memory",
            option="--columns",
        )
    from kvtier.files import check_output

    check_output(out, option="--output")  # the staging directory goes beside it
    header = _header(path)
    check_header(header, path)
    for name in (cmap.arrival, cmap.input, cmap.output):
        if name not in header:
            raise InputError(
                f"missing column (the file has: {', '.join(header)})", path=path, column=name
            )
    kind = cmap.arrival_kind
    lazy = pl.scan_csv(path, infer_schema=False).select(cmap.arrival, cmap.input, cmap.output)
    if kind == "auto":
        probe = lazy.head(1000).collect()
        values = probe.get_column(cmap.arrival).str.strip_chars()
        values = values.filter(values.is_not_null() & (values != ""))  # blank lines read as null
        numeric = values.cast(pl.Float64, strict=False)
        kind = "s" if numeric.null_count() == 0 else "timestamp"
    arrival = (
        timestamp_expr(cmap.arrival)
        if kind == "timestamp"
        else _number_expr(cmap.arrival, integer=False)
    )
    scale = {"timestamp": 1e-6, "s": 1.0, "ms": 1e-3}[kind]
    frame = lazy.select(
        arrival.alias("t"),
        _number_expr(cmap.input, integer=True).alias("inp"),
        _number_expr(cmap.output, integer=True).alias("out"),
        *([timestamp_aware_expr(cmap.arrival).alias("aware")] if kind == "timestamp" else []),
    )
    stage("scanning the CSV")
    quoted, blanks = _scan(path)
    with tempfile.TemporaryDirectory(dir=Path(out).resolve().parent) as tmp:
        staged = os.path.join(tmp, "staged.parquet")
        stage("checking the first rows")
        _check_head(
            frame,
            tmp,
            lambda staged_head, out_head, blank_rows: _write_checked(
                path,
                staged_head,
                out_head,
                cmap,
                kind,
                scale,
                quoted,
                source,
                batch_rows,
                plan.skip_failed,
                blank_rows,
            ),
            lambda: _blank_rows(path, quoted) if blanks else None,
            min(batch_rows, HEAD_ROWS),
        )
        try:
            stage(f"parsing the CSV ({os.path.getsize(path):,} bytes)")
            frame.sink_parquet(staged, row_group_size=batch_rows)
            stage("checking and writing rows")
        except pl.exceptions.PolarsError as err:
            raise _first_bad_line(path) or InputError(
                f"malformed CSV: {' '.join(str(err).split())[:200]}", path=path
            ) from None
        return _write_checked(
            path,
            staged,
            out,
            cmap,
            kind,
            scale,
            quoted,
            source,
            batch_rows,
            plan.skip_failed,
            _blank_rows(path, quoted) if blanks else None,
        )


HEAD_ROWS = 65536  # rows checked before the whole file is parsed


def _check_head(
    frame: pl.LazyFrame,
    tmp: str,
    check: Any,
    blank_rows: Any,
    rows: int,
) -> None:
    """Check the file's first ``rows`` rows as the import checks every row, before the whole
    file is parsed: a bad value near the start of a large log is reported at once, not after
    the parse of all of it (tens of seconds for millions of rows). ``check(staged, out,
    blank_rows)`` is :func:`_write_checked` on those rows. A problem only the whole parse
    finds (malformed CSV further on) is left to it; warnings wait for the whole run."""
    import warnings

    from kvtier.trace.progress import Meter, metering

    head = os.path.join(tmp, "head.parquet")
    try:
        frame.head(rows).sink_parquet(head)
    except pl.exceptions.PolarsError:
        return  # the whole parse reports it, with its line
    with warnings.catch_warnings(), metering(Meter()):  # counted once, by the whole run
        warnings.simplefilter("ignore")
        try:
            check(head, os.path.join(tmp, "head-checked.parquet"), blank_rows())
        except InputError as err:
            if err.message.startswith("trace has no requests"):
                return  # only blank lines at the start: the rest may hold rows
            raise
    os.remove(head)


def _write_checked(
    path: str,
    staged: str,
    out: str,
    cmap: ColumnMap,
    kind: str,
    scale: float,
    quoted: bool,
    source: str,
    batch_rows: int,
    skip_failed: bool,
    blank_rows: Iterator[bool] | None = None,
) -> StreamSummary:
    meta = {
        META_FORMAT: FORMAT_VERSION,
        META_BLOCK_TOKENS: str(NOMINAL_BLOCK_TOKENS),
        META_SOURCE: f"{source}:{os.path.basename(path)}",
        META_PREFIX_INFO: "false",
    }
    schema = pa.schema(
        [
            ("arrival_s", pa.float64()),
            ("input_tokens", pa.int64()),
            ("output_tokens", pa.int64()),
            ("block_hashes", HASH_TYPE),
        ],
        metadata=meta,
    )
    reader = pq.ParquetFile(staged, pre_buffer=False)  # pre-buffering caches the whole file
    arrival_bad = (
        "not a timestamp like 2023-11-16 18:17:03.97 or 2024-05-10 00:00:00+00:00"
        if kind == "timestamp"
        else "not a finite number"
    )

    def fail(row: int, column: str, message: str) -> InputError:
        line = _line_of(path, row, quoted)
        # a row with too few fields reads as nulls: name it as the in-memory import does
        return _first_bad_line(path, until=line) or InputError(
            message, path=path, line=line, column=column
        )

    summary: dict[str, float | bool] = {"n": 0, "t0": np.nan, "last": -np.inf, "failed": 0}

    def write(tmp: str) -> None:
        with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:
            row0 = 0
            for batch in reader.iter_batches(batch_size=batch_rows):
                count(batch.num_rows, batch.nbytes)
                t = batch.column("t").to_numpy(zero_copy_only=False).astype(np.float64)
                inp = batch.column("inp").to_numpy(zero_copy_only=False)
                outp = batch.column("out").to_numpy(zero_copy_only=False)
                rows = np.arange(row0, row0 + len(t))
                row0 += len(t)
                aware = (
                    batch.column("aware").to_numpy(zero_copy_only=False)
                    if "aware" in batch.schema.names
                    else None
                )
                if blank_rows is not None:  # blank lines read as rows of nulls: drop them
                    keep = ~np.fromiter(itertools.islice(blank_rows, len(t)), bool, len(t))
                    t, inp, outp, rows = t[keep], inp[keep], outp[keep], rows[keep]
                    aware = None if aware is None else aware[keep]
                    if len(t) == 0:
                        continue
                checks = [
                    (cmap.arrival, ~np.isfinite(t), arrival_bad),
                    (cmap.input, np.isnan(inp.astype(np.float64)), "not an integer"),
                    (cmap.output, np.isnan(outp.astype(np.float64)), "not an integer"),
                ]
                first = min(
                    (
                        (int(np.flatnonzero(bad)[0]), col, msg)
                        for col, bad, msg in checks
                        if bad.any()
                    ),
                    default=None,
                )
                if first is not None:
                    raise fail(int(rows[first[0]]), first[1], first[2])
                if aware is not None:
                    aware = aware.astype(bool)
                    mixed = mixed_timestamp(aware, summary.get("aware"))
                    if mixed is not None:
                        raise fail(int(rows[mixed[0]]), cmap.arrival, mixed[1])
                    summary.setdefault("aware", bool(aware[0]))
                inp, outp = inp.astype(np.int64), outp.astype(np.int64)
                if skip_failed:
                    failed = inp == 0
                    if failed.any():
                        summary["failed"] += int(failed.sum())
                        t, inp, outp, rows = t[~failed], inp[~failed], outp[~failed], rows[~failed]
                        if len(t) == 0:
                            continue
                for col, values, low in ((cmap.input, inp, 1), (cmap.output, outp, 0)):
                    bad = (values < low) | (values > MAX_TOKENS)
                    if bad.any():
                        i = int(np.flatnonzero(bad)[0])
                        what = (
                            f"must be {'> 0' if low else '>= 0'}"
                            if values[i] < low
                            else (
                                f"{int(values[i])} is above the supported maximum of {MAX_TOKENS:,}"
                            )
                        )
                        raise fail(int(rows[i]), col, what)
                if np.isnan(summary["t0"]):
                    summary["t0"] = float(t[0])
                previous = np.concatenate(([summary["last"]], t[:-1]))
                unsorted = t < previous
                if unsorted.any():
                    raise fail(
                        int(rows[np.flatnonzero(unsorted)[0]]),
                        cmap.arrival,
                        "earlier than the row before: a streamed import needs rows in arrival "
                        "order (sort the file first)",
                    )
                summary["last"] = float(t[-1])
                n = len(t)
                arrival = (t - summary["t0"]) * scale
                empty = pa.ListArray.from_arrays(
                    pa.array(np.zeros(n + 1, dtype=np.int32)), pa.array([], type=pa.uint64())
                )
                writer.write_table(
                    pa.table(
                        {
                            "arrival_s": arrival,
                            "input_tokens": inp,
                            "output_tokens": outp,
                            "block_hashes": empty,
                        },
                        schema=schema,
                    )
                )
                summary["n"] += n
        if summary["n"] == 0:
            raise InputError("trace has no requests (only a header)", path=path)

    atomic_write(out, write)
    duration = (summary["last"] - summary["t0"]) * scale if summary["n"] else 0.0
    if summary["failed"]:
        import warnings

        from kvtier.trace.importers.burstgpt import FailedRequestsWarning

        warnings.warn(
            f"{path}: left out {int(summary['failed']):,} failed requests (no prompt tokens)",
            FailedRequestsWarning,
            stacklevel=2,
        )
    return StreamSummary(int(summary["n"]), float(duration), int(summary["failed"]))
