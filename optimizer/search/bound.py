"""A lower bound on the SLO a trace allows on given hardware, computed before any search.

No policy can serve a request's first token faster than the prefill of the prompt tokens that
no earlier request shared, run alone on an idle instance of the fastest tensor-parallel size
the search may pick: an infinite prefix cache with free loads saves at most the tokens seen
before (the longest prefix of the request's blocks that occurred earlier in the trace), and
queueing, chunking, loads and decode steps only add time. The TTFT terms of the SLO are
compared with the same statistic (mean, P99, P99.9) of these per-request bounds; TPOT with the
time of one decode step of a lone request (reading the weights and its KV once), and so is
TBT: a request's mean of its longest intervals is at least its mean interval, its TPOT.

When an SLO term is below its bound, no trial can meet it, and the bound, rounded up, is the
tightest value of that term that is not ruled out.

On a sample with prompt-length strata the replay's latency statistics are post-stratified
(:mod:`kvtier.sim.metrics`): the bound then takes the same weighted mean and ``inverted_cdf``
quantiles of the per-request bounds (and the weighted median prompt for the decode step), since
a weighted quantile of per-request lower bounds bounds the weighted quantile of the TTFTs,
while the unweighted one may exceed it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from typing import Any

import numpy as np

from kvtier.errors import InputError
from kvtier.policy.model import SLO, Policy

TTFT_TERMS = {"ttft_mean_s": None, "ttft_p99_s": 99.0, "ttft_p999_s": 99.9}


@dataclass(frozen=True)
class SLOBound:
    """Per SLO term: the bound and whether the requested value is below it."""

    bounds: dict[str, float]  # term -> lowest value any policy can reach
    requested: dict[str, float]  # term -> the SLO's value
    tp: int  # the tensor-parallel size the bound assumes (the fastest allowed)
    cached_share: float  # share of prompt tokens an infinite cache could serve

    @property
    def unreachable(self) -> dict[str, float]:
        return {
            k: b for k, b in self.bounds.items() if k in self.requested and self.requested[k] < b
        }

    def suggestion(self) -> str:
        """An ``--slo`` text with each unreachable term raised to its bound (2 significant
        figures, rounded up), the others kept."""
        parts = []
        for k, v in self.requested.items():
            if k in self.unreachable:
                v = round_up(self.bounds[k])
            parts.append(f"{k[:-2]}={v:g}")
        return ",".join(parts)


def round_up(x: float, digits: int = 2) -> float:
    if x <= 0 or not math.isfinite(x):
        return x
    scale = 10 ** (digits - 1 - math.floor(math.log10(x)))
    return math.ceil(x * scale) / scale


def first_seen_prefix(blocked: Any) -> tuple[np.ndarray, np.ndarray]:
    """(prompt tokens, tokens of the longest prefix seen before) per request: what an infinite
    cache could serve. Requests are in arrival order (the trace format guarantees it); a block
    counts as seen when an earlier request read it."""
    offsets = np.asarray(blocked.block_offsets, dtype=np.int64)
    ids = np.asarray(blocked.block_ids, dtype=np.int64)
    inputs = np.asarray(blocked.input_tokens, dtype=np.int64)
    n = len(inputs)
    if n == 0:
        return inputs, np.zeros(0, dtype=np.int64)
    lengths = np.diff(offsets)
    request_of = np.repeat(np.arange(n, dtype=np.int64), lengths)
    first = np.full(int(blocked.n_blocks), n, dtype=np.int64)
    np.minimum.at(first, ids, request_of)
    seen = first[ids] < request_of
    # the first unseen position of each request (its length when all are seen)
    position = np.arange(len(ids), dtype=np.int64) - offsets[request_of]
    unseen = np.where(seen, np.iinfo(np.int64).max, position)
    lead = np.full(n, 0, dtype=np.int64)
    has = lengths > 0
    if has.any():
        lead[has] = np.minimum.reduceat(unseen, offsets[:-1][has])
    lead = np.minimum(lead, lengths)
    hit = np.minimum(lead * int(blocked.block_tokens), np.maximum(inputs - 1, 0))
    return inputs, hit


def slo_bound(
    scenario: Any, policy: Policy, slo: SLO, tp_choices: tuple[int, ...] | None
) -> SLOBound | None:
    """The bound for ``scenario``'s trace on its hardware (None when nothing can be said:
    no TTFT or TPOT term, or the policy cannot be deployed at any allowed tp)."""
    from kvtier.sim.config import build_config
    from kvtier.sim.timing import prefill_seconds, step_time

    blocked = scenario.blocked(policy)
    inputs, hit = first_seen_prefix(blocked)
    requested = {
        k: getattr(slo, k)
        for k in (*TTFT_TERMS, "tpot_p99_s", "tbt_p99_s")
        if getattr(slo, k, None) is not None
    }
    if not requested or len(inputs) == 0:
        return None
    hw, model = scenario.hardware, scenario.model
    from kvtier.sim.metrics import request_weights

    weights = request_weights(blocked)
    best: tuple[float, int, np.ndarray, float] | None = None
    for tp in tp_choices or (hw.topology.tp,):
        trial = replace(policy, serving=replace(policy.serving, tp=tp, instances=None))
        try:
            cfg = build_config(hw, model, trial)
        except InputError:
            continue
        packed = cfg.timing_params()
        per_request = np.array(
            [prefill_seconds(int(q - h), int(h), packed) for q, h in zip(inputs, hit, strict=True)]
        )
        ctx = int(_statistic(inputs, 50.0, weights))
        tpot = float(step_time(1, 2 * ctx - 1, ctx, 1, ctx, 0, packed))
        p99 = _statistic(per_request, 99.0, weights)
        if best is None or p99 < best[0]:
            best = (p99, tp, per_request, tpot)
    if best is None:
        return None
    _, tp, per_request, tpot = best
    bounds: dict[str, float] = {}
    for term, pct in TTFT_TERMS.items():
        if term in requested:
            bounds[term] = _statistic(per_request, pct, weights)
    for term in ("tpot_p99_s", "tbt_p99_s"):
        if term in requested:
            bounds[term] = tpot
    share = float(hit.sum() / max(int(inputs.sum()), 1))
    return SLOBound(bounds, requested, tp, share)


def _statistic(x: np.ndarray, pct: float | None, weights: np.ndarray | None) -> float:
    """The mean (``pct`` None) or percentile ``pct`` of ``x`` as the replay's metrics compute
    it: linear percentiles unweighted, or, with post-stratification ``weights``, the weighted
    mean and ``inverted_cdf`` quantile (a bound must be the statistic it is compared with)."""
    if weights is None:
        return float(np.mean(x) if pct is None else np.percentile(x, pct))
    if pct is None:
        return float(np.average(x, weights=weights))
    return float(np.quantile(x, pct / 100.0, weights=weights, method="inverted_cdf"))
