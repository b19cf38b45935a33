"""Request trace format v1 (``request-trace/1``) and the in-memory ``Trace`` type.

A trace is one Arrow table, one row per request, plus schema metadata:

=================  ==================  ========  ============================================
column             type                required  meaning
=================  ==================  ========  ============================================
``arrival_s``      float64             yes       seconds from trace start, finite, >= 0
``input_tokens``   int32 / int64       yes       prompt length, > 0
``output_tokens``  int32 / int64       yes       generated tokens, >= 0
``block_hashes``   list<uint64>        yes       chained hashes of the prompt's native blocks
``request_id``     int64 or string     no        defaults to the row index
``session_id``     int64               no        conversation / agent session
``tenant``         string              no        owner; no sharing across tenants by default
=================  ==================  ========  ============================================

Other columns (for example Qwen-Bailian's ``type`` or a synthetic trace's ``pass``) are kept
as they are. ``block_hashes`` has ``ceil(input_tokens / block_tokens)`` entries, the last one
possibly for a partial block; a trace without prefix information (Azure) has empty lists and
``kvtier.prefix_info = "false"``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa

from kvtier.trace.strata import META_SAMPLE_STRATA, SampleStrata

FORMAT_VERSION = "request-trace/1"
META_FORMAT = "kvtier.format"
META_BLOCK_TOKENS = "kvtier.block_tokens"
META_SOURCE = "kvtier.source"
META_PREFIX_INFO = "kvtier.prefix_info"
# A spatial sample (``kvtier trace sample``) keeps this fraction of the sessions or prefix trees;
# a replay scales the cluster and the shared tiers by it.
META_SAMPLE_FRACTION = "kvtier.sample_fraction"
# ... at least 2^-30: a replay runs fraction x the full deployment's instances, a whole number,
# and a policy has at most 2^30 instances (kvtier.policy.fields.MAX_COUNT), so a smaller
# fraction could never replay (and 1 / fraction sizes the routing fan-out's arrays)
MIN_SAMPLE_FRACTION = 2.0**-30
# ... and its full trace's prompt-length strata (META_SAMPLE_STRATA, JSON), by which a replay
# weights its latencies (kvtier.trace.strata)
# Arrivals are read relative to the first (which becomes 0); the seconds subtracted, on the
# source's clock, are kept here, so a trace written back still says where it started.
META_ARRIVAL_OFFSET = "kvtier.arrival_offset_s"

REQUIRED_COLUMNS = ("arrival_s", "input_tokens", "output_tokens", "block_hashes")
OPTIONAL_COLUMNS = ("request_id", "session_id", "tenant")
PASS_COLUMN = "pass"  # replay pass of a multi-pass synthetic trace (first run / full-hit run)

HASH_TYPE = pa.list_(pa.uint64())

# The largest token count a request's prompt or output may have, and the largest block size: far
# above any real context (the longest served contexts are about 10M tokens), far below where
# token and block arithmetic in int64 could overflow (input + output, times instances and
# tiers, stays below 2**62). docs/traces.md states it for users.
MAX_TOKENS = 1 << 30

STREAM_BYTES = 256 << 20  # files larger than this are read streamed by default


# pyarrow's own conversions between Arrow and NumPy (``Array.to_numpy``, ``pa.array`` of an
# ndarray) import pandas on their first call, to recognise pandas objects: half a second of
# CPU, more than reading a 10,000-request trace. The two helpers below take the plain case
# (fixed-width numbers, no nulls) through DLPack and Arrow buffers instead, which import
# nothing, and leave every other case to pyarrow. Their results are the same arrays.


def numpy_of(arr: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """``arr.to_numpy(zero_copy_only=False)``: a read-only view where Arrow allows one."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.chunk(0) if arr.num_chunks == 1 else arr.combine_chunks()
    t = arr.type
    if arr.null_count == 0 and (pa.types.is_integer(t) or pa.types.is_floating(t)):
        return np.from_dlpack(arr)
    return arr.to_numpy(zero_copy_only=False)


def arrow_of(values: np.ndarray, type: pa.DataType) -> pa.Array:
    """``pa.array(values, type=type)`` for a 1-d array of numbers (no nulls)."""
    want = np.dtype(type.to_pandas_dtype()) if pa.types.is_primitive(type) else None
    if (
        want is not None
        and values.ndim == 1
        and values.dtype == want
        and (pa.types.is_integer(type) or pa.types.is_floating(type))
    ):
        data = np.ascontiguousarray(values)
        return pa.Array.from_buffers(type, len(data), [None, pa.py_buffer(data)])
    return pa.array(values, type=type)


@dataclass(frozen=True, eq=False)
class Trace:
    """A validated request trace: an Arrow table sorted by arrival, plus its metadata.

    Build one with :meth:`from_arrays` (synthesis, importers) or read one with
    :func:`kvtier.trace.io.read_trace`; both validate. ``table`` always carries the
    ``kvtier.*`` schema metadata, so writing it back loses nothing.
    """

    table: pa.Table
    block_tokens: int
    source: str = ""
    has_prefix_info: bool = True
    path: str | None = None
    metadata: dict[str, str] = field(default_factory=dict)  # extra schema metadata, kept as is
    sample_fraction: float = 1.0  # < 1 for a spatial sample of a larger trace
    sample_strata: SampleStrata | None = None  # a sample's full-trace prompt-length strata
    arrival_offset_s: float = 0.0  # the source clock's time of arrival 0 (META_ARRIVAL_OFFSET)

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_arrays(
        cls,
        *,
        arrival_s: np.ndarray,
        input_tokens: np.ndarray,
        output_tokens: np.ndarray,
        hash_offsets: np.ndarray,
        hashes: np.ndarray,
        block_tokens: int,
        source: str = "",
        has_prefix_info: bool = True,
        extra_columns: dict[str, pa.Array | np.ndarray] | None = None,
        metadata: dict[str, str] | None = None,
    ) -> Trace:
        """Assemble and validate a trace from flat arrays.

        ``hashes[hash_offsets[i]:hash_offsets[i+1]]`` are request ``i``'s block hashes (uint64).
        ``extra_columns`` may hold ``request_id``, ``session_id``, ``tenant``, ``pass`` or any
        other per-request column.
        """
        offsets = pa.array(np.asarray(hash_offsets, dtype=np.int32))
        values = pa.array(np.asarray(hashes, dtype=np.uint64), type=pa.uint64())
        block_hashes = pa.ListArray.from_arrays(offsets, values)
        columns: dict[str, pa.Array] = {
            "arrival_s": pa.array(np.asarray(arrival_s, dtype=np.float64)),
            "input_tokens": pa.array(np.asarray(input_tokens, dtype=np.int64)),
            "output_tokens": pa.array(np.asarray(output_tokens, dtype=np.int64)),
            "block_hashes": block_hashes,
        }
        for name, col in (extra_columns or {}).items():
            columns[name] = col if isinstance(col, pa.Array | pa.ChunkedArray) else pa.array(col)
        table = pa.table(columns)
        return cls.from_table(
            table,
            block_tokens=block_tokens,
            source=source,
            has_prefix_info=has_prefix_info,
            metadata=metadata,
        )

    @classmethod
    def from_table(
        cls,
        table: pa.Table,
        *,
        block_tokens: int,
        source: str = "",
        has_prefix_info: bool = True,
        metadata: dict[str, str] | None = None,
        path: str | None = None,
        sample_fraction: float = 1.0,
        sample_strata: SampleStrata | None = None,
        arrival_offset_s: float = 0.0,
    ) -> Trace:
        """Validate ``table`` (sorting it by arrival if needed) and wrap it."""
        from kvtier.trace.validate import validate_table

        table = validate_table(
            table, block_tokens=block_tokens, path=path, has_prefix_info=has_prefix_info
        )
        meta = dict(metadata or {})
        meta.update(
            {
                META_FORMAT: FORMAT_VERSION,
                META_BLOCK_TOKENS: str(block_tokens),
                META_SOURCE: source,
                META_PREFIX_INFO: "true" if has_prefix_info else "false",
            }
        )
        if sample_fraction != 1.0:
            meta[META_SAMPLE_FRACTION] = repr(float(sample_fraction))
        if sample_strata is not None:
            meta[META_SAMPLE_STRATA] = sample_strata.to_json()
        if arrival_offset_s != 0.0:
            meta[META_ARRIVAL_OFFSET] = repr(float(arrival_offset_s))
        table = table.replace_schema_metadata(meta)
        extra = {k: v for k, v in meta.items() if not k.startswith("kvtier.")}
        return cls(
            table=table,
            block_tokens=block_tokens,
            source=source,
            has_prefix_info=has_prefix_info,
            path=path,
            metadata=extra,
            sample_fraction=float(sample_fraction),
            sample_strata=sample_strata,
            arrival_offset_s=float(arrival_offset_s),
        )

    # -- accessors ----------------------------------------------------------------------------
    @property
    def n_requests(self) -> int:
        return self.table.num_rows

    def column_numpy(self, name: str, dtype: type | np.dtype | None = None) -> np.ndarray:
        arr = numpy_of(self.table.column(name))
        return np.ascontiguousarray(arr if dtype is None else arr.astype(dtype, copy=False))

    @property
    def arrival_s(self) -> np.ndarray:
        return self.column_numpy("arrival_s", np.float64)

    @property
    def input_tokens(self) -> np.ndarray:
        return self.column_numpy("input_tokens", np.int64)

    @property
    def output_tokens(self) -> np.ndarray:
        return self.column_numpy("output_tokens", np.int64)

    def hash_arrays(self) -> tuple[np.ndarray, np.ndarray]:
        """``(offsets int64 (n+1,), hashes uint64)`` of ``block_hashes``, flattened."""
        col = self.table.column("block_hashes").combine_chunks()
        offsets = numpy_of(col.offsets).astype(np.int64)
        values = numpy_of(col.values).astype(np.uint64, copy=False)
        base = offsets[0]
        return offsets - base, np.ascontiguousarray(values[base : offsets[-1]])

    def has_column(self, name: str) -> bool:
        return name in self.table.column_names

    @property
    def duration_s(self) -> float:
        if self.n_requests == 0:
            return 0.0
        a = self.arrival_s
        return float(a[-1] - a[0])
