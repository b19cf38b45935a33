"""What a replay returns before metrics are computed, and the early SLO-miss test.

Both simulators return a :class:`RawResult` (per-request times as arrays); the same function
then computes :class:`kvtier.sim.metrics.Metrics` from it, so the two can only differ in the
times themselves. :class:`SloCheck` decides when a run has *provably* missed its SLO, with
integer limits computed here once for both simulators. :func:`tbt_tail_counts` sizes the
per-request time-between-tokens tails (:data:`TBT_TAIL_SHARE`) both simulators keep.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

from kvtier.policy.model import SLO

# The share of a request's token intervals whose mean is its TBT: Mooncake (FAST'25, section
# 5.1 "Metric") judges each request by "the average of the longest 10% of the token arrival
# intervals" (docs/sources.md, [Mooncake-FAST25]).
TBT_TAIL_SHARE = 0.1


def tbt_tail_counts(output_tokens: np.ndarray) -> np.ndarray:
    """Per request, how many of its longest token intervals its TBT averages (int64):
    ``ceil(TBT_TAIL_SHARE * (L - 1))``, 0 for ``L < 2``, computed in integers (``0.1 * 30`` is
    ``3.0000000000000004`` in floats, whose ceiling would be 4)."""
    share = Fraction(str(TBT_TAIL_SHARE))
    gaps = np.maximum(np.asarray(output_tokens, dtype=np.int64) - 1, 0)
    return -(-(gaps * share.numerator) // share.denominator)


@dataclass(frozen=True)
class RawResult:
    first_token_s: np.ndarray  # float64 (n,), NaN if never reached
    finish_s: np.ndarray  # float64 (n,), NaN if never reached
    hit_blocks: np.ndarray  # int64 (n,), prefix blocks found in HBM at admission
    instance: np.ndarray  # int64 (n,), -1 for a rejected request
    busy_s: np.ndarray  # float64 (instances,), seconds spent in iterations
    n_iterations: int
    early_stopped: bool
    end_s: float  # simulated time at which the run ended
    # Lower tiers (empty without them): per tier in TierConfig order, per link, per request.
    tier_hit_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    tier_bytes_read: np.ndarray = field(default_factory=lambda: np.zeros(0))
    tier_bytes_written: np.ndarray = field(default_factory=lambda: np.zeros(0))
    link_busy_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    link_bytes: np.ndarray = field(default_factory=lambda: np.zeros(0))
    load_s: np.ndarray | None = None  # float64 (n,): admission to last loaded block arriving
    # int64 (n, tiers): blocks each request loaded from each lower tier (n x 0 without tiers)
    loaded_blocks: np.ndarray = field(default_factory=lambda: np.zeros((0, 0), dtype=np.int64))
    # Connector workers (load workers, then store workers) and each tier's stage seconds
    # (tiers x STAGES).
    worker_busy_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    stage_s: np.ndarray = field(default_factory=lambda: np.zeros((0, 4)))
    # iterations whose measured step time used values beyond the operator data (extrapolated)
    extrapolated_iterations: int = 0
    # float64 (n,): when each request was sent (the trace's arrival, or a closed loop's send)
    arrival_s: np.ndarray | None = None
    # int64 (n,): times each request was preempted (vllm_v1) and the computed KV tokens those
    # preemptions discarded, which it computed again (None: zeros)
    preemptions: np.ndarray | None = None
    preempted_tokens: np.ndarray | None = None
    # disaggregated (n_prefill > 0): the decode instance of each request (-1: none) and the
    # seconds from its prefill's end to its KV's arrival there (None: aggregated)
    decode_instance: np.ndarray | None = None
    kv_transfer_s: np.ndarray | None = None
    # float64 (n,): each request's mean of its longest TBT_TAIL_SHARE of token intervals (NaN
    # below two tokens, rejected or unfinished); None when the replay did not track it
    tbt_tail_s: np.ndarray | None = None
    # disaggregated: int64 (n,), the prompt's leading blocks its decode instance already held
    # in HBM when it admitted it (not moved; 0 when the connector moves every block)
    decode_hit_blocks: np.ndarray | None = None


def end_time(finish_s: np.ndarray, early_stopped: bool, now: float) -> float:
    """When a run ended: the stop instant of an early stop, else the last finish (0 if none)."""
    if early_stopped:
        return float(now)
    done = finish_s[~np.isnan(finish_s)]
    return float(done.max()) if len(done) else 0.0


@dataclass(frozen=True)
class SloCheck:
    """Thresholds of an SLO and the counts past which each is certainly missed.

    A request that is rejected (it can never fit in HBM) misses every SLO. For a percentile
    ``q`` over ``n`` requests, ``numpy.quantile(..., method="linear")`` is at least the sorted
    value at ``k = floor((n - 1) * q)``; once ``n - k`` values exceed the threshold, that value
    does too, whatever the remaining requests do. The mean TTFT is missed once the TTFTs seen
    so far, divided by ``n``, exceed its bound (TTFTs are never negative). The TBT percentile
    is over the requests with two tokens or more (``m <= n``); its limit counts all ``n``,
    which is at least the limit for ``m``, so a stop on it is still certain.
    """

    ttft_mean_s: float
    ttft_p99_s: float
    ttft_p999_s: float
    tpot_p99_s: float
    tbt_p99_s: float = math.inf

    @classmethod
    def from_slo(cls, slo: SLO) -> SloCheck:
        def f(x: float | None) -> float:
            return math.inf if x is None else float(x)

        return cls(
            f(slo.ttft_mean_s),
            f(slo.ttft_p99_s),
            f(slo.ttft_p999_s),
            f(slo.tpot_p99_s),
            f(slo.tbt_p99_s),
        )

    def thresholds(self) -> np.ndarray:
        return np.array(
            [self.ttft_mean_s, self.ttft_p99_s, self.ttft_p999_s, self.tpot_p99_s, self.tbt_p99_s],
            dtype=np.float64,
        )

    @staticmethod
    def over_limit(n: int, q: float) -> int:
        """How many values above a threshold make the ``q`` quantile of ``n`` values exceed it."""
        return n - math.floor((n - 1) * q) if n else 1

    def limits(self, n: int) -> np.ndarray:
        return np.array(
            [
                self.over_limit(n, 0.99),
                self.over_limit(n, 0.999),
                self.over_limit(n, 0.99),
                self.over_limit(n, 0.99),
            ],
            dtype=np.int64,
        )

    def tracker(self, n: int) -> SloTracker:
        return SloTracker(self, n)


class SloTracker:
    """Running counts for :class:`SloCheck`; the numba engine keeps the same counts."""

    def __init__(self, check: SloCheck, n: int) -> None:
        self.check = check
        self.n = n
        self.lim = [int(x) for x in check.limits(n)]
        self.sum_ttft = 0.0
        # ttft > p99 bound, ttft > p999 bound, tpot > p99 bound, tbt tail > p99 bound
        self.over = [0, 0, 0, 0]
        self.n_rejected = 0

    def first_token(self, ttft: float) -> None:
        self.sum_ttft += ttft
        if ttft > self.check.ttft_p99_s:
            self.over[0] += 1
        if ttft > self.check.ttft_p999_s:
            self.over[1] += 1

    def finished(self, gen_time: float, output_tokens: int) -> None:
        tpot = gen_time / max(1, output_tokens - 1)
        if tpot > self.check.tpot_p99_s:
            self.over[2] += 1

    def tbt(self, tail: float) -> None:
        """A finished request's TBT (NaN below two tokens: not counted)."""
        if tail > self.check.tbt_p99_s:
            self.over[3] += 1

    def rejected(self) -> None:
        self.n_rejected += 1

    def missed(self) -> bool:
        return (
            self.n_rejected > 0
            or self.sum_ttft / self.n > self.check.ttft_mean_s
            or self.over[0] >= self.lim[0]
            or self.over[1] >= self.lim[1]
            or self.over[2] >= self.lim[2]
            or self.over[3] >= self.lim[3]
        )
