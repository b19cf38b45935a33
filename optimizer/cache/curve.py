"""Miss-ratio curves: hit ratios of one policy over cache capacities (the public side).

Numba-free, so that ``kvtier trace mrc`` on a small trace starts in a fraction of a second:
the exact one-pass LRU curve runs on NumPy alone (:mod:`kvtier.cache.stack_np`) up to
:data:`NUMPY_STACK_MAX` block references and on the jitted pass of :mod:`kvtier.cache.mrc`
above that (both give the same histogram, exactly); replays of other policies use the cache
kernels (:mod:`kvtier.cache.trace_replay`). Only the path taken is imported.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from kvtier.cache import enums
from kvtier.cache.policies import PolicySpec, parse_policy
from kvtier.cache.warmup import warmup_start
from kvtier.errors import InputError
from kvtier.trace.blocked import BlockedTrace

# Up to this many block references the LRU curve is computed with NumPy (0.1 s of CPU for
# 230,000 references, 0.2 s for 435,000); above it with the jitted pass, whose fixed cost
# (importing numba, loading its cached machine code: about 0.7 s) is then the smaller one.
NUMPY_STACK_MAX = 1 << 20


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


def stack_hits(
    trace: BlockedTrace, capacities: list[int], *, flat: bool = False, warmup: float = 0.0
) -> np.ndarray:
    """Exact LRU hit blocks (measured requests) at each capacity, in one pass: NumPy for a
    small trace, else :func:`kvtier.cache.mrc.lru_stack_hits`."""
    if trace.n_block_refs <= NUMPY_STACK_MAX:
        from kvtier.cache.stack_np import lru_stack_hist_np

        caps = _check_capacities(capacities)
        start = warmup_start(trace.n_requests, warmup)
        semantics = enums.FLAT if flat else enums.PREFIX
        hist = lru_stack_hist_np(
            trace.block_offsets, trace.block_ids, trace.n_blocks, semantics, start
        )
        if hist is not None:
            cum = np.cumsum(hist)
            return np.array([cum[min(c, trace.n_blocks)] for c in caps], dtype=np.int64)
    from kvtier.cache.mrc import lru_stack_hits

    return lru_stack_hits(trace, capacities, flat=flat, warmup=warmup)


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
        hits = stack_hits(trace, caps, flat=flat, warmup=warmup)
    else:
        from kvtier.cache.trace_replay import replay  # every cache kernel: only for replays

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
