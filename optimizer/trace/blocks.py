"""Block mapping: a ``Trace`` at native granularity G to a ``BlockedTrace`` at block size B.

Semantics (docs/design.md section 3):

* ``B = m*G``: block j covers native blocks ``[j*m, (j+1)*m)``; its identity is the chained
  hash of its last native block (which stands for the whole prefix).
* ``B = G/m``: sub-block k of native block j has identity ``(hash_j, k)``.
* Only *full* B-blocks are cacheable, as in vLLM: a request has ``input_tokens // B`` blocks,
  and the rest of its prompt is always computed.
* Identities are salted by tenant unless ``share_across_tenants`` is set.
* Identities become dense int32 ids in first-appearance order, so the simulators index arrays
  instead of hashing, and ids of early blocks are small (good locality for the kernels).

The mapping is vectorised: one ``numpy.unique`` over the native hashes, index arithmetic over
the block references, and a numbering of keys in order of first appearance (NumPy for a small
trace, so that mapping one imports no numba; a jitted pass for a large one).
"""

from __future__ import annotations

import numpy as np

from kvtier.trace.blocked import BlockedTrace, check_block_size
from kvtier.trace.format import PASS_COLUMN, Trace

# At most this many keys are numbered with NumPy alone (a few hundredths of a second for a
# million, no numba to import); more go to the jitted pass of kvtier.trace.blocks_nb, whose one
# loop is 4-6x faster than NumPy's four passes (5M keys: 0.06 s against 0.33 s of CPU).
NUMPY_IDS_MAX = 1 << 20


def _first_appearance_ids_np(keys: np.ndarray, key_range: int) -> tuple[np.ndarray, int]:
    """:func:`first_appearance_ids` with NumPy alone: each key's first position
    (``np.minimum.at``), the positions that are first ones marked, ids by their order."""
    n = keys.shape[0]
    first = np.full(key_range, n, dtype=np.int64)
    np.minimum.at(first, keys, np.arange(n, dtype=np.int64))
    starts = first[first < n]
    is_first = np.zeros(n, dtype=bool)
    is_first[starts] = True
    lookup = np.empty(key_range, dtype=np.int32)
    lookup[keys[is_first]] = np.arange(len(starts), dtype=np.int32)
    return lookup[keys], len(starts)


def first_appearance_ids(keys: np.ndarray, key_range: int) -> tuple[np.ndarray, int]:
    """Dense int32 ids for non-negative integer ``keys`` below ``key_range``."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    if key_range < 0 or key_range >= 2**31:
        raise ValueError(f"key range {key_range} does not fit dense int32 ids")
    if len(keys) and (keys.min() < 0 or keys.max() >= key_range):
        raise ValueError("keys must lie in [0, key_range)")
    if len(keys) <= NUMPY_IDS_MAX:
        return _first_appearance_ids_np(keys, int(key_range))
    from kvtier.trace.blocks_nb import first_appearance_ids_nb

    return first_appearance_ids_nb(keys, int(key_range))


def tenant_codes(trace: Trace) -> np.ndarray | None:
    """Dense int32 tenant index per request (in order of first appearance), or None."""
    if not trace.has_column("tenant"):
        return None
    import polars as pl

    names = pl.from_arrow(trace.table.column("tenant")).cast(pl.String)
    seen = names.unique(maintain_order=True)
    codes = names.replace_strict(seen, np.arange(len(seen)), return_dtype=pl.Int32)
    return np.ascontiguousarray(codes.to_numpy())


def block_trace(
    trace: Trace, block_tokens: int, *, share_across_tenants: bool = False
) -> BlockedTrace:
    """Map ``trace`` to full ``block_tokens``-token blocks with dense int32 ids."""
    G = trace.block_tokens
    B = check_block_size(block_tokens, G, trace.path)
    n = trace.n_requests
    inp = trace.input_tokens
    tenants = tenant_codes(trace)

    n_full = inp // B if trace.has_prefix_info else np.zeros(n, dtype=np.int64)
    block_offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(n_full, out=block_offsets[1:])
    total = int(block_offsets[-1])

    if total == 0:
        block_ids = np.zeros(0, dtype=np.int32)
        n_blocks = 0
    else:
        hash_offsets, hashes = trace.hash_arrays()
        # 1. dense ids for native hashes (salted by tenant unless sharing is allowed)
        uniq, native_dense = np.unique(hashes, return_inverse=True)
        native_dense = native_dense.astype(np.int64).ravel()
        native_range = len(uniq)
        if tenants is not None and not share_across_tenants and tenants.max() > 0:
            n_tenants = int(tenants.max()) + 1
            native_req = np.repeat(tenants.astype(np.int64), np.diff(hash_offsets))
            salted = native_dense * n_tenants + native_req
            uniq2, native_dense = np.unique(salted, return_inverse=True)
            native_dense = native_dense.astype(np.int64).ravel()
            native_range = len(uniq2)
        # 2. per block reference: which native block, and which piece of it
        req_start = np.repeat(hash_offsets[:-1], n_full)
        pos = np.arange(total, dtype=np.int64) - np.repeat(block_offsets[:-1], n_full)
        if B >= G:
            m = B // G
            keys = native_dense[req_start + (pos + 1) * m - 1]
            key_range = native_range
        else:
            m = G // B
            keys = native_dense[req_start + pos // m] * m + pos % m
            key_range = native_range * m
        del req_start, pos
        # 3. dense ids in order of first appearance
        block_ids, n_blocks = first_appearance_ids(keys, key_range)

    def optional(name: str, dtype: type) -> np.ndarray | None:
        return trace.column_numpy(name, dtype) if trace.has_column(name) else None

    return BlockedTrace(
        arrival_s=trace.arrival_s,
        input_tokens=inp,
        output_tokens=trace.output_tokens,
        block_offsets=block_offsets,
        block_ids=block_ids,
        n_blocks=int(n_blocks),
        block_tokens=B,
        session_id=optional("session_id", np.int64),
        tenant_id=tenants,
        pass_index=optional(PASS_COLUMN, np.int32),
        source=trace.source,
        sample_fraction=trace.sample_fraction,
        sample_strata=trace.sample_strata,
    )
