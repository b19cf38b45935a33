"""Reading and writing request-trace/1 files (Arrow IPC or Parquet).

The format is recognised by the file's magic bytes, not its name, so a mislabelled file still
reads and a file that is neither gets a clear error. Writes are atomic: a temporary file in the
target directory is renamed over the target, so an interrupted write never leaves a truncated
trace behind.
"""

from __future__ import annotations

import math
import os
from dataclasses import replace
from pathlib import Path
from typing import BinaryIO

import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from kvtier.errors import InputError
from kvtier.files import atomic_write
from kvtier.toml_fields import strict_float, strict_int
from kvtier.trace.format import (
    FORMAT_VERSION,
    MAX_TOKENS,
    META_ARRIVAL_OFFSET,
    META_BLOCK_TOKENS,
    META_FORMAT,
    META_PREFIX_INFO,
    META_SAMPLE_FRACTION,
    META_SOURCE,
    MIN_SAMPLE_FRACTION,
    Trace,
    arrow_of,
    numpy_of,
)
from kvtier.trace.strata import META_SAMPLE_STRATA, SampleStrata

_PARQUET_MAGIC = b"PAR1"
_ARROW_FILE_MAGIC = b"ARROW1"
_ARROW_STREAM_MAGIC = b"\xff\xff\xff\xff"


def check_same_columns(first: str, first_schema: pa.Schema, file: str, schema: pa.Schema) -> None:
    """Refuse a dataset part whose columns differ from the first part's: merging them would
    fill the missing column with nulls in one part without a word."""
    names, others = first_schema.names, set(schema.names)
    for name in names:
        if name not in others:
            raise InputError(
                f"has no column '{name}', which {Path(first).name} has: the parts of a dataset "
                "must have the same columns",
                path=file,
            )
    for name in schema.names:
        if name not in set(names):
            raise InputError(
                f"has a column '{name}' that {Path(first).name} has not: the parts of a dataset "
                "must have the same columns",
                path=file,
            )


def _read_dataset(path: str) -> pa.Table:
    """A directory of Parquet files (a dataset) as one table, files in name order.

    Every file must carry the same ``kvtier.*`` schema metadata: parts of one trace, not
    several traces put side by side.
    """
    files = sorted(p for p in Path(path).rglob("*.parquet") if p.is_file())
    if not files:
        raise InputError("directory holds no .parquet files", path=path)
    tables = []
    first_meta: dict[bytes, bytes] | None = None
    for file in files:
        try:
            table = read_parquet(file)
        except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
            raise InputError(f"corrupt Parquet file: {err}", path=str(file)) from None
        validated(table, str(file))
        meta = {k: v for k, v in (table.schema.metadata or {}).items() if k.startswith(b"kvtier.")}
        if first_meta is None:
            first_meta = meta
        elif meta != first_meta:
            raise InputError(
                f"schema metadata differs from {files[0].name}'s: the files are not parts of "
                "one trace",
                path=str(file),
            )
        if tables:
            check_same_columns(str(files[0]), tables[0].schema, str(file), table.schema)
        tables.append(table)
    try:
        return pa.concat_tables(tables, promote_options="permissive")
    except pa.ArrowException as err:
        raise InputError(f"the files' columns do not match: {err}", path=path) from None


def read_parquet(path: str | os.PathLike[str]) -> pa.Table:
    """One Parquet file as a table, through the file reader rather than ``pq.read_table``:
    the same table, without importing ``pyarrow.dataset`` (which imports pandas, about half a
    second of CPU before a small trace is read)."""
    with pq.ParquetFile(path) as fh:
        return fh.read()


def validated(table: pa.Table, path: str) -> pa.Table:
    """``table`` after Arrow's full validation (``validate(full=True)``): offsets in order and
    in bounds, strings valid UTF-8, dictionary indices in range. A file can hold data no
    writer of Arrow makes (a flipped byte, a hand-made buffer); read unchecked, such data
    ends in an index error, a decoding error or a crash inside a library far from the file.
    """
    try:
        table.validate(full=True)
    except (pa.ArrowException, ValueError) as err:
        first = str(err).strip().splitlines()[0] if str(err).strip() else type(err).__name__
        raise InputError(f"corrupt Arrow/Parquet data: {first}", path=path) from None
    return table


def _unreadable(path: str, err: OSError) -> InputError:
    """The one-line error of an input file that cannot be opened or read."""
    if isinstance(err, FileNotFoundError):
        return InputError("no such file", path=path)
    if isinstance(err, IsADirectoryError):
        return InputError("is a directory, not a trace file", path=path)
    return InputError(f"cannot read: {err.strerror}", path=path)


def open_input(path: str) -> BinaryIO:
    """``path`` opened to read bytes (the caller closes it); a missing, directory or unreadable
    file is a one-line error naming it."""
    try:
        return open(path, "rb")  # noqa: SIM115
    except OSError as err:
        raise _unreadable(path, err) from None


def read_input(path: str, size: int = -1) -> bytes:
    """The first ``size`` bytes of ``path`` (all with -1), with :func:`open_input`'s errors,
    and the same for a read that fails."""
    try:
        with open(path, "rb") as fh:
            return fh.read(size)
    except OSError as err:
        raise _unreadable(path, err) from None


def _read_table(path: str) -> pa.Table:
    if os.path.isdir(path):
        return _read_dataset(path)
    head = read_input(path, 8)
    if not head:
        raise InputError("empty file", path=path)
    try:
        if head.startswith(_PARQUET_MAGIC):
            return validated(read_parquet(path), path)
        if head.startswith(_ARROW_FILE_MAGIC):
            with pa.memory_map(path) as source:
                return validated(ipc.open_file(source).read_all(), path)
        if head.startswith(_ARROW_STREAM_MAGIC):
            with pa.memory_map(path) as source:
                return validated(ipc.open_stream(source).read_all(), path)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        # a corrupt file's field names may not decode as UTF-8
        raise InputError(f"corrupt Arrow/Parquet file: {err}", path=path) from None
    raise InputError(
        "not an Arrow IPC or Parquet file (import other formats with `kvtier trace import`)",
        path=path,
    )


def trace_metadata(schema: pa.Schema, path: str) -> dict[str, str]:
    """The schema metadata of a request-trace/1 file, checked: UTF-8, the format version, a
    block size in [1, MAX_TOKENS] (each problem one line naming ``path``)."""
    try:
        meta = {k.decode(): v.decode() for k, v in (schema.metadata or {}).items()}
    except UnicodeDecodeError:
        raise InputError("schema metadata is not valid UTF-8", path=path) from None
    version = meta.get(META_FORMAT)
    if version is None:
        raise InputError(
            f"schema metadata has no '{META_FORMAT}' key; expected '{FORMAT_VERSION}'", path=path
        )
    if version != FORMAT_VERSION:
        raise InputError(
            f"unknown trace format version '{version}' (this kvtier reads '{FORMAT_VERSION}')",
            path=path,
        )
    raw_block = meta.get(META_BLOCK_TOKENS)
    parsed = strict_int(raw_block) if raw_block is not None else None  # "1_6" is no 16
    block_tokens = parsed if parsed is not None else -1
    if not 0 < block_tokens <= MAX_TOKENS:
        shown = raw_block if raw_block is None or len(raw_block) <= 40 else raw_block[:40] + "..."
        raise InputError(
            f"schema metadata '{META_BLOCK_TOKENS}' must be an integer in [1, {MAX_TOKENS:,}], "
            f"got {shown!r}",
            path=path,
        )
    _sample_fraction(meta.get(META_SAMPLE_FRACTION, "1.0"), path)
    sample_strata(meta, path)
    return meta


def sample_strata(meta: dict[str, str], path: str | None) -> SampleStrata | None:
    """The checked ``kvtier.sample_strata`` of a trace's metadata (None without one)."""
    text = meta.get(META_SAMPLE_STRATA)
    return None if text is None else SampleStrata.from_json(text, path)


def read_trace(path: str | os.PathLike[str]) -> Trace:
    """Read and validate a request-trace/1 file, or a directory of Parquet parts of one."""
    path = str(path)
    table = _read_table(path)
    meta = trace_metadata(table.schema, path)
    block_tokens = int(meta[META_BLOCK_TOKENS])
    prefix_info = meta.get(META_PREFIX_INFO, "true").lower() != "false"
    fraction = _sample_fraction(meta.get(META_SAMPLE_FRACTION, "1.0"), path)
    extra = {k: v for k, v in meta.items() if not k.startswith("kvtier.")}
    trace = Trace.from_table(
        table,
        block_tokens=block_tokens,
        source=meta.get(META_SOURCE, ""),
        has_prefix_info=prefix_info,
        metadata=extra,
        path=path,
        sample_fraction=fraction,
        sample_strata=sample_strata(meta, path),
        arrival_offset_s=arrival_offset(meta, path),
    )
    return starting_at_zero(trace)


def arrival_offset(meta: dict[str, str], path: str | None) -> float:
    """The checked ``kvtier.arrival_offset_s`` of a trace's metadata (0 without one)."""
    text = meta.get(META_ARRIVAL_OFFSET, "0")
    parsed = strict_float(text)
    value = math.nan if parsed is None else parsed
    if not math.isfinite(value):
        raise InputError(
            f"schema metadata '{META_ARRIVAL_OFFSET}' must be a finite number of seconds, "
            f"got {text[:40]!r}",
            path=path,
        )
    return value


def starting_at_zero(trace: Trace) -> Trace:
    """``trace`` with its arrivals shifted so that the first is 0, the seconds subtracted
    added to its ``arrival_offset_s``: a replay's results then do not depend on where the
    source's clock started (float64 seconds near 1e12 keep a quarter of a millisecond)."""
    arrival = numpy_of(trace.table.column("arrival_s"))
    first = float(arrival[0])
    if first == 0.0:
        return trace
    table = trace.table.set_column(
        trace.table.schema.get_field_index("arrival_s"),
        "arrival_s",
        arrow_of(arrival - first, pa.float64()),
    )
    return replace(
        trace,
        table=table.replace_schema_metadata(
            {
                **{k.decode(): v.decode() for k, v in (table.schema.metadata or {}).items()},
                META_ARRIVAL_OFFSET: repr(trace.arrival_offset_s + first),
            }
        ),
        arrival_offset_s=trace.arrival_offset_s + first,
    )


def _sample_fraction(text: str, path: str) -> float:
    parsed = strict_float(text)
    value = math.nan if parsed is None else parsed
    if not MIN_SAMPLE_FRACTION <= value <= 1:
        raise InputError(
            f"schema metadata '{META_SAMPLE_FRACTION}' must be a number in [2^-30, 1] (a "
            "replay runs that share of a deployment's instances, at most 2^30 of them, and "
            f"needs a whole one), got {text[:40]!r}",
            path=path,
        )
    return value


def write_trace(trace: Trace, path: str | os.PathLike[str]) -> None:
    """Write ``trace`` atomically: ``.parquet`` as Parquet, ``.arrow``/``.feather`` as Arrow IPC."""
    suffix = Path(path).suffix.lower()
    table = trace.table
    if suffix == ".parquet":
        atomic_write(path, lambda tmp: pq.write_table(table, tmp, compression="zstd"))
    elif suffix in (".arrow", ".feather", ".ipc"):

        def write_ipc(tmp: str) -> None:
            with pa.OSFile(tmp, "wb") as sink, ipc.new_file(sink, table.schema) as writer:
                writer.write_table(table)

        atomic_write(path, write_ipc)
    else:
        raise InputError(
            f"unknown output format '{suffix or '(none)'}': use .parquet or .arrow", path=str(path)
        )
