"""What a replay returns before metrics are computed.

Both simulators return a :class:`RawResult` (per-request times as arrays); the same function
then computes :class:`kvtier.sim.metrics.Metrics` from it, so the two can only differ in the
times themselves. :func:`tbt_tail_counts` sizes the per-request time-between-tokens tails
(:data:`TBT_TAIL_SHARE`) both simulators keep. When a run has *provably* missed its SLO is
:mod:`kvtier.sim.slo`'s to judge (``SloCheck``).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from fractions import Fraction

import numpy as np

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
    # blocks loaded from each tier into HBM
    tier_hit_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
    # blocks storage prefetches read from each tier into the tiers above (SGLang's prefetch at
    # arrival; they count as hits of the tier a request then loads them from)
    tier_prefetched_blocks: np.ndarray = field(default_factory=lambda: np.zeros(0, dtype=np.int64))
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
    # faults (kvtier.sim.faults): per fault, the ids of the blocks its pools held when they
    # failed (None: no fault)
    fault_lost_ids: tuple[np.ndarray, ...] | None = None


def end_time(finish_s: np.ndarray, early_stopped: bool, now: float) -> float:
    """When a run ended: the stop instant of an early stop, else the last finish (0 if none)."""
    if early_stopped:
        return float(now)
    done = finish_s[~np.isnan(finish_s)]
    return float(done.max()) if len(done) else 0.0
