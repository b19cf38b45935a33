"""``TierState``: one cache tier as preallocated arrays, plus its Python-facing primitives.

A tier is a capacity in blocks and an eviction policy over dense block ids ``0..n_blocks-1``.
All state lives in numpy arrays (struct of arrays) so kernels can hold several tiers at once
and pass ``tier.arrays()`` (one :class:`~kvtier.cache.nb_state.TierArrays`) to
:mod:`kvtier.cache.nb`; a serving engine asks a tier whether a block is resident
(:meth:`contains`), accesses or inserts blocks (:meth:`access`, which reports the block evicted
to make room, for write-back to the tier below), and removes blocks that move up in an
exclusive hierarchy (:meth:`remove`). The Python methods check bounds; the kernels do not.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.cache import enums, kernels, nb
from kvtier.cache.nb_state import TierArrays
from kvtier.cache.policies import PolicySpec, parse_policy
from kvtier.errors import InputError


@dataclass(eq=False)
class TierState:
    """A tier's arrays. Build with :meth:`create`; do not edit the arrays by hand."""

    policy: PolicySpec
    capacity: int
    n_blocks: int
    meta: np.ndarray  # int64 (META_LEN,) scalars at the enums.M_* slots
    fmeta: np.ndarray  # float64 (FMETA_LEN,) GDSF inflation
    blk: np.ndarray  # int32 (n_blocks, 4): lanes enums.L_PRV, L_NXT, L_FREQ, L_WHERE
    prio: np.ndarray  # float64 (n_blocks,) heap priority (LFU, GDSF; length 1 otherwise)
    stamp: np.ndarray  # int64 (n_blocks,) heap tie-break: time of last access (idem)
    heap: np.ndarray  # int32 (capacity + 1,) LFU/GDSF heap (idem)
    hpos: np.ndarray  # int32 (n_blocks,) index in heap or -1 (idem)
    cost: np.ndarray  # float64 (n_blocks,) GDSF per-block cost, ones by default (idem)
    _arrays: TierArrays = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._arrays = TierArrays(
            self.meta,
            self.fmeta,
            self.blk,
            self.prio,
            self.stamp,
            self.heap,
            self.hpos,
            self.cost,
        )

    @classmethod
    def create(
        cls,
        policy: str | PolicySpec,
        capacity: int,
        n_blocks: int,
        *,
        cost: np.ndarray | None = None,
    ) -> TierState:
        """An empty tier of ``capacity`` blocks over ids ``0..n_blocks-1``.

        ``cost`` (GDSF only; float64, finite, >= 0, one per block) is the recompute cost a
        block saves; it defaults to 1 for every block.
        """
        spec = parse_policy(policy)
        capacity, n_blocks, cost_arr = check_tier_args(capacity, n_blocks, cost)
        meta = np.zeros(enums.META_LEN, dtype=np.int64)
        meta[enums.M_POLICY] = spec.code
        meta[enums.M_CAPACITY] = capacity
        for slot in (
            enums.M_HEAD,
            enums.M_TAIL,
            enums.M_SHEAD,
            enums.M_STAIL,
            enums.M_GHEAD,
            enums.M_GTAIL,
            enums.M_HAND,
        ):
            meta[slot] = enums.NIL
        impl = spec.module
        impl.configure(meta, dict(spec.params), capacity)
        # Heap and cost arrays exist only for the policies that read them (LFU, GDSF); the
        # others get length-1 placeholders, which their kernels never index. At 5.6M blocks
        # this saves allocating and zeroing about 160 MB per replay.
        heap_len = min(capacity, n_blocks) + 1 if impl.USES_HEAP else 1
        per_block = n_blocks if impl.USES_HEAP else 1
        if not impl.USES_COST:
            cost_arr = np.ones(1, dtype=np.float64)
        elif cost_arr is None:
            cost_arr = np.ones(n_blocks, dtype=np.float64)
        return cls(
            policy=spec,
            capacity=capacity,
            n_blocks=n_blocks,
            meta=meta,
            fmeta=np.zeros(enums.FMETA_LEN, dtype=np.float64),
            blk=_empty_blocks(n_blocks),
            prio=np.zeros(per_block, dtype=np.float64),
            stamp=np.zeros(per_block, dtype=np.int64),
            heap=np.zeros(heap_len, dtype=np.int32),
            hpos=np.full(per_block, enums.NIL, dtype=np.int32),
            cost=cost_arr,
        )

    # ---- kernel view ---------------------------------------------------------------------
    def arrays(self) -> TierArrays:
        """The state every kernel in :mod:`kvtier.cache.nb` takes (one named tuple)."""
        return self._arrays

    # ---- scalars -------------------------------------------------------------------------
    @property
    def size(self) -> int:
        """Resident blocks."""
        return int(self.meta[enums.M_SIZE])

    @property
    def n_evictions(self) -> int:
        return int(self.meta[enums.M_N_EVICTIONS])

    @property
    def clock(self) -> int:
        """Accesses so far."""
        return int(self.meta[enums.M_CLOCK])

    @property
    def where(self) -> np.ndarray:
        """Per block: enums.W_ABSENT / W_MAIN / W_SMALL / W_GHOST (a read-only view)."""
        view = self.blk[:, enums.L_WHERE]
        view.flags.writeable = False
        return view

    def resident(self) -> np.ndarray:
        """Sorted ids of the resident blocks."""
        return np.flatnonzero((self.where == enums.W_MAIN) | (self.where == enums.W_SMALL))

    # ---- primitives (bounds-checked) -----------------------------------------------------
    def _check(self, b: int) -> int:
        if isinstance(b, bool) or int(b) != b or not 0 <= b < self.n_blocks:
            raise InputError(f"block id must be an integer in [0, {self.n_blocks}), but got {b!r}")
        return int(b)

    def contains(self, b: int) -> bool:
        """Is block ``b`` resident? Does not count as an access."""
        return bool(nb.contains_nb(self._arrays, self._check(b)))

    def access(self, b: int) -> tuple[bool, int]:
        """Access (touch, or admit on a miss) block ``b``; returns (hit, evicted id or -1)."""
        hit, victim = nb.access_nb(self._arrays, self._check(b))
        return bool(hit), int(victim)

    def remove(self, b: int) -> bool:
        """Drop block ``b`` (e.g. it moved up in an exclusive hierarchy); True if resident."""
        return bool(nb.discard_nb(self._arrays, self._check(b)))

    def access_many(self, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Access ``ids`` in order; per access the hit flag (bool) and evicted id (-1 if none)."""
        arr = check_ids(ids, self.n_blocks)
        hit = np.zeros(len(arr), dtype=np.bool_)
        evicted = np.full(len(arr), enums.NIL, dtype=np.int32)
        kernels.access_many_nb(self._arrays, arr, hit, evicted)
        return hit, evicted


def check_tier_args(
    capacity: int, n_blocks: int, cost: np.ndarray | None
) -> tuple[int, int, np.ndarray | None]:
    """``capacity`` and ``n_blocks`` as ints and ``cost`` as float64 (None stays None), checked.

    Shared by :meth:`TierState.create` and the replays that need no tier, so both reject the
    same arguments.
    """
    if isinstance(capacity, bool) or int(capacity) != capacity or capacity < 0:
        raise InputError(f"capacity must be an integer >= 0 blocks, but got {capacity!r}")
    if int(n_blocks) != n_blocks or n_blocks < 0:
        raise InputError(f"n_blocks must be an integer >= 0, but got {n_blocks!r}")
    capacity, n_blocks = int(capacity), int(n_blocks)
    if n_blocks >= np.iinfo(np.int32).max:
        raise InputError(f"n_blocks must be < 2**31 - 1, but got {n_blocks}")
    if cost is None:
        return capacity, n_blocks, None
    cost_arr = np.ascontiguousarray(cost, dtype=np.float64)
    if cost_arr.shape != (n_blocks,):
        raise InputError(
            f"cost must have one value per block ({n_blocks}), got shape {cost_arr.shape}"
        )
    if not np.all(np.isfinite(cost_arr)) or (n_blocks and cost_arr.min() < 0):
        raise InputError("cost must be finite and >= 0 for every block")
    return capacity, n_blocks, cost_arr


def empty_block_row() -> np.ndarray:
    """The row of a block the tier does not hold (no links, absent, no counter)."""
    row = np.zeros(enums.BLK_LANES, dtype=np.int32)
    row[enums.L_PRV] = row[enums.L_NXT] = enums.NIL
    row[enums.L_WHERE] = enums.W_ABSENT
    return row


def _empty_blocks(n_blocks: int) -> np.ndarray:
    blk = np.empty((n_blocks, enums.BLK_LANES), dtype=np.int32)
    blk[:] = empty_block_row()  # one pass over the memory
    return blk


def check_ids(ids: np.ndarray, n_blocks: int) -> np.ndarray:
    """``ids`` as a C-contiguous int32 array with every id in ``[0, n_blocks)``."""
    arr = np.asarray(ids)
    if arr.ndim != 1 or (arr.size and not np.issubdtype(arr.dtype, np.integer)):
        raise InputError("block ids must be a 1-D integer array")
    if arr.size and (int(arr.min()) < 0 or int(arr.max()) >= n_blocks):
        raise InputError(f"block ids must lie in [0, {n_blocks})")
    return np.ascontiguousarray(arr, dtype=np.int32)
