"""Qwen-Bailian JSONL: chat_id, parent_chat_id, timestamp (s), lengths, type, turn, hash_ids.

The hash ids hash each 16-token block's content alone, so they are chained here; sessions follow
``parent_chat_id``.
"""

from __future__ import annotations

import os

import numpy as np
import polars as pl
import pyarrow as pa

from kvtier.errors import InputError
from kvtier.trace.format import Trace
from kvtier.trace.hashing import chain_hashes
from kvtier.trace.importers.common import (
    JSONL_COLUMNS,
    check_hash_ids,
    list_arrays,
    read_jsonl,
    validated,
)
from kvtier.trace.importers.registry import ImportOptions, register

BAILIAN_BLOCK_TOKENS = 16  # Qwen-Bailian traces: "16 tokens per block" (dataset README)


def _session_roots(chat_id: np.ndarray, parent: np.ndarray) -> np.ndarray | None:
    """Row index of each row's root request, following parent_chat_id; None on a cycle.

    A parent that is not in the trace (the trace is a time window) makes its child a root.
    Pointer jumping resolves chains of any depth in O(log depth) vectorised steps.
    """
    order = np.argsort(chat_id, kind="stable")
    sorted_ids = chat_id[order]
    pos = np.clip(np.searchsorted(sorted_ids, parent), 0, len(order) - 1)
    found = (parent >= 0) & (sorted_ids[pos] == parent)
    up = np.where(found, order[pos], np.arange(len(chat_id)))
    for _ in range(64):
        nxt = up[up]
        if np.array_equal(nxt, up):
            break
        up = nxt
    # a true root has no parent in the trace; anything else sits on a cycle
    return None if found[up].any() else up


SCHEMA = {
    "chat_id": pl.Int64,
    "parent_chat_id": pl.Int64,
    "timestamp": pl.Float64,
    "input_length": pl.Int64,
    "output_length": pl.Int64,
    "type": pl.String,
    "turn": pl.Int64,
    "hash_ids": pl.List(pl.Int64),
}
FIELDS = {
    "chat_id": int,
    "parent_chat_id": int,
    "timestamp": (int, float),
    "input_length": int,
    "output_length": int,
    "type": str,
    "turn": int,
    "hash_ids": list,
}


def bailian_trace(
    path: str,
    df: pl.DataFrame,
    lines: np.ndarray,
    session_id: np.ndarray,
) -> Trace:
    """The trace of parsed Qwen-Bailian rows ``df`` (each at its ``lines``) in sessions
    ``session_id`` (the root request's chat id): the whole file, or one streamed batch."""
    offsets, ids = list_arrays(df.get_column("hash_ids"))
    check_hash_ids(path, lines, offsets, ids)
    extra = {
        "request_id": pa.array(df.get_column("chat_id").to_numpy(), type=pa.int64()),
        "session_id": pa.array(session_id, type=pa.int64()),
        "type": pa.array(df.get_column("type").to_numpy().astype(str)).dictionary_encode(),
        "turn": pa.array(df.get_column("turn").to_numpy(), type=pa.int64()),
    }
    return validated(
        path,
        lines,
        lambda: Trace.from_arrays(
            arrival_s=df.get_column("timestamp").to_numpy(),
            input_tokens=df.get_column("input_length").to_numpy(),
            output_tokens=df.get_column("output_length").to_numpy(),
            hash_offsets=offsets,
            hashes=chain_hashes(offsets, ids.astype(np.uint64)),
            block_tokens=BAILIAN_BLOCK_TOKENS,
            source=f"bailian:{os.path.basename(path)}",
            extra_columns=extra,
        ),
        {**JSONL_COLUMNS, "request_id": "chat_id"},
    )


@register("bailian", "Qwen-Bailian JSONL (16-token per-block hashes, chat sessions)")
def import_bailian(path: str, options: ImportOptions) -> Trace:
    """Qwen-Bailian JSONL (timestamp in s, 16-token per-block content hashes, chat sessions)."""
    df, lines = read_jsonl(path, SCHEMA, FIELDS)
    chat_id = df.get_column("chat_id").to_numpy()
    roots = _session_roots(chat_id, df.get_column("parent_chat_id").to_numpy())
    if roots is None:
        raise InputError("parent_chat_id links form a cycle", path=path, column="parent_chat_id")
    return bailian_trace(path, df, lines, chat_id[roots])
