"""The per-trace invariants of request-trace/1 that span record batches.

:func:`kvtier.trace.validate.validate_table` checks a whole table; a trace read or imported by
batches is checked batch by batch (all of its checks, chaining included), and two properties
relate rows of different batches:

- **chaining**: a chained hash stands for its whole prefix, so one hash always sits at the
  same block position after the same parent hash (:func:`~kvtier.trace.validate.check_chained`).
  :class:`ChainCheck` keeps, per distinct hash of a *full* block, its dense id in an
  :class:`~kvtier.trace.idtable.IdTable`, its block position and its parent's id (12 bytes a
  slot, 8 a distinct hash), so memory grows with the distinct full blocks, which the streamed
  mapping's own table holds as well. The hash of a request's partial last block is checked
  within its batch only: almost every request has one of its own (99.8% of the Mooncake
  conversation trace's requests do), so remembering them would cost memory in proportion to
  the requests, and the block mapping never reads it (a partial block is an identity of its
  own, :mod:`kvtier.trace.mapstream`).
- **unique request ids**: :class:`UniqueCheck` keeps every id seen (an integer id exactly; a
  string id as two independent 64-bit hashes of it, so two different strings are taken for the
  same id with a chance of about n^2 / 2^129).

Both report the first offending row as the in-memory check does (same message), numbered from
the start of the whole trace.
"""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.errors import InputError
from kvtier.trace.idtable import IdTable
from kvtier.trace.validate import chain_error


@njit(cache=True, nogil=True)
def _chain_nb(
    offsets: np.ndarray,
    ids: np.ndarray,
    pos0: np.ndarray,
    parent0: np.ndarray,
    filled: int,
) -> tuple[int, int, int, int]:
    """Record each new id's position and parent id; stop at the first hash that breaks them.

    Ids are numbered in order of first appearance, in the order scanned here, so a new id is
    always ``filled``. Returns ``(ids now recorded, bad row or -1, its position, recorded
    position)``.
    """
    for r in range(offsets.shape[0] - 1):
        for j in range(offsets[r], offsets[r + 1]):
            d = ids[j]
            p = j - offsets[r]
            par = ids[j - 1] if p > 0 else -1
            if d >= filled:
                pos0[d] = p
                parent0[d] = par
                filled += 1
            elif pos0[d] != p or parent0[d] != par:
                return filled, r, p, pos0[d]
    return filled, -1, 0, 0


class ChainCheck:
    """Chaining of block hashes checked over every batch read so far."""

    def __init__(self) -> None:
        self.table = IdTable()
        self.pos0 = np.zeros(1 << 16, dtype=np.int32)
        self.parent0 = np.zeros(1 << 16, dtype=np.int32)
        self.filled = 0

    @property
    def nbytes(self) -> int:
        return self.table.nbytes + self.pos0.nbytes + self.parent0.nbytes

    def check(
        self,
        offsets: np.ndarray,
        hashes: np.ndarray,
        full: np.ndarray,
        *,
        row0: int,
        path: str | None,
    ) -> None:
        """Check one batch whose first row is ``row0``: request ``r``'s hashes are
        ``hashes[offsets[r]:offsets[r + 1]]`` (offsets from 0), of which the first ``full[r]``
        are full blocks'."""
        counts = np.minimum(np.diff(offsets), full)
        if not counts.any():
            return
        if not np.array_equal(counts, np.diff(offsets)):
            starts = np.repeat(offsets[:-1], counts)
            within = np.arange(int(counts.sum()), dtype=np.int64) - np.repeat(
                np.cumsum(counts) - counts, counts
            )
            hashes = hashes[starts + within]
            offsets = np.zeros(len(counts) + 1, dtype=np.int64)
            np.cumsum(counts, out=offsets[1:])
        ids = self.table.ids(np.ascontiguousarray(hashes, dtype=np.uint64))
        if self.table.n > len(self.pos0):
            size = max(self.table.n, len(self.pos0) * 3 // 2)
            for name in ("pos0", "parent0"):
                grown = np.zeros(size, dtype=np.int32)
                old = getattr(self, name)
                grown[: len(old)] = old
                setattr(self, name, grown)
        self.filled, row, p, p0 = _chain_nb(
            np.ascontiguousarray(offsets, dtype=np.int64), ids, self.pos0, self.parent0,
            self.filled,
        )  # fmt: skip
        if row >= 0:
            raise chain_error(p, p0, path=path, row=row0 + row)


def _string_keys(values: pa.Array) -> tuple[np.ndarray, np.ndarray]:
    s = pl.from_arrow(values).cast(pl.String)
    hi = s.hash(seed=0x5EED).to_numpy()
    lo = s.hash(seed=0xC0FFEE).to_numpy()
    return hi.astype(np.uint64), lo.astype(np.uint64)


class UniqueCheck:
    """Request ids unique over every batch read so far (within a batch the table check does
    it)."""

    def __init__(self) -> None:
        self._ints: IdTable | None = None
        self._strings: IdTable | None = None

    def check(self, ids: pa.Array, *, row0: int, path: str | None, column: str) -> None:
        if isinstance(ids, pa.ChunkedArray):
            ids = ids.combine_chunks()
        if pa.types.is_integer(ids.type):
            self._ints = self._ints or IdTable()
            table = self._ints
            before = table.n
            dense = table.ids(ids.to_numpy(zero_copy_only=False).astype(np.int64).view(np.uint64))
        else:
            self._strings = self._strings or IdTable(two_words=True)
            table = self._strings
            before = table.n
            dense = table.ids(*_string_keys(ids))
        seen = dense < before
        if seen.any():
            raise InputError(
                "duplicate request id",
                path=path,
                row=row0 + int(np.flatnonzero(seen)[0]),
                column=column,
            )
