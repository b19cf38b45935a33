"""Importing JSON Lines logs that carry block hashes, larger than memory, by chunks of lines.

The Mooncake and Qwen-Bailian layouts and ``--from jsonl --columns ...`` (with or without
``hashes=``) are read a chunk of whole lines at a time (gzip input is decompressed as it is
read). Each chunk is parsed and checked by the in-memory importer's own code
(:func:`~kvtier.trace.importers.common.parse_jsonl`, the importers' trace builders), with line
numbers counted from the start of the file, so a malformed line is reported by its line and
the source's field name as in memory; the trace is written chunk by chunk. What spans chunks
is carried between them: the chaining of hashes and unique request ids
(:class:`~kvtier.trace.batches.CrossChecks`), the arrival origin and order
(:class:`~kvtier.trace.importers.tabular.ArrivalState`) and, for Qwen-Bailian, the session of
every request seen (:class:`SessionLinks`). Memory is bounded by the chunk and by the distinct
blocks (and, for Qwen-Bailian, a few dozen bytes a request), not by the file's size.

Two differences from the in-memory import, both refusals: rows must be in arrival order (the
first row out of order is reported: sorting would need the whole file), and a Qwen-Bailian
request must come after its parent (its session is known only then).
"""

from __future__ import annotations

import gzip
import zlib
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from kvtier.errors import InputError
from kvtier.files import atomic_write
from kvtier.trace.batches import CrossChecks
from kvtier.trace.format import Trace
from kvtier.trace.importers.common import check_utf8
from kvtier.trace.importers.tabular import ArrivalState, ColumnMap
from kvtier.trace.io import open_input, read_input
from kvtier.trace.progress import count
from kvtier.trace.streaming import StreamSummary

if TYPE_CHECKING:
    from kvtier.trace.idtable import IdTable

BATCH_ROWS = 1 << 18  # lines a chunk (about 50 MB of Mooncake JSON)
_READ_BYTES = 1 << 24
_UTF8_BOM = b"\xef\xbb\xbf"


@dataclass(frozen=True)
class JsonlPlan:
    """A streamed JSON Lines import: the layout (``mooncake``, ``bailian`` or ``jsonl``) and,
    for ``jsonl``, the column mapping."""

    kind: str
    cmap: ColumnMap | None = None


def line_chunks(path: str, batch_rows: int) -> Iterator[tuple[int, bytes]]:
    """``(line number of the first line, bytes)`` of up to ``batch_rows`` whole lines at a time
    (gzip decompressed, a leading UTF-8 byte-order mark dropped, text checked to be UTF-8)."""
    gz = read_input(path, 2) == b"\x1f\x8b"
    raw = open_input(path)
    fh = gzip.GzipFile(fileobj=raw) if gz else raw  # a GzipFile leaves its file open
    line = 1
    parts: list[bytes] = []
    count = 0  # newlines in parts
    first = True
    with raw, fh:
        while True:
            try:
                block = fh.read(_READ_BYTES)
            except (OSError, EOFError, zlib.error) as err:
                raise InputError(f"corrupt gzip file: {err}", path=path) from None
            if first:
                block = block.removeprefix(_UTF8_BOM)
                first = False
            if not block:
                break
            nl = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == ord("\n"))
            start, taken = 0, 0
            while count + len(nl) - taken >= batch_rows:
                end = int(nl[taken + batch_rows - count - 1]) + 1
                yield line, check_utf8(path, line, b"".join([*parts, block[start:end]]))
                taken += batch_rows - count
                line += batch_rows
                parts, count, start = [], 0, end
            if start < len(block):
                parts.append(block[start:])
                count += len(nl) - taken
    if parts:
        yield line, check_utf8(path, line, b"".join(parts))


class SessionLinks:
    """Qwen-Bailian sessions across chunks: every chat id seen, with its session (its root's
    chat id), and the parents asked for but not seen (a window of the log starts mid-session).

    A request's root follows ``parent_chat_id`` as the in-memory import's does; a parent that
    turns up after a child was given a session of its own is refused, since the child's session
    would then differ from the in-memory import's."""

    def __init__(self) -> None:
        from kvtier.trace.idtable import IdTable

        self.ids: IdTable = IdTable()
        self.missing: IdTable = IdTable()
        self.root = np.zeros(1 << 16, dtype=np.int64)

    def sessions(
        self, path: str, lines: np.ndarray, chat_id: np.ndarray, parent: np.ndarray
    ) -> np.ndarray:
        """The session id of each row of one chunk (rows in file order)."""
        keys = chat_id.astype(np.int64).view(np.uint64)
        if self.missing.n:
            late = self.missing.find(keys) >= 0
            if late.any():
                raise InputError(
                    "is the parent_chat_id of a request on an earlier line: a streamed import "
                    "needs every request after its parent (import with --no-stream)",
                    path=path,
                    line=int(lines[int(np.flatnonzero(late)[0])]),
                    column="chat_id",
                )
        before = self.ids.n
        dense = self.ids.ids(keys)
        if self.ids.n - before != len(keys):
            repeated = (dense < before) | ~pl.Series(dense).is_first_distinct().to_numpy()
            raise InputError(
                "duplicate request id",
                path=path,
                line=int(lines[int(np.flatnonzero(repeated)[0])]),
                column="chat_id",
            )
        m = len(keys)
        found = self.ids.find(parent.astype(np.int64).view(np.uint64))
        found[parent < 0] = -1
        here = found >= before
        up = np.where(here, found.astype(np.int64) - before, np.arange(m))
        for _ in range(64):
            nxt = up[up]
            if np.array_equal(nxt, up):
                break
            up = nxt
        if here[up].any():
            raise InputError(
                "parent_chat_id links form a cycle",
                path=path,
                line=int(lines[int(np.flatnonzero(here[up])[0])]),
                column="parent_chat_id",
            )
        earlier = found[up]
        session = np.where(earlier >= 0, self.root[np.maximum(earlier, 0)], chat_id[up])
        if self.ids.n > len(self.root):
            grown = np.zeros(1 << int(self.ids.n - 1).bit_length(), dtype=np.int64)
            grown[: len(self.root)] = self.root
            self.root = grown
        self.root[before : before + m] = session
        unseen = (parent >= 0) & (found < 0)
        if unseen.any():
            self.missing.ids(parent[unseen].astype(np.int64).view(np.uint64))
        return session


def stream_import_jsonl(
    path: str, plan: JsonlPlan, out: str, *, batch_rows: int = BATCH_ROWS
) -> StreamSummary:
    """Import the JSON Lines log ``path`` (layout ``plan``) to the trace file ``out``
    (Parquet), ``batch_rows`` lines at a time; the result equals the in-memory import's."""
    if Path(out).suffix.lower() != ".parquet":
        raise InputError("a streamed import writes Parquet: name the output .parquet", path=out)
    if batch_rows < 1:
        raise InputError(f"must be >= 1, got {batch_rows}", option="--batch-rows")
    keys: set[str] = set()
    build, used = _builder(path, plan, keys)
    summary = {"n": 0, "first": 0.0, "last": 0.0}
    meta: dict[str, object] = {}

    def write(tmp: str) -> None:
        writer: pq.ParquetWriter | None = None
        checks: CrossChecks | None = None
        try:
            for first_line, data in line_chunks(path, batch_rows):
                count(data.count(b"\n"), len(data))
                built = build(first_line, data)
                if built is None:
                    continue
                trace, lines, columns = built
                table = trace.table
                if writer is None:
                    names = table.column_names
                    checks = CrossChecks(
                        trace.block_tokens, trace.has_prefix_info, "request_id" in names
                    )
                    writer = pq.ParquetWriter(tmp, table.schema, compression="zstd")
                    meta.update(block_tokens=trace.block_tokens, prefix=trace.has_prefix_info)
                    summary["first"] = float(table.column("arrival_s")[0].as_py())
                assert checks is not None
                _cross_check(checks, table, summary["n"], path, lines, columns)
                writer.write_table(_conformed(table, writer.schema, path, lines))
                summary["n"] += table.num_rows
                summary["last"] = float(table.column("arrival_s")[-1].as_py())
        finally:
            if writer is not None:
                writer.close()
        if writer is None:
            raise InputError("empty file", path=path)

    atomic_write(out, write)
    from kvtier.trace.importers.common import note_ignored

    note_ignored(path, keys, used)
    return StreamSummary(
        n_requests=int(summary["n"]),
        duration_s=summary["last"] - summary["first"],
        block_tokens=int(meta["block_tokens"]),  # type: ignore[call-overload]
        has_prefix_info=bool(meta["prefix"]),
    )


def _cross_check(
    checks: CrossChecks,
    table: pa.Table,
    row0: int,
    path: str,
    lines: np.ndarray,
    columns: dict[str, str],
) -> None:
    """:meth:`CrossChecks.check`, its error naming the line and the source's field."""
    try:
        checks.check(table, row0, path)
    except InputError as err:
        if err.row is not None:
            err.line, err.row = int(lines[err.row - row0]), None
        err.column = columns.get(err.column or "", err.column)
        err.args = (err.format(),)
        raise


def _conformed(table: pa.Table, schema: pa.Schema, path: str, lines: np.ndarray) -> pa.Table:
    """``table`` in the first chunk's ``schema`` (a mapped log's inferred column types may
    differ from chunk to chunk where the in-memory import would have read one type)."""
    if table.schema.equals(schema):
        return table
    try:
        return table.cast(schema)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError, ValueError):
        changed = [
            f.name for f in schema if f.name not in table.column_names or table.schema.field(
                f.name).type != f.type
        ]  # fmt: skip
        raise InputError(
            f"column {', '.join(changed) or '?'} changes type in the chunk starting here "
            "(for example integer request ids, then strings): import with --no-stream",
            path=path,
            line=int(lines[0]),
        ) from None


def _builder(path: str, plan: JsonlPlan, keys: set[str]):  # noqa: ANN202
    """``build(first_line, data) -> (trace, lines, trace column -> source field) | None`` for
    one chunk of the layout ``plan``, and the source fields it reads; the field names seen
    are added to ``keys`` (for the note on those ignored)."""
    from kvtier.trace.importers.common import (
        JSONL_COLUMNS,
        content_line_numbers,
        parse_jsonl,
        scan_keys,
    )

    def blank(data: bytes) -> bool:
        return data.isspace() and not data.strip(b" \t\r\n")  # isspace stops at a visible byte

    if plan.kind == "mooncake":
        from kvtier.trace.importers import mooncake as mc

        state = ArrivalState()

        def build_mooncake(first_line: int, data: bytes):  # noqa: ANN202
            if blank(data):
                return None
            df, lines = parse_jsonl(data, path, mc.SCHEMA, mc.FIELDS, first_line, keys)
            stamps = df.get_column("timestamp").to_numpy()
            state.check_order(path, lines, stamps, "timestamp")
            return mc.mooncake_trace(path, df, lines), lines, JSONL_COLUMNS

        return build_mooncake, set(mc.SCHEMA)
    if plan.kind == "bailian":
        from kvtier.trace.importers import bailian as bl

        state = ArrivalState()
        links = SessionLinks()
        columns = {**JSONL_COLUMNS, "request_id": "chat_id"}

        def build_bailian(first_line: int, data: bytes):  # noqa: ANN202
            if blank(data):
                return None
            df, lines = parse_jsonl(data, path, bl.SCHEMA, bl.FIELDS, first_line, keys)
            state.check_order(path, lines, df.get_column("timestamp").to_numpy(), "timestamp")
            session = links.sessions(
                path,
                lines,
                df.get_column("chat_id").to_numpy(),
                df.get_column("parent_chat_id").to_numpy(),
            )
            trace = bl.bailian_trace(path, df, lines, session)
            return trace, lines, columns

        return build_bailian, set(bl.SCHEMA)
    if plan.kind == "jsonl" and plan.cmap is not None:
        from kvtier.trace.importers.common import first_bad_json_line
        from kvtier.trace.importers.tabular import lengths_trace

        cmap = plan.cmap
        state = ArrivalState()

        def build_mapped(first_line: int, data: bytes):  # noqa: ANN202
            if blank(data):
                return None
            lines = content_line_numbers(data) + (first_line - 1)
            try:
                df = pl.read_ndjson(data, infer_schema_length=None)
            except Exception as err:  # polars raises several error types for bad input
                error = first_bad_json_line(data, {})
                if error.line is None:
                    error = InputError(f"malformed JSON Lines: {' '.join(str(err).split())[:200]}")
                else:
                    error.line += first_line - 1
                    error.args = (error.format(),)
                raise error.with_path(path) from None
            if len(lines) != df.height:
                raise InputError("could not match JSON rows to lines", path=path)
            keys.update(scan_keys(data, path, first_line))
            trace: Trace = lengths_trace(path, df, lines, cmap, "jsonl", state)
            return trace, lines, cmap.used()

        return build_mapped, set(cmap.used().values())
    raise InputError(f"--from {plan.kind} does not stream as JSON Lines", option="--stream")
