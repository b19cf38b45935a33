"""Prompt content -> chained block hashes, in one pass over segments and blocks.

A synthetic prompt is a sequence of *segments*: a system prompt, a document, a user turn, a
tool output. Each segment has a 64-bit content id and a length in tokens; token ``k`` of a
segment is identified by ``(segment id, k)``, so two prompts hold the same tokens exactly where
they hold the same segments at the same offsets. A native block (``G`` tokens) is cut into
*pieces*, maximal runs of one segment inside the block, and its content id is the XOR of the
pieces' hashes of ``(segment id, offset in segment, position in block, length)``. Consequences:

* Blocks with the same tokens get the same content id, wherever they occur.
* A partial last block differs from the full block of a longer prompt that extends it (its
  pieces are shorter), so a prompt's tail is never mistaken for a block it is a prefix of.

The content ids are then chained per request with :func:`kvtier.trace.hashing.chain_hashes`,
so a block is reusable only after an identical prefix. A document that appears after a
different prefix gets different hashes: prefix caching (vLLM, SGLang, LMCache, Mooncake) cannot
reuse it either, which is the behaviour a realistic trace should have.
"""

from __future__ import annotations

import numpy as np
from numba import njit

import kvtier.jitcache  # noqa: F401  (drops kernels compiled against older sources)
from kvtier.trace.hashing import chain_hashes, mix64_nb


def random_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` fresh 64-bit segment content ids."""
    return rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)


@njit(cache=True, nogil=True)
def _block_content_ids_nb(
    seg_offsets: np.ndarray,
    seg_ids: np.ndarray,
    seg_lens: np.ndarray,
    g: int,
    block_offsets: np.ndarray,
    out: np.ndarray,
) -> None:
    shift = np.uint64(32)
    for r in range(seg_offsets.shape[0] - 1):
        b = block_offsets[r]
        filled = 0  # tokens already in block b
        acc = np.uint64(0)
        for s in range(seg_offsets[r], seg_offsets[r + 1]):
            length = seg_lens[s]
            off = 0
            while off < length:
                take = min(length - off, g - filled)
                key = (np.uint64(filled) << shift) | np.uint64(take)
                inner = mix64_nb(np.uint64(off) ^ mix64_nb(key))
                acc ^= mix64_nb(seg_ids[s] ^ inner)
                off += take
                filled += take
                if filled == g:
                    out[b] = acc
                    b += 1
                    filled = 0
                    acc = np.uint64(0)
        if filled > 0:
            out[b] = acc


def block_content_ids(
    seg_offsets: np.ndarray, seg_ids: np.ndarray, seg_lens: np.ndarray, block_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Content ids of every native block of every prompt.

    Prompt ``r`` is the segments ``seg_offsets[r]:seg_offsets[r+1]`` of ``seg_ids`` /
    ``seg_lens``. Returns ``(input_tokens, block_offsets, content_ids)``: each prompt's length,
    CSR offsets of its ``ceil(length / block_tokens)`` blocks, and the blocks' content ids.
    The layout is checked here because the kernel does no bounds checks.
    """
    seg_offsets = np.ascontiguousarray(seg_offsets, dtype=np.int64)
    seg_ids = np.ascontiguousarray(seg_ids, dtype=np.uint64)
    seg_lens = np.ascontiguousarray(seg_lens, dtype=np.int64)
    g = int(block_tokens)
    if g < 1 or g >= 1 << 31:
        raise ValueError(f"block_tokens must be in [1, 2^31), got {block_tokens}")
    if seg_ids.shape != seg_lens.shape or seg_offsets.ndim != 1 or len(seg_offsets) < 1:
        raise ValueError("seg_ids and seg_lens must have one entry per segment")
    if seg_offsets[0] != 0 or seg_offsets[-1] != len(seg_ids) or np.any(np.diff(seg_offsets) < 1):
        raise ValueError("seg_offsets must start at 0, end at the segment count and increase")
    if np.any(seg_lens < 1) or np.any(seg_lens >= 1 << 31):
        raise ValueError("segment lengths must be in [1, 2^31)")
    lens_csum = np.concatenate(([0], np.cumsum(seg_lens)))
    input_tokens = np.diff(lens_csum[seg_offsets])
    block_offsets = np.concatenate(([0], np.cumsum(-(-input_tokens // g)))).astype(np.int64)
    out = np.empty(block_offsets[-1], dtype=np.uint64)
    _block_content_ids_nb(seg_offsets, seg_ids, seg_lens, g, block_offsets, out)
    return input_tokens, block_offsets, out


def prompt_hashes(
    seg_offsets: np.ndarray, seg_ids: np.ndarray, seg_lens: np.ndarray, block_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(input_tokens, hash_offsets, chained hashes)`` of the prompts described by segments."""
    input_tokens, offsets, content = block_content_ids(seg_offsets, seg_ids, seg_lens, block_tokens)
    return input_tokens, offsets, chain_hashes(offsets, content)
