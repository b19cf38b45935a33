"""Block hashes over token ids by vLLM's prefix-cache rule, so imported prompts share exactly
the blocks vLLM would share.

The rule, as read in vLLM's ``vllm/v1/core/kv_cache_utils.py`` (``hash_block_tokens``,
``get_request_block_hasher``, ``generate_block_hash_extra_keys``, ``init_none_hash``; commit
001cabc1be16a59a70d720ed61a13b678c060a18, the v0.11-era V1 engine) and
``vllm/utils/hashing.py`` (``sha256_cbor``)::

    BlockHash(i) = sha256(cbor((BlockHash(i-1) or NONE_HASH, tuple(block_i_tokens), extra_keys)))

* only *full* blocks of ``block_size`` tokens are hashed and cached;
* ``NONE_HASH``, the parent of block 0, is ``sha256_cbor(PYTHONHASHSEED)`` (random when the
  variable is unset); kvtier uses the seed ``"0"``, so a server started with
  ``PYTHONHASHSEED=0 --prefix-caching-hash-algo sha256_cbor`` hashes exactly as this module;
* ``extra_keys`` is ``None`` unless the request has a LoRA adapter (its name, on every block),
  multimodal inputs (not produced by text importers) or a ``cache_salt`` (the salt, on block 0
  only: the chain carries it to every later block, so salted prompts share nothing with others);
* the 64-bit form vLLM publishes with ``VLLM_KV_EVENTS_USE_INT_BLOCK_HASHES`` is the digest's
  last 8 bytes read big-endian (``maybe_convert_block_hash``), which is what request-trace/1
  stores as ``block_hashes``.

request-trace/1 also stores a hash for a partial last block, which vLLM never hashes; it is
computed by the same formula over the partial block's tokens. Its only use downstream is as the
prompt's last chain entry: the simulator caches full blocks only (``kvtier.trace.blocks``), so
the partial block is always recomputed, as in vLLM.

The chain is sequential, so each new block costs one SHA-256 call (C, in ``hashlib``) on a
payload assembled from a CBOR encoding of all token ids made at once with numpy; consecutive
requests of a session reuse the hashes of their common full-block prefix, so a conversation's
history is hashed once, not once per turn.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import numpy as np

HASH_SEED = "0"  # PYTHONHASHSEED the imported hashes correspond to
_MASK64 = (1 << 64) - 1


# -- canonical CBOR (RFC 8949) of the few types a block key holds ---------------------------------
def _head(major: int, n: int) -> bytes:
    """A CBOR item head: major type and argument, in the shortest form (canonical)."""
    top = major << 5
    if n < 24:
        return bytes((top | n,))
    if n < 0x100:
        return bytes((top | 24, n))
    if n < 0x10000:
        return bytes((top | 25,)) + n.to_bytes(2, "big")
    if n < 0x1_0000_0000:
        return bytes((top | 26,)) + n.to_bytes(4, "big")
    return bytes((top | 27,)) + n.to_bytes(8, "big")


def cbor(value: object) -> bytes:
    """Canonical CBOR of ``None``, ``int``, ``bytes``, ``str`` and tuples / lists of them, as
    ``cbor2.dumps(value, canonical=True)`` writes them (vLLM's ``sha256_cbor``)."""
    if value is None:
        return b"\xf6"
    if isinstance(value, bool):
        return b"\xf5" if value else b"\xf4"
    if isinstance(value, int):
        return _head(0, value) if value >= 0 else _head(1, -1 - value)
    if isinstance(value, bytes):
        return _head(2, len(value)) + value
    if isinstance(value, str):
        data = value.encode("utf-8")
        return _head(3, len(data)) + data
    if isinstance(value, tuple | list):
        return _head(4, len(value)) + b"".join(cbor(v) for v in value)
    raise TypeError(f"no CBOR encoding for {type(value).__name__}")


def cbor_uint_array(ids: np.ndarray) -> tuple[bytes, np.ndarray]:
    """CBOR items of non-negative integers, all at once: ``(bytes, starts)`` where item ``i``
    is ``bytes[starts[i]:starts[i+1]]`` (``starts`` has ``len(ids) + 1`` entries)."""
    ids = np.asarray(ids, dtype=np.uint64)
    lengths = np.ones(len(ids), dtype=np.int64)
    lengths += ids >= 24
    lengths += ids >= 0x100
    lengths += 2 * (ids >= 0x10000)
    lengths += 4 * (ids >= 0x1_0000_0000)
    starts = np.zeros(len(ids) + 1, dtype=np.int64)
    np.cumsum(lengths, out=starts[1:])
    out = np.zeros(int(starts[-1]), dtype=np.uint8)
    pos = starts[:-1]
    for width, code, shift_bytes in ((2, 24, 1), (3, 25, 2), (5, 26, 4), (9, 27, 8)):
        m = lengths == width
        if not m.any():
            continue
        p, v = pos[m], ids[m]
        out[p] = code
        for k in range(shift_bytes):
            out[p + 1 + k] = (v >> np.uint64(8 * (shift_bytes - 1 - k))) & np.uint64(0xFF)
    m = lengths == 1
    out[pos[m]] = ids[m].astype(np.uint8)
    return out.tobytes(), starts


def none_hash(seed: str = HASH_SEED) -> bytes:
    """vLLM's ``NONE_HASH`` for ``PYTHONHASHSEED=seed`` under ``sha256_cbor``."""
    return hashlib.sha256(cbor(seed)).digest()


def block_extra_keys(block_index: int, cache_salt: str | None, lora_name: str | None) -> bytes:
    """CBOR of a block's ``extra_keys``: LoRA name (every block), then the cache salt (block 0
    only), or ``None`` (``generate_block_hash_extra_keys``)."""
    keys: list[str] = []
    if lora_name:
        keys.append(lora_name)
    if cache_salt and block_index == 0:
        keys.append(cache_salt)
    return cbor(tuple(keys)) if keys else b"\xf6"


def hash_block(parent: bytes, token_cbor: bytes, n_tokens: int, extra: bytes = b"\xf6") -> bytes:
    """``hash_block_tokens``: SHA-256 of ``cbor((parent, tokens, extra_keys))``, assembled from
    pre-encoded parts (``token_cbor`` is the concatenated CBOR items of the block's tokens)."""
    payload = b"\x83" + _head(2, len(parent)) + parent + _head(4, n_tokens) + token_cbor + extra
    return hashlib.sha256(payload).digest()


def to_uint64(digests: Sequence[bytes]) -> np.ndarray:
    """The 64-bit block hash vLLM publishes: each digest's last 8 bytes, big-endian."""
    if not digests:
        return np.zeros(0, dtype=np.uint64)
    tails = b"".join(d[-8:] for d in digests)
    return np.frombuffer(tails, dtype=">u8").astype(np.uint64)


def prompt_block_hashes(
    token_ids: Sequence[np.ndarray],
    block_tokens: int,
    *,
    cache_salts: Sequence[str | None] | None = None,
    lora_names: Sequence[str | None] | None = None,
    previous: np.ndarray | None = None,
    seed: str = HASH_SEED,
) -> tuple[np.ndarray, np.ndarray]:
    """Chained vLLM block hashes of every prompt, as request-trace/1 ``(offsets, hashes)``.

    ``token_ids[i]`` is prompt ``i``; it gets ``ceil(len / block_tokens)`` hashes, the last for
    a partial block when the length is not a multiple. ``previous[i]`` (or -1) names an earlier
    prompt, typically the session's previous turn, whose full-block hashes are reused over the
    common prefix instead of being recomputed (same salt and LoRA required; the result is the
    same either way).
    """
    n = len(token_ids)
    salts = list(cache_salts) if cache_salts is not None else [None] * n
    loras = list(lora_names) if lora_names is not None else [None] * n
    prev = np.full(n, -1, dtype=np.int64) if previous is None else np.asarray(previous, np.int64)
    lengths = np.fromiter((len(t) for t in token_ids), dtype=np.int64, count=n)
    counts = -(-lengths // block_tokens)
    offsets = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(counts, out=offsets[1:])
    flat = (
        np.concatenate([np.asarray(t, dtype=np.uint64) for t in token_ids])
        if n
        else np.zeros(0, dtype=np.uint64)
    )
    data, starts = cbor_uint_array(flat)
    tok_base = np.zeros(n + 1, dtype=np.int64)
    np.cumsum(lengths, out=tok_base[1:])
    root = none_hash(seed)
    digests: list[bytes] = [b""] * int(offsets[-1])
    for i in range(n):
        base, length = int(tok_base[i]), int(lengths[i])
        reuse = 0
        p = int(prev[i])
        if 0 <= p < i and salts[p] == salts[i] and loras[p] == loras[i]:
            full = min(length, int(lengths[p])) // block_tokens * block_tokens
            a = flat[base : base + full]
            b = flat[int(tok_base[p]) : int(tok_base[p]) + full]
            diff = np.flatnonzero(a != b)
            common = int(diff[0]) if len(diff) else full
            reuse = common // block_tokens
            o, q = int(offsets[i]), int(offsets[p])
            digests[o : o + reuse] = digests[q : q + reuse]
        parent = digests[int(offsets[i]) + reuse - 1] if reuse else root
        for j in range(reuse, int(counts[i])):
            lo = base + j * block_tokens
            hi = min(lo + block_tokens, base + length)
            extra = block_extra_keys(j, salts[i], loras[i])
            parent = hash_block(parent, data[starts[lo] : starts[hi]], hi - lo, extra)
            digests[int(offsets[i]) + j] = parent
    return offsets, to_uint64(digests)
