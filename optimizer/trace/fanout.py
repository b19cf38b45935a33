"""The routing fan-out of the full cluster, restored in the replay of a spatial sample.

A sample of ``F`` of the roots (sessions or prefix subtrees, :mod:`kvtier.trace.sampling`)
replays on ``F * N`` instances, which keeps each instance's load and cache turnover. A router
that spreads load without looking at content (``round_robin``, ``least_loaded``) sends a
root's next request to the instance holding its previous one with probability about
``1 / N`` in the full cluster but ``1 / (F * N)`` in the sample, and reuse *within* a root is
never thinned by the sampler (a kept root keeps all its requests). Left so, the sample finds
a conversation's previous turn in HBM ``1 / F`` times as often as the full cluster does.

Each request of the sample therefore draws one of a few *colours*, so that two requests
share a colour with probability ``F``, and the blocks private to one root are renamed per
colour: two requests of a root share those blocks only if they share a colour *and* land on
one instance, with probability ``F / (F * N) = 1 / N``, as in the full cluster. Blocks read
by two or more roots keep their ids: the sampler already thins reuse across roots by ``F``
(a partner root is kept with probability ``F``), which the smaller cluster's ``1 / F`` times
higher same-instance chance cancels, as SHARDS's rate scaling does for a sampled cache.

Whether a request lands on its predecessor's instance is independent of its blocks only for
routers blind to content, so a content-affine router (``prefix_affinity``, ``kv_aware``),
which sends a turn to where its prefix is whatever ``N``, replays the sample unchanged.
"""

from __future__ import annotations

import math
from dataclasses import replace

import numpy as np

from kvtier.files import check_allocation
from kvtier.trace.blocked import BlockedTrace
from kvtier.trace.format import META_SAMPLE_FRACTION

_COLOUR_SALT = np.uint64(0xC2B2AE3D27D4EB4F)


def colour_weights(fraction: float) -> np.ndarray:
    """Probabilities of ``ceil(1 / fraction)`` colours whose squares sum to ``fraction``.

    ``1 / fraction`` whole: that many equal colours. Otherwise all but the last colour weigh
    ``a`` and the last ``1 - k a`` (``k`` = colours - 1), with ``k a^2 + (1 - k a)^2 =
    fraction``: the larger root, ``a = (k + sqrt(k (C F - 1))) / (k (k + 1))``, which keeps
    the last weight in ``[0, a]``.
    """
    if not 0 < fraction <= 1:
        raise ValueError(f"fraction must be in (0, 1], got {fraction}")
    # two float64 arrays of one weight per colour (the weights and their running sum)
    check_allocation(
        16 / fraction,
        f"schema metadata '{META_SAMPLE_FRACTION}' = {fraction:g}: the routing fan-out of "
        f"the sample ({1 / fraction:.3g} colours)",
    )
    colours = math.ceil(1 / fraction - 1e-9)
    if colours == 1:
        return np.ones(1)
    k = colours - 1
    a = (k + math.sqrt(max(0.0, k * (colours * fraction - 1)))) / (k * (k + 1))
    weights = np.full(colours, a)
    weights[-1] = max(0.0, 1 - k * a)
    return weights


def request_colours(n: int, fraction: float, seed: int = 0) -> np.ndarray:
    """Per request ``0..n-1``, its colour (int64), drawn by a seeded hash of its index."""
    from kvtier.trace.sampling import _mix64

    bounds = np.cumsum(colour_weights(fraction))[:-1]
    index = np.arange(n, dtype=np.uint64) ^ (_COLOUR_SALT + np.uint64(seed))
    u = (_mix64(index) >> np.uint64(11)).astype(np.float64) / float(1 << 53)
    return np.searchsorted(bounds, u, side="right").astype(np.int64)


def fanned_out(
    blocked: BlockedTrace, roots: np.ndarray, fraction: float, seed: int = 0
) -> BlockedTrace:
    """``blocked`` with each root-private block renamed by its request's colour.

    ``roots`` is each request's root key (any integer type, one per request). Ids are
    numbered again by first appearance, as :func:`kvtier.trace.blocks.block_trace` numbers
    them. ``fraction`` 1 returns ``blocked`` itself.
    """
    n = blocked.n_requests
    if len(roots) != n:
        raise ValueError(f"roots has {len(roots)} entries for {n} requests")
    weights = colour_weights(fraction)
    if len(weights) == 1 or len(blocked.block_ids) == 0:
        return blocked
    counts = np.diff(blocked.block_offsets)
    _, root_index = np.unique(roots, return_inverse=True)
    ref_root = np.repeat(root_index.ravel().astype(np.int64), counts)
    ids = blocked.block_ids.astype(np.int64)
    # a block is private when every reference to it comes from one root (its lowest and
    # highest root agree; no sort of the references needed)
    lowest = np.full(blocked.n_blocks, np.iinfo(np.int64).max, dtype=np.int64)
    highest = np.full(blocked.n_blocks, -1, dtype=np.int64)
    np.minimum.at(lowest, ids, ref_root)
    np.maximum.at(highest, ids, ref_root)
    private = (lowest == highest)[ids]
    colour = np.repeat(request_colours(n, fraction, seed), counts)
    keys = ids * len(weights) + np.where(private, colour, 0)
    uniq, first, inverse = np.unique(keys, return_index=True, return_inverse=True)
    rank = np.empty(len(uniq), dtype=np.int64)
    rank[np.argsort(first, kind="stable")] = np.arange(len(uniq))
    if len(uniq) >= np.iinfo(np.int32).max:
        raise ValueError("too many distinct coloured blocks for int32 ids")
    new_ids = np.ascontiguousarray(rank[inverse.ravel()].astype(np.int32))
    return replace(blocked, block_ids=new_ids, n_blocks=len(uniq))
