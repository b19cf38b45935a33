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
the block references, and one jitted pass that numbers keys in order of first appearance.
"""

from __future__ import annotations

import numpy as np
import polars as pl
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.format import PASS_COLUMN, Trace
from kvtier.trace.mapstream import check_block_size


@njit(cache=True, nogil=True)
def _first_appearance_ids_nb(keys: np.ndarray, key_range: int) -> tuple[np.ndarray, int]:
    """Number ``keys`` (each in ``[0, key_range)``) 0, 1, 2, ... in order of first appearance."""
    lookup = np.full(key_range, -1, dtype=np.int32)
    out = np.empty(keys.shape[0], dtype=np.int32)
    next_id = 0
    for i in range(keys.shape[0]):
        k = keys[i]
        v = lookup[k]
        if v < 0:
            v = next_id
            lookup[k] = v
            next_id += 1
        out[i] = v
    return out, next_id


def first_appearance_ids(keys: np.ndarray, key_range: int) -> tuple[np.ndarray, int]:
    """Dense int32 ids for non-negative integer ``keys`` below ``key_range``."""
    keys = np.ascontiguousarray(keys, dtype=np.int64)
    if key_range < 0 or key_range >= 2**31:
        raise ValueError(f"key range {key_range} does not fit dense int32 ids")
    if len(keys) and (keys.min() < 0 or keys.max() >= key_range):
        raise ValueError("keys must lie in [0, key_range)")
    return _first_appearance_ids_nb(keys, int(key_range))


def tenant_codes(trace: Trace) -> np.ndarray | None:
    """Dense int32 tenant index per request (in order of first appearance), or None."""
    if not trace.has_column("tenant"):
        return None
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
