"""Block mapping by record batches: any trace size, memory proportional to distinct blocks.

:func:`kvtier.trace.blocks.block_trace` maps a trace held in memory. This module gives
*exactly* the same dense ids for a trace read batch by batch (:mod:`kvtier.trace.batches`):
each full block's identity (the native hash standing for it, the piece of the native block
when ``B < G``, the tenant unless tenants share) is looked up in a persistent
:class:`~kvtier.trace.idtable.IdTable`, which numbers identities in order of first
appearance, as the in-memory mapping does. Only the table outlives a batch.

The mapped trace is written as a request-trace/1 file at block size ``B`` (``kvtier trace
map``): each request's ``block_hashes`` are its full blocks' dense ids, followed, when the
prompt has a partial last block, by an identity of that block's own (``2**63`` plus the
request's row), which no other request shares, so the file is a valid chained-hash trace.
Reading it back and mapping it at ``B`` gives the same ids again (identities already dense
and in order of first appearance are renumbered to themselves), so replay, stats and sample
read it as any trace, without the hash table: a replay of a mapped trace skips the
``numpy.unique`` over 64-bit hashes. Tenant salting composes: a trace mapped with tenants
sharing, read without sharing, gives the ids of the original mapped without sharing; the
reverse does not hold (salted ids cannot be shared again), so map with
``--share-across-tenants`` when both readings are wanted.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kvtier.errors import InputError
from kvtier.files import atomic_write
from kvtier.trace.batches import BATCH_ROWS, TraceBatches, iter_batches, open_batches
from kvtier.trace.blocked import BlockedTrace, check_block_size
from kvtier.trace.format import HASH_TYPE, META_ARRIVAL_OFFSET, META_BLOCK_TOKENS, Trace

if TYPE_CHECKING:
    from kvtier.trace.idtable import IdTable

TAIL_TAG = np.uint64(1 << 63)  # identity of a request's partial last block: TAIL_TAG | row
META_MAPPED_FROM = "map.native_block_tokens"  # kept by every later read and write
META_SHARED = "map.shared_across_tenants"
PART_ROWS = 1 << 24  # rows per file of a dataset directory written by ``trace map``


@dataclass
class BatchMapper:
    """The state carried from batch to batch: the identity table and the tenant codes."""

    block_tokens: int  # B
    native_block_tokens: int  # G
    has_prefix_info: bool
    salted: bool  # identities carry the tenant
    table: IdTable | None = None  # created on first use (numba is imported only then)

    def __post_init__(self) -> None:
        self.tenants: dict[str, int] = {}

    @property
    def n_blocks(self) -> int:
        return 0 if self.table is None else self.table.n

    def tenant_codes(self, batch: pa.Table) -> np.ndarray | None:
        """Tenant index per request, numbered in order of first appearance over all batches."""
        if "tenant" not in batch.column_names:
            return None
        names = pl.from_arrow(batch.column("tenant")).cast(pl.String)
        for name in names.unique(maintain_order=True).to_list():
            self.tenants.setdefault(name, len(self.tenants))
        codes = names.replace_strict(
            list(self.tenants), list(self.tenants.values()), return_dtype=pl.Int64
        )
        return np.ascontiguousarray(codes.to_numpy())

    def map(self, batch: pa.Table) -> tuple[np.ndarray, np.ndarray]:
        """``(block_offsets int64 (n+1,), block_ids int32)`` of a validated batch."""
        B, G = self.block_tokens, self.native_block_tokens
        n = batch.num_rows
        inp = batch.column("input_tokens").to_numpy().astype(np.int64, copy=False)
        tenants = self.tenant_codes(batch)
        n_full = inp // B if self.has_prefix_info else np.zeros(n, dtype=np.int64)
        offsets = np.zeros(n + 1, dtype=np.int64)
        np.cumsum(n_full, out=offsets[1:])
        total = int(offsets[-1])
        if total == 0:
            return offsets, np.zeros(0, dtype=np.int32)
        col = batch.column("block_hashes").combine_chunks()
        hash_off = col.offsets.to_numpy().astype(np.int64)
        hashes = col.values.to_numpy(zero_copy_only=False).astype(np.uint64, copy=False)
        req_start = np.repeat(hash_off[:-1], n_full)
        pos = np.arange(total, dtype=np.int64) - np.repeat(offsets[:-1], n_full)
        if B >= G:
            m = B // G
            hi = hashes[req_start + (pos + 1) * m - 1]
            lo = np.zeros(total, dtype=np.uint64) if self.two_words else None
        else:
            m = G // B
            hi = hashes[req_start + pos // m]
            lo = (pos % m).astype(np.uint64)
        del req_start, pos
        if self.salted and tenants is not None:
            salt = np.repeat(tenants.astype(np.uint64) << np.uint64(32), n_full)
            lo = salt if lo is None else lo | salt
        if self.table is None:
            from kvtier.trace.idtable import IdTable  # numba: only when a trace is mapped

            self.table = IdTable(two_words=self.two_words)
        return offsets, self.table.ids(hi, lo)

    @property
    def two_words(self) -> bool:
        return self.salted or self.block_tokens < self.native_block_tokens


def mapper_for(trace: TraceBatches, block_tokens: int, share_across_tenants: bool) -> BatchMapper:
    B = check_block_size(block_tokens, trace.block_tokens, trace.path)
    salted = "tenant" in trace.schema.names and not share_across_tenants
    return BatchMapper(B, trace.block_tokens, trace.has_prefix_info, salted)


def map_batches(
    trace: TraceBatches,
    block_tokens: int,
    *,
    share_across_tenants: bool = False,
    batch_rows: int = BATCH_ROWS,
) -> Iterator[tuple[int, pa.Table, np.ndarray, np.ndarray]]:
    """``(first row, table, block_offsets, block_ids)`` per batch; the ids of the whole trace
    are those :func:`~kvtier.trace.blocks.block_trace` gives, batch after batch."""
    mapper = mapper_for(trace, block_tokens, share_across_tenants)
    for row0, table in iter_batches(trace, batch_rows):
        offsets, ids = mapper.map(table)
        yield row0, table, offsets, ids


def mapped_hashes(
    inp: np.ndarray, offsets: np.ndarray, ids: np.ndarray, block_tokens: int, row0: int
) -> pa.ListArray:
    """``block_hashes`` of the mapped trace: full-block ids, then a partial block's own tag."""
    n = len(inp)
    n_full = np.diff(offsets)
    tail = (inp % block_tokens) > 0
    counts = n_full + tail
    out_off = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=out_off[1:])
    if out_off[-1] >= 2**31:
        raise InputError(
            "a batch has 2**31 or more blocks: read it in smaller batches", option="--batch-rows"
        )
    values = np.empty(int(out_off[-1]), dtype=np.uint64)
    values[np.arange(len(ids)) + np.repeat(out_off[:-1] - offsets[:-1], n_full)] = ids
    rows = np.flatnonzero(tail)
    values[out_off[1:][tail] - 1] = TAIL_TAG | (rows + row0).astype(np.uint64)
    return pa.ListArray.from_arrays(
        pa.array(out_off.astype(np.int32)), pa.array(values, type=pa.uint64())
    )


def mapped_table(
    table: pa.Table,
    offsets: np.ndarray,
    ids: np.ndarray,
    block_tokens: int,
    row0: int,
    meta: dict[bytes, bytes],
    has_prefix_info: bool,
) -> pa.Table:
    """A batch of the mapped trace: the batch's columns, ``block_hashes`` replaced."""
    inp = table.column("input_tokens").to_numpy().astype(np.int64, copy=False)
    if has_prefix_info:
        hashes = mapped_hashes(inp, offsets, ids, block_tokens, row0)
    else:
        hashes = pa.ListArray.from_arrays(
            pa.array(np.zeros(len(inp) + 1, dtype=np.int32)), pa.array([], type=pa.uint64())
        )
    i = table.column_names.index("block_hashes")
    return table.set_column(i, pa.field("block_hashes", HASH_TYPE), hashes).replace_schema_metadata(
        meta
    )


def _out_meta(meta: dict[str, str], native: int, B: int, shared: bool) -> dict[bytes, bytes]:
    out = dict(meta)
    out[META_BLOCK_TOKENS] = str(B)
    out.setdefault(META_MAPPED_FROM, str(native))
    if META_SHARED not in meta or meta[META_SHARED] == "true":
        out[META_SHARED] = "true" if shared else "false"
    return {k.encode(): v.encode() for k, v in out.items()}


@dataclass(frozen=True)
class MapSummary:
    n_requests: int
    n_block_refs: int
    n_blocks: int
    block_tokens: int
    table_bytes: int


def _writer_to(out: str) -> tuple[str, bool]:
    suffix = Path(out).suffix.lower()
    if suffix == ".parquet":
        return out, False
    if suffix:
        raise InputError(
            f"a mapped trace is Parquet: name the output .parquet, or a directory for a "
            f"dataset (got '{suffix}')",
            path=out,
        )
    if os.path.exists(out) and (not os.path.isdir(out) or os.listdir(out)):
        raise InputError("exists and is not an empty directory", path=out)
    return out, True


def map_trace_file(
    path: str,
    block_tokens: int,
    out: str,
    *,
    share_across_tenants: bool = False,
    batch_rows: int = BATCH_ROWS,
    part_rows: int = PART_ROWS,
) -> MapSummary:
    """Map the trace ``path`` (a file or dataset directory) at ``block_tokens`` by batches and
    write the mapped trace to ``out``: one ``.parquet`` file, or a directory of parts."""
    out, dataset = _writer_to(out)
    trace = open_batches(path)
    mapper = mapper_for(trace, block_tokens, share_across_tenants)
    meta = _out_meta(trace.meta, trace.block_tokens, mapper.block_tokens, share_across_tenants)
    counts = {"rows": 0, "refs": 0}

    def write_parts(sink_for: Callable[[int], str]) -> None:
        writer: pq.ParquetWriter | None = None
        part_written = 0
        part = 0
        try:
            for row0, table in iter_batches(trace, batch_rows):
                offset = trace.arrival_offset_s()  # arrivals are read from 0 (iter_batches)
                if offset != 0.0:
                    meta[META_ARRIVAL_OFFSET.encode()] = repr(offset).encode()
                offsets, ids = mapper.map(table)
                mapped = mapped_table(
                    table, offsets, ids, mapper.block_tokens, row0, meta, trace.has_prefix_info
                )
                if writer is not None and dataset and part_written >= part_rows:
                    writer.close()
                    writer, part_written, part = None, 0, part + 1
                if writer is None:
                    writer = pq.ParquetWriter(sink_for(part), mapped.schema, compression="zstd")
                writer.write_table(mapped.cast(writer.schema))
                part_written += mapped.num_rows
                counts["rows"] += mapped.num_rows
                counts["refs"] += len(ids)
        finally:
            if writer is not None:
                writer.close()

    if not dataset:
        atomic_write(out, lambda tmp: write_parts(lambda _part: tmp))
    else:
        target = Path(out)
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp_dir = tempfile.mkdtemp(prefix=f".{target.name}.", dir=target.parent)
        except OSError as err:
            raise InputError(f"cannot write: {err.strerror}", path=out) from None
        try:
            write_parts(lambda part: os.path.join(tmp_dir, f"part-{part:05d}.parquet"))
            if target.is_dir():
                target.rmdir()
            os.replace(tmp_dir, target)
        except OSError as err:
            raise InputError(f"cannot write: {err.strerror}", path=out) from None
        finally:
            if os.path.isdir(tmp_dir):
                shutil.rmtree(tmp_dir, ignore_errors=True)
    table_bytes = 0 if mapper.table is None else mapper.table.nbytes
    return MapSummary(
        counts["rows"], counts["refs"], mapper.n_blocks, mapper.block_tokens, table_bytes
    )


def mapped_trace(
    trace: Trace, block_tokens: int, *, share_across_tenants: bool = False
) -> tuple[Trace, BlockedTrace]:
    """The in-memory ``trace map``: :func:`~kvtier.trace.blocks.block_trace`, and the mapped
    trace as the streamed mapping writes it (the same table, row for row)."""
    from kvtier.trace.blocks import block_trace

    blocked = block_trace(trace, block_tokens, share_across_tenants=share_across_tenants)
    meta_in = dict(trace.table.schema.metadata or {})
    meta = _out_meta(
        {k.decode(): v.decode() for k, v in meta_in.items()},
        trace.block_tokens,
        blocked.block_tokens,
        share_across_tenants,
    )
    table = mapped_table(
        trace.table,
        blocked.block_offsets,
        blocked.block_ids,
        blocked.block_tokens,
        0,
        meta,
        trace.has_prefix_info,
    )
    out = Trace.from_table(
        table,
        block_tokens=blocked.block_tokens,
        source=trace.source,
        has_prefix_info=trace.has_prefix_info,
        metadata={k.decode(): v.decode() for k, v in meta.items() if not k.startswith(b"kvtier.")},
        path=trace.path,
        sample_fraction=trace.sample_fraction,
        sample_strata=trace.sample_strata,
        arrival_offset_s=trace.arrival_offset_s,
    )
    return out, blocked
