"""A persistent key-to-dense-id table, for numbering the blocks of a trace read in batches.

The in-memory mapping (:mod:`kvtier.trace.blocks`) numbers a whole trace's block identities
with one ``numpy.unique``; a trace larger than memory arrives in record batches, so the
numbering must survive from one batch to the next. This is an open-addressing hash table
(linear probing, power-of-two capacity, grown by doubling at a load of 3/4) from a key of one
or two 64-bit words to an int32 id given in order of first insertion. Its memory is
proportional to the number of *distinct* keys (12 bytes a slot for one-word keys, 20 for two),
never to the number of lookups.

Keys are exact (both words are stored and compared), so no two identities ever share an id:
the ids equal the in-memory mapping's, not approximately but exactly.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.errors import InputError

MAX_LOAD_NUM, MAX_LOAD_DEN = 3, 4
MAX_IDS = 2**31 - 1  # ids are int32
_EMPTY = -1


class Slots(NamedTuple):
    """The table's slots as its kernels take them (numba compiles a named tuple as a plain
    tuple; the kernels read the fields into locals before their loops)."""

    keys_hi: np.ndarray  # u8 (capacity,): first word of the key in each slot
    keys_lo: np.ndarray  # u8 (capacity,), or (1,) for one-word keys: second word
    vals: np.ndarray  # i4 (capacity,): the id in each slot, -1 for an empty slot
    two_words: bool  # keys of two words (else keys_lo is never read)


@njit(cache=True, nogil=True, inline="always")
def _slot(hi: np.uint64, lo: np.uint64, mask: np.uint64) -> np.int64:
    """splitmix64's finaliser over both words: consecutive ids and hashes spread evenly."""
    z = hi ^ (lo * np.uint64(0x9E3779B97F4A7C15))
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    z = z ^ (z >> np.uint64(31))
    return np.int64(z & mask)


@njit(cache=True, nogil=True, inline="always")
def _probe(
    keys_hi: np.ndarray,
    keys_lo: np.ndarray,
    vals: np.ndarray,
    two_words: bool,
    hi: np.uint64,
    lo: np.uint64,
    mask: np.uint64,
) -> np.int64:
    """The slot holding key ``(hi, lo)``, or the empty slot where it would go (linear
    probing from its hash)."""
    s = _slot(hi, lo, mask)
    while True:
        if vals[s] == _EMPTY or (keys_hi[s] == hi and (not two_words or keys_lo[s] == lo)):
            return s
        s = (s + 1) & np.int64(mask)


@njit(cache=True, nogil=True)
def _insert_nb(
    tab: Slots,
    n_used: int,
    limit: int,
    q_hi: np.ndarray,
    q_lo: np.ndarray,
    start: int,
    out: np.ndarray,
) -> tuple[int, int]:
    """Look up ``(q_hi[i], q_lo[i])`` for ``i >= start``, inserting new keys with the next id.

    Stops before inserting past ``limit`` keys (the caller grows the table and resumes).
    Returns ``(next index to process, keys now held)``.
    """
    keys_hi, keys_lo, vals, two_words = tab.keys_hi, tab.keys_lo, tab.vals, tab.two_words
    mask = np.uint64(vals.shape[0] - 1)
    for i in range(start, q_hi.shape[0]):
        hi = q_hi[i]
        lo = q_lo[i] if two_words else np.uint64(0)
        s = _probe(keys_hi, keys_lo, vals, two_words, hi, lo, mask)
        v = vals[s]
        if v != _EMPTY:
            out[i] = v
            continue
        if n_used >= limit:
            return i, n_used
        keys_hi[s] = hi
        if two_words:
            keys_lo[s] = lo
        vals[s] = n_used
        out[i] = n_used
        n_used += 1
    return q_hi.shape[0], n_used


@njit(cache=True, nogil=True)
def _rehash_nb(tab: Slots, new: Slots) -> None:
    """Every key of ``tab`` into the empty, larger table ``new``, keeping its id."""
    keys_hi, keys_lo, vals, two_words = tab.keys_hi, tab.keys_lo, tab.vals, tab.two_words
    new_hi, new_lo, new_vals = new.keys_hi, new.keys_lo, new.vals
    mask = np.uint64(new_vals.shape[0] - 1)
    for s in range(vals.shape[0]):
        v = vals[s]
        if v == _EMPTY:
            continue
        hi = keys_hi[s]
        lo = keys_lo[s] if two_words else np.uint64(0)
        t = _slot(hi, lo, mask)
        while new_vals[t] != _EMPTY:
            t = (t + 1) & np.int64(mask)
        new_hi[t] = hi
        if two_words:
            new_lo[t] = lo
        new_vals[t] = v


@njit(cache=True, nogil=True)
def _find_nb(tab: Slots, q_hi: np.ndarray, q_lo: np.ndarray, out: np.ndarray) -> None:
    """The id of each key ``(q_hi[i], q_lo[i])`` held, or -1; nothing is inserted."""
    keys_hi, keys_lo, vals, two_words = tab.keys_hi, tab.keys_lo, tab.vals, tab.two_words
    mask = np.uint64(vals.shape[0] - 1)
    for i in range(q_hi.shape[0]):
        lo = q_lo[i] if two_words else np.uint64(0)
        out[i] = vals[_probe(keys_hi, keys_lo, vals, two_words, q_hi[i], lo, mask)]


class IdTable:
    """Keys (one or two uint64 words) to int32 ids ``0, 1, 2, ...`` in order of first sight."""

    def __init__(self, *, two_words: bool = False, capacity: int = 1 << 16) -> None:
        cap = 1 << max(4, int(capacity - 1).bit_length())
        self.two_words = bool(two_words)
        self._alloc(cap)
        self.n = 0

    def _alloc(self, cap: int) -> None:
        self.keys_hi = np.zeros(cap, dtype=np.uint64)
        self.keys_lo = np.zeros(cap if self.two_words else 1, dtype=np.uint64)
        self.vals = np.full(cap, _EMPTY, dtype=np.int32)

    def _slots(self) -> Slots:
        return Slots(self.keys_hi, self.keys_lo, self.vals, self.two_words)

    @property
    def capacity(self) -> int:
        return len(self.vals)

    @property
    def nbytes(self) -> int:
        return self.keys_hi.nbytes + self.keys_lo.nbytes + self.vals.nbytes

    def _grow(self) -> None:
        old = self._slots()
        self._alloc(2 * len(old.vals))
        _rehash_nb(old, self._slots())

    def find(self, hi: np.ndarray, lo: np.ndarray | None = None) -> np.ndarray:
        """The id of every key already held, -1 for the others (int32); the table is unchanged."""
        hi, lo = self._keys(hi, lo)
        out = np.empty(len(hi), dtype=np.int32)
        _find_nb(self._slots(), hi, lo, out)
        return out

    def _keys(self, hi: np.ndarray, lo: np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
        hi = np.ascontiguousarray(hi, dtype=np.uint64)
        if hi.ndim != 1:
            raise ValueError("keys must be 1-D")
        if self.two_words:
            if lo is None or len(lo) != len(hi):
                raise ValueError("a two-word table needs a second word per key")
            return hi, np.ascontiguousarray(lo, dtype=np.uint64)
        if lo is not None:
            raise ValueError("a one-word table takes one word per key")
        return hi, self.keys_lo[:0]

    def ids(self, hi: np.ndarray, lo: np.ndarray | None = None) -> np.ndarray:
        """The id of every key ``(hi[i], lo[i])``, numbering new keys as they come (int32)."""
        hi, lo = self._keys(hi, lo)
        out = np.empty(len(hi), dtype=np.int32)
        start = 0
        while True:
            limit = min(self.capacity * MAX_LOAD_NUM // MAX_LOAD_DEN, MAX_IDS)
            start, self.n = _insert_nb(self._slots(), self.n, limit, hi, lo, start, out)
            if start == len(hi):
                return out
            if self.n >= MAX_IDS:
                raise InputError(
                    f"more than {MAX_IDS:,} distinct blocks: they do not fit int32 block ids "
                    "(map at a larger block size, or a sample)",
                    option="--block-tokens",
                )
            self._grow()
