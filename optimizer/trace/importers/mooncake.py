"""Mooncake FAST'25 JSONL: timestamp (ms), input_length, output_length, hash_ids.

The hash ids are already chained prefix ids of 512-token blocks (checked on load).
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl

from kvtier.trace.format import Trace
from kvtier.trace.importers.common import check_hash_ids, list_arrays, read_jsonl, validated
from kvtier.trace.importers.registry import ImportOptions, register

MOONCAKE_BLOCK_TOKENS = 512  # Mooncake FAST'25 traces: one hash id per 512-token block


SCHEMA = {
    "timestamp": pl.Float64,
    "input_length": pl.Int64,
    "output_length": pl.Int64,
    "hash_ids": pl.List(pl.Int64),
}
FIELDS = {"timestamp": (int, float), "input_length": int, "output_length": int, "hash_ids": list}


def mooncake_trace(path: str, df: pl.DataFrame, lines: np.ndarray) -> Trace:
    """The trace of parsed Mooncake rows ``df`` (each at its ``lines``): the whole file, or one
    batch of a streamed import (checked across batches by the caller)."""
    offsets, ids = list_arrays(df.get_column("hash_ids"))
    check_hash_ids(path, lines, offsets, ids)
    return validated(
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


@register("mooncake", "Mooncake FAST'25 JSONL (timestamp ms, 512-token chained hash_ids)")
def import_mooncake(path: str, options: ImportOptions) -> Trace:
    """Mooncake FAST'25 JSONL (timestamp in ms, 512-token hash ids that are already chained)."""
    df, lines = read_jsonl(path, SCHEMA, FIELDS)
    return mooncake_trace(path, df, lines)
