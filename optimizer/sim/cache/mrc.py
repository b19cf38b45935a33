"""Miss-ratio curves: exact one-pass LRU from stack distances, replay sweeps for the rest.

LRU with demand insertion is a stack algorithm: at capacity ``C`` the resident blocks are the
top ``C`` of one recency stack, so a block is resident iff its stack distance (distinct blocks
touched since its last touch, itself included) is ``<= C``. One pass computes every access's
distance with a Fenwick tree over touch times (O(N log N)), then a histogram gives the hits at
every capacity at once.

- Flat semantics: access ``j`` hits at capacity ``C`` iff ``d_j <= C``.
- Prefix semantics: all distances of a request are taken before its touches; block ``j`` is a
  prefix hit iff ``max(d_0..d_j) <= C`` (the prefix is contiguous), so the histogram counts the
  running maximum. Touches then go tail-first, exactly as the replay does.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from numba import njit

from optimizer.errors import InputError
from optimizer.sim.cache import enums
from optimizer.sim.cache.policies import PolicySpec, parse_policy
from optimizer.sim.cache.replay import replay, warmup_start
from optimizer.trace.blocked import BlockedTrace


@njit(cache=True, nogil=True, _nrt=False)
def _depth_nb(tree, last, marked, b, inf):  # noqa: ANN001, ANN201
    t = last[b]
    if t == 0:
        return inf
    # marked touches at times >= t = marked - (marked touches at times < t)
    s = 0
    i = t - 1
    while i > 0:
        s += tree[i]
        i -= i & (-i)
    return marked - s


@njit(cache=True, nogil=True, _nrt=False)
def _fen_add_nb(tree, i, v):  # noqa: ANN001, ANN201
    n = len(tree)
    while i < n:
        tree[i] += v
        i += i & (-i)


@njit(cache=True, nogil=True, _nrt=False)
def lru_stack_hist_nb(offsets, ids, n_blocks, semantics, first_measured, tree, last, hist):  # noqa: ANN001, ANN201, E501
    """Histogram of hit distances: ``hist[d]`` = measured block lookups that hit iff C >= d.

    ``hist`` has ``n_blocks + 2`` slots; slot ``n_blocks + 1`` collects cold misses. ``tree``
    (int64, ``len(ids) + 1``) and ``last`` (int64, ``n_blocks``) are zeroed scratch arrays.
    """
    inf = n_blocks + 1
    marked = 0
    t = 0
    n = len(offsets) - 1
    for r in range(n):
        lo = offsets[r]
        hi = offsets[r + 1]
        if semantics == enums.PREFIX:
            m = 0
            for j in range(lo, hi):
                d = _depth_nb(tree, last, marked, ids[j], inf)
                if d > m:
                    m = d
                if r >= first_measured:
                    hist[m] += 1
            for j in range(hi - 1, lo - 1, -1):
                b = ids[j]
                t += 1
                if last[b] != 0:
                    _fen_add_nb(tree, last[b], -1)
                else:
                    marked += 1
                _fen_add_nb(tree, t, 1)
                last[b] = t
        else:
            for j in range(lo, hi):
                b = ids[j]
                d = _depth_nb(tree, last, marked, b, inf)
                if r >= first_measured:
                    hist[d] += 1
                t += 1
                if last[b] != 0:
                    _fen_add_nb(tree, last[b], -1)
                else:
                    marked += 1
                _fen_add_nb(tree, t, 1)
                last[b] = t


@dataclass(frozen=True)
class MrcPoint:
    capacity_blocks: int
    hits: int
    hit_ratio_blocks: float
    hit_ratio_tokens: float


@dataclass(frozen=True)
class MrcResult:
    """A hit-ratio curve of one policy over capacities (blocks)."""

    policy: str
    flat: bool
    method: str  # "stack" or "replay"
    block_tokens: int
    warmup: float
    accesses: int  # measured block lookups
    points: list[MrcPoint] = field(default_factory=list)

    def to_json(self) -> dict[str, object]:
        return {
            "policy": self.policy,
            "semantics": "flat" if self.flat else "prefix",
            "method": self.method,
            "block_tokens": self.block_tokens,
            "warmup": self.warmup,
            "points": [
                {
                    "capacity_blocks": p.capacity_blocks,
                    "hit_ratio_blocks": p.hit_ratio_blocks,
                    "hit_ratio_tokens": p.hit_ratio_tokens,
                }
                for p in self.points
            ],
        }


def working_set_blocks(trace: BlockedTrace) -> int:
    """Distinct block ids the trace references."""
    if trace.n_block_refs == 0:
        return 0
    return int(np.count_nonzero(np.bincount(trace.block_ids, minlength=trace.n_blocks)))


def default_capacities(working_set: int, n: int = 20) -> list[int]:
    """Up to ``n`` log-spaced capacities from 1 block to the working set, distinct, ascending."""
    if working_set <= 1:
        return [1]
    caps = np.unique(np.rint(np.geomspace(1, working_set, n)).astype(np.int64))
    return [int(c) for c in caps]


def _check_capacities(capacities: list[int]) -> list[int]:
    out: list[int] = []
    for c in capacities:
        if isinstance(c, bool) or int(c) != c or c < 0:
            raise InputError(f"capacities must be integers >= 0 blocks, but got {c!r}")
        out.append(int(c))
    if not out:
        raise InputError("at least one capacity is needed")
    return out


def lru_stack_hits(
    trace: BlockedTrace, capacities: list[int], *, flat: bool = False, warmup: float = 0.0
) -> np.ndarray:
    """Exact LRU hit blocks (measured requests) at each capacity, in one pass."""
    caps = _check_capacities(capacities)
    start = warmup_start(trace.n_requests, warmup)
    hist = np.zeros(trace.n_blocks + 2, dtype=np.int64)
    semantics = enums.FLAT if flat else enums.PREFIX
    tree = np.zeros(trace.n_block_refs + 1, dtype=np.int64)
    last = np.zeros(trace.n_blocks, dtype=np.int64)
    lru_stack_hist_nb(
        trace.block_offsets, trace.block_ids, trace.n_blocks, semantics, start, tree, last, hist
    )
    cum = np.cumsum(hist)
    return np.array([cum[min(c, trace.n_blocks)] for c in caps], dtype=np.int64)


def miss_ratio_curve(
    trace: BlockedTrace,
    policy: str | PolicySpec = "lru",
    capacities: list[int] | None = None,
    *,
    flat: bool = False,
    warmup: float = 0.0,
    method: str | None = None,
    cost: np.ndarray | None = None,
) -> MrcResult:
    """Hit ratios of ``policy`` at each capacity (default: log-spaced up to the working set).

    ``method="stack"`` (LRU only, the default for LRU) is the exact one-pass curve;
    ``"replay"`` replays the trace once per capacity.
    """
    spec = parse_policy(policy)
    if method is None:
        method = "stack" if spec.code == enums.LRU else "replay"
    if method not in ("stack", "replay"):
        raise InputError(f"method must be 'stack' or 'replay', but got {method!r}")
    if method == "stack" and spec.code != enums.LRU:
        raise InputError(f"method 'stack' is exact for lru only, not {spec.name}; use 'replay'")
    caps = _check_capacities(
        capacities if capacities is not None else default_capacities(working_set_blocks(trace))
    )
    start = warmup_start(trace.n_requests, warmup)
    accesses = int(trace.blocks_per_request[start:].sum())
    tokens = int(trace.input_tokens[start:].sum())
    if method == "stack":
        hits = lru_stack_hits(trace, caps, flat=flat, warmup=warmup)
    else:
        hits = np.array(
            [replay(trace, spec, c, flat=flat, warmup=warmup, cost=cost).hits for c in caps],
            dtype=np.int64,
        )
    points = [
        MrcPoint(
            capacity_blocks=c,
            hits=int(h),
            hit_ratio_blocks=int(h) / accesses if accesses else 0.0,
            hit_ratio_tokens=int(h) * trace.block_tokens / tokens if tokens else 0.0,
        )
        for c, h in zip(caps, hits, strict=True)
    ]
    return MrcResult(
        policy=spec.name,
        flat=flat,
        method=method,
        block_tokens=trace.block_tokens,
        warmup=warmup,
        accesses=accesses,
        points=points,
    )
