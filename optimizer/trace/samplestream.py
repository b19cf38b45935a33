"""Samples and slices of traces larger than memory, read and written by record batches.

The same rows as :func:`kvtier.trace.sampling.sample` and
:func:`~kvtier.trace.sampling.time_slice` of the whole trace, with the same metadata, from a
trace read by :mod:`kvtier.trace.batches` (a Parquet or Arrow file, or a dataset directory;
every batch validated, rows in arrival order). A sample by sessions or by requests decides each
batch on its own. A sample by prefix subtrees reads the trace twice: the first pass counts the
requests reading each distinct block (a table of distinct hashes, as the streamed mapping's:
:class:`~kvtier.trace.idtable.IdTable`, plus 4 bytes a distinct block) and numbers the tenants
in order of first appearance; the second finds each request's root from those counts, as the
in-memory sample does from the whole trace's. Memory grows with the distinct blocks, not the
requests. A sample of a trace that records no strata yet also needs the whole trace's
prompt-length histogram (:class:`~kvtier.trace.strata.LengthHistogram`, one count per length
up to the longest prompt) before it writes its metadata: it is taken in that first pass, which
a sample by sessions or by requests then makes for it alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kvtier.errors import InputError
from kvtier.files import atomic_write
from kvtier.trace.batches import BATCH_ROWS, TraceBatches, iter_batches, open_batches
from kvtier.trace.format import (
    FORMAT_VERSION,
    META_ARRIVAL_OFFSET,
    META_BLOCK_TOKENS,
    META_FORMAT,
    META_PREFIX_INFO,
    META_SAMPLE_FRACTION,
    META_SOURCE,
)
from kvtier.trace.io import sample_strata
from kvtier.trace.sampling import TRUNK_SHARE, _check_options, _kept, _mix64, check_window
from kvtier.trace.strata import META_SAMPLE_STRATA, LengthHistogram, SampleStrata

if TYPE_CHECKING:
    from kvtier.trace.idtable import IdTable


def output_metadata(
    trace: TraceBatches, fraction: float, strata: SampleStrata | None = None
) -> dict[str, str]:
    """The schema metadata the in-memory path writes for a sample or slice of ``trace`` with
    ``kvtier.sample_fraction`` ``fraction`` and ``kvtier.sample_strata`` ``strata``: the
    trace's own keys outside ``kvtier.``, then the format's."""
    meta = {k: v for k, v in trace.meta.items() if not k.startswith("kvtier.")}
    meta.update(
        {
            META_FORMAT: FORMAT_VERSION,
            META_BLOCK_TOKENS: str(trace.block_tokens),
            META_SOURCE: trace.meta.get(META_SOURCE, ""),
            META_PREFIX_INFO: "true" if trace.has_prefix_info else "false",
        }
    )
    if fraction != 1.0:
        meta[META_SAMPLE_FRACTION] = repr(float(fraction))
    if strata is not None:
        meta[META_SAMPLE_STRATA] = strata.to_json()
    return meta


def _offset_into(meta: dict[str, str], trace: TraceBatches, shift: float = 0.0) -> None:
    """Record in ``meta`` where the written arrivals start on the source's clock: the batches
    are read relative to the first arrival (the first batch sets it), then shifted by
    ``shift`` more; nothing when that is 0."""
    offset = trace.arrival_offset_s() + shift
    if offset != 0.0:
        meta[META_ARRIVAL_OFFSET] = repr(offset)


def _fraction_of(trace: TraceBatches) -> float:
    return float(trace.meta.get(META_SAMPLE_FRACTION, "1.0"))


def _write_batches(
    out: str,
    tables: Iterator[pa.Table],
    meta: dict[str, str],
    none_kept: Callable[[], InputError],
) -> int:
    """Write the non-empty ``tables`` to the Parquet file ``out`` (atomically) under the first
    one's schema with ``meta``; returns the rows written (none: ``none_kept()`` is raised)."""
    if not out.lower().endswith(".parquet"):
        raise InputError("a streamed sample or slice writes one .parquet file", path=out)
    written = {"rows": 0}

    def write(tmp: str) -> None:
        writer: pq.ParquetWriter | None = None
        try:
            for table in tables:
                if table.num_rows == 0:
                    continue
                if writer is None:
                    schema = table.schema.with_metadata(meta)
                    writer = pq.ParquetWriter(tmp, schema, compression="zstd")
                writer.write_table(table.replace_schema_metadata(meta).cast(writer.schema))
                written["rows"] += table.num_rows
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise none_kept()

    atomic_write(out, write)
    return written["rows"]


def stream_slice(
    path: str, start: float, end: float | None, out: str, *, batch_rows: int = BATCH_ROWS
) -> tuple[int, int, float]:
    """:func:`~kvtier.trace.sampling.time_slice` of the trace ``path`` written to ``out`` by
    batches. Returns (requests read, requests kept, seconds from the first kept to the last)."""
    check_window(start, end)
    trace = open_batches(path)
    seen = {"read": 0, "last": math.nan, "first_kept": math.nan, "last_kept": math.nan}
    meta = output_metadata(trace, _fraction_of(trace))  # a slice keeps no strata

    def cut() -> Iterator[pa.Table]:
        for _row0, table in iter_batches(trace, batch_rows):
            seen["read"] += table.num_rows
            _offset_into(meta, trace, start)
            arrival = table.column("arrival_s").to_numpy()
            seen["last"] = float(arrival[-1])
            keep = arrival >= start
            if end is not None:
                keep &= arrival < end
            if not keep.any():
                continue
            kept = table.filter(pa.array(keep))
            shifted = kept.column("arrival_s").to_numpy() - start
            if math.isnan(seen["first_kept"]):
                seen["first_kept"] = float(shifted[0])
            seen["last_kept"] = float(shifted[-1])
            yield kept.set_column(
                kept.schema.get_field_index("arrival_s"), "arrival_s", pa.array(shifted)
            )

    def none_kept() -> InputError:
        return InputError(
            f"no request arrives in [{start:g}, {end if end is not None else 'end'}) "
            f"(the trace spans 0 to {seen['last']:,.1f} s)",
            option="--start",
        )

    kept = _write_batches(out, cut(), meta, none_kept)
    return int(seen["read"]), kept, seen["last_kept"] - seen["first_kept"]


class _Readers:
    """Pass one of a sample by prefix subtrees: requests reading each distinct block, tenants
    in order of first appearance, and the number of requests."""

    def __init__(self) -> None:
        from kvtier.trace.idtable import IdTable

        self.blocks: IdTable = IdTable()
        self.counts = np.zeros(1 << 16, dtype=np.int32)
        self.tenants: dict[str, int] = {}
        self.n = 0

    def add(self, table: pa.Table) -> None:
        self.n += table.num_rows
        _, hashes = _hash_arrays(table)
        ids = self.blocks.ids(hashes)
        if self.blocks.n > len(self.counts):
            grown = np.zeros(1 << int(self.blocks.n - 1).bit_length(), dtype=np.int32)
            grown[: len(self.counts)] = self.counts
            self.counts = grown
        self.counts[: self.blocks.n] += np.bincount(ids, minlength=self.blocks.n).astype(np.int32)
        if "tenant" in table.column_names:
            for name in _tenant_names(table).unique(maintain_order=True).to_list():
                self.tenants.setdefault(name, len(self.tenants))

    def roots(self, table: pa.Table) -> np.ndarray:
        """The root key of each request of ``table``, as :func:`~kvtier.trace.sampling.root_keys`
        gives it for the whole trace."""
        offsets, hashes = _hash_arrays(table)
        readers = self.counts[self.blocks.find(hashes)]
        limit = max(1, int(TRUNK_SHARE * self.n))
        position = np.arange(len(hashes), dtype=np.int64)
        below = np.where(readers <= limit, position, np.iinfo(np.int64).max)
        first_below = np.minimum.reduceat(below, offsets[:-1])
        last = offsets[1:] - 1
        keys = hashes[np.where(first_below < len(hashes), first_below, last)]
        if self.tenants:
            names = _tenant_names(table)
            codes = names.replace_strict(
                list(self.tenants), list(self.tenants.values()), return_dtype=pl.Int64
            ).to_numpy()
            keys = keys ^ _mix64(codes.astype(np.uint64) + np.uint64(1))
        return keys


def _tenant_names(table: pa.Table) -> pl.Series:
    return pl.from_arrow(table.column("tenant")).cast(pl.String)


def _hash_arrays(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    col = table.column("block_hashes").combine_chunks()
    offsets = col.offsets.to_numpy().astype(np.int64)
    values = col.values.to_numpy(zero_copy_only=False)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], np.ascontiguousarray(values, dtype=np.uint64)


def stream_sample(
    path: str, fraction: float, out: str, *, seed: int = 0, batch_rows: int = BATCH_ROWS
) -> tuple[int, int, str]:
    """:func:`~kvtier.trace.sampling.sample` of the trace ``path`` written to ``out`` by
    batches: the same rows and metadata. Returns (requests read, requests kept, roots)."""
    _check_options(fraction, seed)
    trace = open_batches(path)
    _check_options(fraction, seed, _fraction_of(trace))
    names = trace.schema.names
    readers: _Readers | None = None
    if "session_id" in names:
        roots = "sessions"
    elif trace.has_prefix_info:
        roots = "prefix subtrees"
        readers = _Readers()
    else:
        roots = "requests"
    out_fraction = _fraction_of(trace) * fraction
    strata = sample_strata(trace.meta, trace.path) if out_fraction != 1.0 else None
    lengths = LengthHistogram() if out_fraction != 1.0 and strata is None else None
    if readers is not None or lengths is not None:
        for _row0, table in iter_batches(trace, batch_rows):
            if readers is not None:
                readers.add(table)
            if lengths is not None:
                lengths.add(table.column("input_tokens").to_numpy())
        if lengths is not None:
            strata = lengths.strata()
    first_pass = readers is not None or lengths is not None
    by_id = (
        roots == "requests"
        and "request_id" in names
        and pa.types.is_integer(trace.schema.field("request_id").type)
    )
    counts = {"read": 0}

    def key_of(row0: int, table: pa.Table) -> np.ndarray:
        if roots == "sessions":
            return table.column("session_id").to_numpy().view(np.uint64)
        if readers is not None:
            return readers.roots(table)
        if by_id:
            return table.column("request_id").to_numpy().astype(np.int64).view(np.uint64)
        return np.arange(row0, row0 + table.num_rows, dtype=np.uint64)

    def kept(keys_of: Callable[[int, pa.Table], np.ndarray]) -> Iterator[pa.Table]:
        checked = not first_pass  # pass one checked every batch already
        for row0, table in iter_batches(trace, batch_rows, cross_checks=checked):
            counts["read"] += table.num_rows
            _offset_into(meta, trace)
            if fraction >= 1:
                yield table
                continue
            yield table.filter(pa.array(_kept(keys_of(row0, table), fraction, seed)))

    def none_kept() -> InputError:
        return InputError(
            f"a {fraction:g} sample of {counts['read']:,} requests ({roots}) keeps none; "
            "use a larger fraction or another seed",
            option="--fraction",
        )

    meta = output_metadata(trace, out_fraction, strata)
    n_kept = _write_batches(out, kept(key_of), meta, none_kept)
    return counts["read"], n_kept, roots
