"""Reading a request-trace/1 file or Parquet dataset by record batches, each batch validated.

For traces larger than memory (``kvtier trace map``, ``kvtier trace stats`` of a large file):
a Parquet file, an Arrow IPC file or a directory of Parquet parts (name order, as
:func:`kvtier.trace.io.read_trace` reads it) is read batch by batch. Every batch is checked
by :func:`kvtier.trace.validate.validate_table`, the in-memory reader's check, with rows
numbered from the start of the whole trace; rows must be in arrival order across batches
(sorting would need the whole trace); arrivals are shifted to start at 0, as the in-memory
reader shifts them. The properties that relate rows of different batches
are checked over all of them (:mod:`kvtier.trace.crossbatch`): that a hash always stands at
the same block position after the same parent, and that request ids are unique.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pyarrow as pa
import pyarrow.ipc as ipc
import pyarrow.parquet as pq

from kvtier.errors import InputError
from kvtier.trace.format import META_BLOCK_TOKENS, META_PREFIX_INFO
from kvtier.trace.io import arrival_offset, check_same_columns, trace_metadata, validated
from kvtier.trace.progress import count
from kvtier.trace.validate import validate_table

if TYPE_CHECKING:
    from kvtier.trace.crossbatch import ChainCheck, UniqueCheck

BATCH_ROWS = 1 << 20


def validate_batch(
    raw: pa.Table, block_tokens: int, has_prefix: bool, path: str, row0: int
) -> pa.Table:
    """:func:`validate_table` of one batch whose first row is ``row0`` of the trace (errors
    name the row from the trace's start); what spans batches is :class:`CrossChecks`'s."""
    try:
        return validate_table(
            raw,
            block_tokens=block_tokens,
            path=path,
            has_prefix_info=has_prefix,
        )
    except InputError as err:
        if err.row is not None:
            err.row += row0
            err.args = (err.format(),)
        raise


class CrossChecks:
    """The checks of a trace read by batches that span batches: chaining of hashes, unique
    request ids (created on first use; numba is imported only then)."""

    def __init__(self, block_tokens: int, has_prefix: bool, has_ids: bool) -> None:
        self.block_tokens, self.has_prefix, self.has_ids = block_tokens, has_prefix, has_ids
        self.chain: ChainCheck | None = None
        self.unique: UniqueCheck | None = None

    def check(self, table: pa.Table, row0: int, path: str | None) -> None:
        """Check validated ``table``, whose first row is ``row0`` of the trace."""
        from kvtier.trace.crossbatch import ChainCheck, UniqueCheck

        if self.has_prefix:
            self.chain = self.chain or ChainCheck()
            col = table.column("block_hashes").combine_chunks()
            offsets = col.offsets.to_numpy().astype(np.int64)
            values = col.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
            full = table.column("input_tokens").to_numpy() // self.block_tokens
            self.chain.check(offsets - offsets[0], values, full, row0=row0, path=path)
        if self.has_ids and "request_id" in table.column_names:
            self.unique = self.unique or UniqueCheck()
            self.unique.check(table.column("request_id"), row0=row0, path=path, column="request_id")


@dataclass(frozen=True)
class TraceBatches:
    """An opened trace: its checked metadata and the files (or parts) it is read from."""

    path: str
    meta: dict[str, str]
    files: tuple[str, ...]
    schema: pa.Schema
    # the first arrival on the file's clock, once the first batch is read: every batch's
    # arrivals are read relative to it, as read_trace reads them (kvtier.trace.io)
    origin: dict[str, float] = field(default_factory=dict)

    def arrival_offset_s(self) -> float:
        """What ``kvtier.arrival_offset_s`` says of the arrivals as read (after the first
        batch: the file's offset plus its first arrival)."""
        return arrival_offset(self.meta, self.path) + self.origin.get("t0", 0.0)

    @property
    def block_tokens(self) -> int:
        return int(self.meta[META_BLOCK_TOKENS])

    @property
    def has_prefix_info(self) -> bool:
        return self.meta.get(META_PREFIX_INFO, "true").lower() != "false"

    @property
    def nbytes_on_disk(self) -> int:
        return sum(os.path.getsize(f) for f in self.files)


def _schema_of(file: str) -> pa.Schema:
    try:
        with open(file, "rb") as fh:
            head = fh.read(8)
    except FileNotFoundError:
        raise InputError("no such file", path=file) from None
    except OSError as err:
        raise InputError(f"cannot read: {err.strerror}", path=file) from None
    if not head:
        raise InputError("empty file", path=file)
    schema = None
    try:
        if head.startswith(b"PAR1"):
            schema = pq.ParquetFile(file).schema_arrow
        elif head.startswith(b"ARROW1"):
            with pa.memory_map(file) as source:
                schema = ipc.open_file(source).schema
        if schema is not None:
            _ = schema.names  # a corrupt file's field names may not decode as UTF-8
            return schema
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise InputError(f"corrupt Arrow/Parquet file: {err}", path=file) from None
    raise InputError(
        "read by batches: a Parquet file, an Arrow IPC file or a directory of Parquet files",
        path=file,
    )


def open_batches(path: str | os.PathLike[str]) -> TraceBatches:
    """Open ``path`` for batch reading; metadata is checked now, rows as they are read."""
    path = str(path)
    if os.path.isdir(path):
        files = tuple(str(p) for p in sorted(Path(path).rglob("*.parquet")) if p.is_file())
        if not files:
            raise InputError("directory holds no .parquet files", path=path)
    else:
        files = (path,)
    schema = _schema_of(files[0])
    meta = trace_metadata(schema, files[0])
    kvtier_meta = {k: v for k, v in meta.items() if k.startswith("kvtier.")}
    for file in files[1:]:
        part_schema = _schema_of(file)
        check_same_columns(files[0], schema, file, part_schema)
        other = trace_metadata(part_schema, file)
        if {k: v for k, v in other.items() if k.startswith("kvtier.")} != kvtier_meta:
            raise InputError(
                f"schema metadata differs from {Path(files[0]).name}'s: the files are not "
                "parts of one trace",
                path=file,
            )
    return TraceBatches(path=path, meta=meta, files=files, schema=schema)


def _raw_batches(file: str, batch_rows: int) -> Iterator[pa.Table]:
    try:
        with open(file, "rb") as fh:
            parquet = fh.read(4) == b"PAR1"
        if parquet:
            # pre_buffer=False: with it, pyarrow keeps every row group read so far cached
            # until the reader closes, which grows with the file (36 MB a batch here)
            reader = pq.ParquetFile(file, pre_buffer=False)
            for batch in reader.iter_batches(batch_size=batch_rows):
                yield validated(pa.Table.from_batches([batch]), file)
            return
        with pa.memory_map(file) as source:
            reader = ipc.open_file(source)
            for i in range(reader.num_record_batches):
                table = validated(pa.Table.from_batches([reader.get_batch(i)]), file)
                for lo in range(0, table.num_rows, batch_rows):
                    yield table.slice(lo, batch_rows)
    except (pa.ArrowException, OSError, UnicodeDecodeError) as err:
        raise InputError(f"corrupt Arrow/Parquet file: {err}", path=file) from None


def iter_batches(
    trace: TraceBatches, batch_rows: int = BATCH_ROWS, *, cross_checks: bool = True
) -> Iterator[tuple[int, pa.Table]]:
    """``(first row, validated table)`` per batch, in trace order; rows counted from 0.
    ``cross_checks`` False skips the checks across batches (for a second pass over a trace
    whose first pass made them).

    A problem is reported as the in-memory reader reports it: the path (the part's, for a
    dataset), the row from the start of the whole trace, the column.
    """
    if batch_rows < 1:
        raise InputError(f"must be >= 1, got {batch_rows}", option="--batch-rows")
    block_tokens = trace.block_tokens
    has_prefix = trace.has_prefix_info
    row0 = 0
    last = -math.inf
    checks = CrossChecks(block_tokens, has_prefix, "request_id" in trace.schema.names)
    for file in trace.files:
        for raw in _raw_batches(file, batch_rows):
            if raw.num_rows == 0:
                continue
            table = validate_batch(raw, block_tokens, has_prefix, file, row0)
            if cross_checks:
                checks.check(table, row0, file)
            arrival = table.column("arrival_s")
            first = arrival[0].as_py()
            if first < last:
                raise InputError(
                    "earlier than the row before: a trace read by batches needs rows in "
                    "arrival order (read it whole, or sort it first)",
                    path=file,
                    row=row0,
                    column="arrival_s",
                )
            last = arrival[-1].as_py()
            t0 = trace.origin.setdefault("t0", first)
            if t0 != 0.0:
                shifted = arrival.to_numpy() - t0
                table = table.set_column(
                    table.schema.get_field_index("arrival_s"), "arrival_s", pa.array(shifted)
                )
            count(table.num_rows, table.nbytes)
            yield row0, table
            row0 += table.num_rows
    if row0 == 0:
        raise InputError("trace has no requests (empty table)", path=trace.path)
