"""Prompt content -> chained block hashes, without a per-block Python loop.

A synthetic prompt is a sequence of *segments*: a system prompt, a document, a user turn, a
tool output. Each segment has a 64-bit content id and a length in tokens; token ``k`` of a
segment is identified by ``(segment id, k)``, so two prompts hold the same tokens exactly where
they hold the same segments at the same offsets. A native block (``G`` tokens) is cut into
*pieces*, maximal runs of one segment inside the block, and its content id mixes every piece's
``(segment id, offset in segment, position in block, length)``. Consequences:

* Blocks with the same tokens get the same content id, wherever they occur.
* A partial last block differs from the full block of a longer prompt that extends it (its
  pieces are shorter), so a prompt's tail is never mistaken for a block it is a prefix of.

The content ids are then chained per request with :func:`optimizer.trace.hashing.chain_hashes`,
so a block is reusable only after an identical prefix. A document that appears after a
different prefix gets different hashes: prefix caching (vLLM, SGLang, LMCache, Mooncake) cannot
reuse it either, which is the behaviour a realistic trace should have.
"""

from __future__ import annotations

import numpy as np

from optimizer.trace.hashing import chain_hashes

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_M1 = np.uint64(0xBF58476D1CE4E5B9)
_M2 = np.uint64(0x94D049BB133111EB)


def mix64(x: np.ndarray) -> np.ndarray:
    """SplitMix64's finaliser on a uint64 array (wrapping arithmetic), vectorised."""
    z = np.asarray(x, dtype=np.uint64) + _GOLDEN
    z = (z ^ (z >> np.uint64(30))) * _M1
    z = (z ^ (z >> np.uint64(27))) * _M2
    return z ^ (z >> np.uint64(31))


def random_ids(rng: np.random.Generator, n: int) -> np.ndarray:
    """``n`` fresh 64-bit segment content ids."""
    return rng.integers(0, np.iinfo(np.uint64).max, size=n, dtype=np.uint64, endpoint=True)


def block_content_ids(
    seg_offsets: np.ndarray, seg_ids: np.ndarray, seg_lens: np.ndarray, block_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Content ids of every native block of every prompt.

    Prompt ``r`` is the segments ``seg_offsets[r]:seg_offsets[r+1]`` of ``seg_ids`` /
    ``seg_lens`` (lengths > 0). Returns ``(input_tokens, block_offsets, content_ids)``: each
    prompt's length, CSR offsets of its ``ceil(length / block_tokens)`` blocks, and the blocks'
    content ids (uint64).
    """
    seg_offsets = np.asarray(seg_offsets, dtype=np.int64)
    seg_lens = np.asarray(seg_lens, dtype=np.int64)
    seg_ids = np.asarray(seg_ids, dtype=np.uint64)
    n = len(seg_offsets) - 1
    g = int(block_tokens)
    # Global token coordinates: prompts laid end to end.
    seg_end = np.cumsum(seg_lens)
    seg_start = seg_end - seg_lens
    req_start = np.concatenate(([0], seg_end))[seg_offsets]  # (n + 1,)
    input_tokens = np.diff(req_start)
    n_blocks = (input_tokens + g - 1) // g
    block_offsets = np.concatenate(([0], np.cumsum(n_blocks)))
    block_req = np.repeat(np.arange(n, dtype=np.int64), n_blocks)
    block_start = req_start[:-1][block_req] + g * (
        np.arange(block_offsets[-1], dtype=np.int64) - block_offsets[:-1][block_req]
    )
    # Pieces start at every segment start and every block start (the union, sorted).
    # Both inputs are sorted, so a stable (merge) sort plus a neighbour test beats np.union1d.
    cuts = np.sort(np.concatenate((seg_start, block_start)), kind="stable")
    cuts = cuts[np.concatenate(([True], cuts[1:] != cuts[:-1]))]
    piece_end = np.empty_like(cuts)
    piece_end[:-1] = cuts[1:]
    piece_end[-1] = req_start[-1]
    seg = np.searchsorted(seg_start, cuts, side="right") - 1
    blk = np.searchsorted(block_start, cuts, side="right") - 1
    length = (piece_end - cuts).astype(np.uint64)
    in_seg = (cuts - seg_start[seg]).astype(np.uint64)
    in_blk = (cuts - block_start[blk]).astype(np.uint64)
    piece = mix64(seg_ids[seg] ^ mix64(in_seg ^ mix64((in_blk << np.uint64(32)) | length)))
    # Pieces of one block are contiguous; XOR them (positions are part of each piece's hash).
    first_piece = np.searchsorted(cuts, block_start)
    content = np.bitwise_xor.reduceat(piece, first_piece) if len(piece) else piece
    return input_tokens, block_offsets, content


def prompt_hashes(
    seg_offsets: np.ndarray, seg_ids: np.ndarray, seg_lens: np.ndarray, block_tokens: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(input_tokens, hash_offsets, chained hashes)`` of the prompts described by segments."""
    input_tokens, offsets, content = block_content_ids(seg_offsets, seg_ids, seg_lens, block_tokens)
    return input_tokens, offsets, chain_hashes(offsets, content)
