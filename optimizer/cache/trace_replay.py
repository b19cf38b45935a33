"""Replay a :class:`BlockedTrace` through one tier and account hits per request.

Accounting (docs/design.md 4.3): *block-weighted* hit ratio = hit blocks / full blocks of the
measured requests; *token-weighted* = hit blocks x B / prompt tokens of the measured requests
(the partial last block of a prompt is never cacheable, so it always counts as a miss). The first
``floor(warmup * n_requests)`` requests run through the cache but are not measured.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from kvtier.cache import enums, kernels, ring
from kvtier.cache.policies import PolicySpec, parse_policy
from kvtier.cache.state import TierState, check_tier_args
from kvtier.cache.warmup import warmup_start
from kvtier.errors import InputError
from kvtier.trace.blocked import BlockedTrace


@dataclass(frozen=True, eq=False)
class ReplayResult:
    """Per-request hits of one replay plus the totals over the measured requests."""

    policy: str
    capacity_blocks: int
    flat: bool
    first_measured: int  # requests before this index are warm-up
    hit_blocks: np.ndarray  # int64 (n_requests,) hits of every request, warm-up included
    blocks: np.ndarray  # int64 (n_requests,) full blocks per request
    input_tokens: np.ndarray  # int64 (n_requests,)
    block_tokens: int

    @property
    def hits(self) -> int:
        """Hit blocks over the measured requests."""
        return int(self.hit_blocks[self.first_measured :].sum())

    @property
    def accesses(self) -> int:
        """Block lookups over the measured requests (hits + misses)."""
        return int(self.blocks[self.first_measured :].sum())

    @property
    def misses(self) -> int:
        return self.accesses - self.hits

    @property
    def hit_ratio_blocks(self) -> float:
        acc = self.accesses
        return self.hits / acc if acc else 0.0

    @property
    def hit_ratio_tokens(self) -> float:
        tokens = int(self.input_tokens[self.first_measured :].sum())
        return self.hits * self.block_tokens / tokens if tokens else 0.0


def replay(
    trace: BlockedTrace,
    policy: str | PolicySpec,
    capacity: int,
    *,
    flat: bool = False,
    warmup: float = 0.0,
    cost: np.ndarray | None = None,
    tier: TierState | None = None,
) -> ReplayResult:
    """Replay ``trace`` through a tier of ``capacity`` blocks, or through ``tier`` as it stands.

    A given ``tier`` keeps its contents (a warm cache) and its own capacity; ``capacity`` is then
    ignored and ``policy`` must name the tier's policy.

    Prefix semantics by default; ``flat=True`` treats every block access alone (libCacheSim
    parity). ``cost`` is GDSF's per-block recompute cost (default 1).

    A flat LRU or FIFO replay from an empty tier runs the ring kernels of
    :mod:`kvtier.cache.ring`, which give the same hits faster and build no tier.
    """
    spec = parse_policy(policy)
    start = warmup_start(trace.n_requests, warmup)
    hits = np.zeros(trace.n_requests, dtype=np.int64)
    if tier is None and flat and spec.code in ring.POLICIES:
        capacity, _, _ = check_tier_args(capacity, trace.n_blocks, cost)
        ring.replay_flat(
            spec.code, capacity, trace.n_blocks, trace.block_offsets, trace.block_ids, hits
        )
        return _result(spec.name, capacity, flat, start, hits, trace)
    if tier is None:
        tier = TierState.create(spec, capacity, trace.n_blocks, cost=cost)
    elif tier.n_blocks < trace.n_blocks:
        raise InputError(f"tier covers {tier.n_blocks} block ids, the trace uses {trace.n_blocks}")
    elif tier.policy != spec:
        raise InputError(f"policy {spec.name} does not match the tier's {tier.policy.name}")
    semantics = enums.FLAT if flat else enums.PREFIX
    kernels.replay_nb(tier.arrays(), trace.block_offsets, trace.block_ids, semantics, hits)
    return _result(tier.policy.name, tier.capacity, flat, start, hits, trace)


def _result(
    policy: str, capacity: int, flat: bool, start: int, hits: np.ndarray, trace: BlockedTrace
) -> ReplayResult:
    return ReplayResult(
        policy=policy,
        capacity_blocks=capacity,
        flat=flat,
        first_measured=start,
        hit_blocks=hits,
        blocks=trace.blocks_per_request.astype(np.int64),
        input_tokens=trace.input_tokens,
        block_tokens=trace.block_tokens,
    )
