"""``Metrics``: what one replay achieved, computed from a :class:`RawResult`, to and from JSON.

Definitions (docs/design.md 4.2, 4.6): TTFT = first token - arrival; TPOT = (finish - first token) /
max(1, output_tokens - 1), over every served request; E2E = finish - arrival. Percentiles are
``numpy.quantile(x, q, method="linear")`` over served requests. Throughput counts served
requests and their input + output tokens over the span from the first arrival to the last
finish. ``cost_per_mtok = cost_per_hour / (tokens per hour / 1e6)``. TBT (when the replay
tracked it, ``RawResult.tbt_tail_s``; None otherwise): per request, the mean of its longest
10% token intervals (Mooncake FAST'25 section 5.1, docs/model.md); ``tbt_p50_s`` and
``tbt_p99_s`` are its quantiles over the served requests with two tokens or more.

A replay of a spatial sample that records prompt-length strata (``kvtier.sample_strata``,
:mod:`kvtier.trace.strata`) has its per-request latency statistics post-stratified: each
request weighs its stratum's full-trace count over this replay's count of requests in that
stratum, means are weighted, and quantiles are ``numpy.quantile(x, q, weights=w,
method="inverted_cdf")`` (the one method numpy weights) over the requests each statistic
uses; so are the shares of requests (SLO attainment, :func:`effective_share`), through
:func:`request_share`. ``Metrics.extra["latency_weighting"]`` then says so. Without strata
nothing changes.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field, fields
from typing import Any

import numpy as np

from kvtier.policy.model import SLO
from kvtier.sim.result import RawResult
from kvtier.sim.slo import meets_tbt, requests_meeting
from kvtier.sim.slo import met as slo_met
from kvtier.sim.tiers import TierConfig
from kvtier.trace.blocked import BlockedTrace


@dataclass(frozen=True)
class Metrics:
    """Latency, throughput, cache and cost figures of one replay."""

    n_requests: int
    n_served: int  # requests that finished
    n_rejected: int  # requests larger than an instance's HBM pool
    ttft_mean_s: float
    ttft_p50_s: float
    ttft_p90_s: float
    ttft_p99_s: float
    ttft_p999_s: float
    tpot_mean_s: float
    tpot_p99_s: float
    e2e_mean_s: float
    throughput_rps: float
    throughput_tps: float
    hit_ratio_tokens: dict[str, float]  # per tier: prompt tokens served from it / prompt tokens
    prefill_tokens_saved: int
    gpu_busy_fraction: float
    cost_per_hour: float
    cost_per_mtok: float
    duration_s: float
    n_iterations: int
    instances: int
    early_stopped: bool = False  # the run stopped once the SLO was certainly missed
    slo_met: bool | None = None  # None without an SLO
    slo_attainment: float | None = None  # share of requests meeting every per-request bound
    engine: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    # Tiers below HBM (empty without them), keyed by tier name or link name.
    tier_hit_blocks: dict[str, int] = field(default_factory=dict)  # blocks loaded from each
    tier_hit_tokens: dict[str, int] = field(default_factory=dict)
    tier_bytes_read: dict[str, float] = field(default_factory=dict)  # loads, prefetches, cascades
    tier_bytes_written: dict[str, float] = field(default_factory=dict)  # copies in
    link_utilisation: dict[str, float] = field(default_factory=dict)  # busy seconds / duration
    load_share_of_ttft: float = 0.0  # summed load time / summed TTFT of served requests
    # The step-time backend (kvtier.sim.steptime): measured or roofline, where its numbers come
    # from (package and data versions), and the share of iterations it extrapolated.
    step_time: str = ""
    step_time_source: str = ""
    extrapolated_share: float = 0.0
    # where the instances' HBM for KV came from (kvtier.deploy.kv_budget)
    hbm_kv_source: str = ""
    # GPUs the instances use (pools of two tensor-parallel sizes count each pool's; 0: unknown)
    gpus: int = 0
    # scheduler = "vllm_v1": requests preempted (a request preempted twice counts twice) and
    # the computed KV tokens those preemptions discarded (computed again unless found cached)
    preemptions: int = 0
    preempted_tokens: int = 0
    # quantiles of the per-request TBT tail (None: the replay did not track token intervals;
    # NaN: no served request has two tokens)
    tbt_p50_s: float | None = None
    tbt_p99_s: float | None = None
    # energy (kvtier.sim.energy; None: not computed, as for metrics made without a deployment):
    # the facility's joules over the replay (IT energy x PUE), per served token and tokens per
    # joule, the mean power, joules by part, and the electricity's $ per hour, which
    # ``cost_per_hour`` (and so ``cost_per_mtok``) includes
    energy_j: float | None = None
    joules_per_token: float | None = None
    tokens_per_joule: float | None = None
    power_w: float | None = None
    energy_parts_j: dict[str, float] = field(default_factory=dict)
    electricity_per_hour: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, **kwargs: Any) -> str:
        return json.dumps(self.to_dict(), allow_nan=True, **kwargs)

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Metrics:
        names = {f.name for f in fields(cls)}
        return cls(**{k: v for k, v in data.items() if k in names})

    @classmethod
    def from_json(cls, text: str) -> Metrics:
        return cls.from_dict(json.loads(text))

    def same_as(self, other: Metrics) -> bool:
        """Equality that treats NaN as equal to NaN and ignores the engine name."""
        a, b = self.to_dict(), other.to_dict()
        a.pop("engine"), b.pop("engine")
        return _nan_equal(a, b)


def _nan_equal(a: Any, b: Any) -> bool:
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_nan_equal(a[k], b[k]) for k in a)
    if isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b):
        return True
    return a == b


def _quantiles(x: np.ndarray, qs: tuple[float, ...], w: np.ndarray | None = None) -> list[float]:
    """Linear-interpolation quantiles (NaN for no data), in one partition of ``x``; with
    weights ``w``, the weighted ``inverted_cdf`` quantiles (NaN when no value weighs)."""
    if not len(x):
        return [math.nan] * len(qs)
    if w is None:
        return [float(v) for v in np.quantile(x, qs, method="linear")]
    if not w.sum() > 0:
        return [math.nan] * len(qs)
    return [float(v) for v in np.quantile(x, qs, weights=w, method="inverted_cdf")]


def _mean(x: np.ndarray, w: np.ndarray | None = None) -> float:
    """The mean of ``x`` (NaN for no data), weighted by ``w`` when given."""
    if not len(x):
        return math.nan
    if w is None:
        return float(np.mean(x))
    return float(np.average(x, weights=w)) if w.sum() > 0 else math.nan


def request_weights(trace: BlockedTrace) -> np.ndarray | None:
    """Per request, its post-stratification weight when ``trace`` is a sample with strata
    (:meth:`kvtier.trace.strata.SampleStrata.weights`), else None (every request counts once)."""
    if trace.sample_strata is None:
        return None
    return trace.sample_strata.weights(trace.input_tokens)


def _part(w: np.ndarray | None, mask: np.ndarray) -> np.ndarray | None:
    return None if w is None else w[mask]


def request_ttft(trace: BlockedTrace, raw: RawResult) -> np.ndarray:
    """Per request, first token - arrival (NaN without a first token)."""
    return raw.first_token_s - trace.arrival_s


def request_tpot(trace: BlockedTrace, raw: RawResult) -> np.ndarray:
    """Per request, (finish - first token) / (output_tokens - 1): NaN if unfinished, and NaN
    for an answer of fewer than two tokens, which has no time between tokens (not 0)."""
    out = trace.output_tokens
    gen = raw.finish_s - raw.first_token_s
    return np.where(out >= 2, gen / np.maximum(1, out - 1), math.nan)


def effective_share(
    trace: BlockedTrace, raw: RawResult, ttft_max_s: float, tbt_max_s: float
) -> float:
    """Mooncake's effective request share (FAST'25, 5.1): of all requests, those whose TTFT is
    at most ``ttft_max_s`` and whose TBT tail is at most ``tbt_max_s``. A rejected or
    unfinished request fails; a served one of a single token has no interval and meets the
    TBT bound. Needs a replay that tracked token intervals.

    A share of requests is a per-request statistic like ``slo_attainment``: on a sample with
    strata each request counts with its post-stratification weight, so the share estimates the
    full trace's rather than the sample's mix of prompt lengths (unweighted otherwise)."""
    if raw.tbt_tail_s is None:
        raise ValueError("effective_share needs a replay with track_tbt (RawResult.tbt_tail_s)")
    n = trace.n_requests
    if not n:
        return math.nan
    ttft_ok = np.nan_to_num(request_ttft(trace, raw), nan=math.inf) <= ttft_max_s
    return request_share(trace, ttft_ok & meets_tbt(trace, raw, tbt_max_s, raw.tbt_tail_s))


def request_share(trace: BlockedTrace, ok: np.ndarray) -> float:
    """The share of ``trace``'s requests for which ``ok`` (one bool per request) holds, each
    request weighted by :func:`request_weights` (NaN for no request): the one definition the
    SLO attainment and the effective share use, so both weigh a sample's requests alike."""
    if not len(ok):
        return math.nan
    w = request_weights(trace)
    if w is None:
        return float(ok.mean())
    return _mean(ok.astype(np.float64), w)


def compute_metrics(
    trace: BlockedTrace,
    raw: RawResult,
    *,
    cost_per_hour: float,
    slo: SLO | None = None,
    engine: str = "",
    tiers: TierConfig | None = None,
) -> Metrics:
    """Turn per-request times into :class:`Metrics` (the same code for both simulators).

    With ``tiers``, blocks loaded from a lower tier count as saved prefill tokens and as that
    tier's hits (``hit_ratio_tokens[name]``: its tokens over admitted prompt tokens).

    A trace with strata (a sample) has its per-request latency statistics post-stratified
    (TTFT mean and quantiles, TPOT mean and P99, E2E mean, TBT quantiles, SLO attainment):
    they estimate the full trace's distribution, which the sample's mix of long and short
    prompts misstates. Throughput, cost, hit ratios and tier counts stay unweighted: they are
    totals or ratios of totals over the replayed cluster, which the sample's replay already
    scales to per-instance figures (fewer instances for fewer requests); weighting requests
    would not make the simulated cluster serve a different load.
    """
    n = trace.n_requests
    served = ~np.isnan(raw.finish_s)
    has_first = ~np.isnan(raw.first_token_s)
    rejected = raw.instance < 0
    arrival = trace.arrival_s
    out = trace.output_tokens
    inp = trace.input_tokens
    ttft = request_ttft(trace, raw)[has_first]
    timed = served & (trace.output_tokens >= 2)  # a TPOT exists: two tokens or more
    tpot = request_tpot(trace, raw)[timed]
    e2e = raw.finish_s[served] - arrival[served]
    w = request_weights(trace)
    if n and served.any():
        duration = float(np.max(raw.finish_s[served]) - arrival[0])
    else:
        duration = raw.end_s - (float(arrival[0]) if n else 0.0)
    tokens = int(inp[served].sum() + out[served].sum())
    n_served = int(served.sum())
    rps = n_served / duration if duration > 0 else math.nan
    tps = tokens / duration if duration > 0 else math.nan
    B = trace.block_tokens
    hbm_saved = int(raw.hit_blocks.sum()) * B
    admitted_input = int(inp[raw.instance >= 0].sum())
    hit_ratio = {"hbm": hbm_saved / admitted_input if admitted_input else 0.0}
    tier_fields: dict[str, Any] = {}
    saved = hbm_saved
    if tiers is not None and len(raw.tier_hit_blocks):
        names = tiers.names
        blocks = {x: int(v) for x, v in zip(names, raw.tier_hit_blocks, strict=True)}
        saved += sum(blocks.values()) * B
        for x in names:
            hit_ratio[x] = blocks[x] * B / admitted_input if admitted_input else 0.0
        load = raw.load_s if raw.load_s is not None else np.zeros(n)
        ttft_sum = float(ttft.sum())
        span = duration if duration > 0 else math.nan
        tier_fields = {
            "tier_hit_blocks": blocks,
            "tier_hit_tokens": {x: v * B for x, v in blocks.items()},
            "tier_bytes_read": dict(zip(names, map(float, raw.tier_bytes_read), strict=True)),
            "tier_bytes_written": dict(zip(names, map(float, raw.tier_bytes_written), strict=True)),
            "link_utilisation": {
                x: float(b) / span for x, b in zip(tiers.link_names, raw.link_busy_s, strict=True)
            },
            "load_share_of_ttft": float(load[has_first].sum()) / ttft_sum if ttft_sum > 0 else 0.0,
        }
    n_inst = len(raw.busy_s)
    busy = float(raw.busy_s.sum()) / (n_inst * duration) if duration > 0 and n_inst else math.nan
    cost_mtok = cost_per_hour / (tps * 3600 / 1e6) if tps and tps > 0 else math.inf
    w_ttft = _part(w, has_first)
    ttft_p50, ttft_p90, ttft_p99, ttft_p999 = _quantiles(ttft, (0.5, 0.9, 0.99, 0.999), w_ttft)
    tbt_p50 = tbt_p99 = None
    if raw.tbt_tail_s is not None:
        two = served & (out >= 2)
        tbt_p50, tbt_p99 = _quantiles(raw.tbt_tail_s[two], (0.5, 0.99), _part(w, two))
    extra: dict[str, Any] = {}
    if trace.sample_strata is not None:
        extra["latency_weighting"] = trace.sample_strata.describe()
    metrics = Metrics(
        n_requests=n,
        n_served=n_served,
        n_rejected=int(rejected.sum()),
        ttft_mean_s=_mean(ttft, w_ttft),
        ttft_p50_s=ttft_p50,
        ttft_p90_s=ttft_p90,
        ttft_p99_s=ttft_p99,
        ttft_p999_s=ttft_p999,
        tpot_mean_s=_mean(tpot, _part(w, timed)),
        tpot_p99_s=_quantiles(tpot, (0.99,), _part(w, timed))[0],
        e2e_mean_s=_mean(e2e, _part(w, served)),
        throughput_rps=rps,
        throughput_tps=tps,
        hit_ratio_tokens=hit_ratio,
        prefill_tokens_saved=saved,
        gpu_busy_fraction=busy,
        cost_per_hour=cost_per_hour,
        cost_per_mtok=cost_mtok,
        duration_s=duration,
        n_iterations=raw.n_iterations,
        instances=n_inst,
        early_stopped=raw.early_stopped,
        engine=engine,
        extra=extra,
        preemptions=int(raw.preemptions.sum()) if raw.preemptions is not None else 0,
        preempted_tokens=(
            int(raw.preempted_tokens.sum()) if raw.preempted_tokens is not None else 0
        ),
        tbt_p50_s=tbt_p50,
        tbt_p99_s=tbt_p99,
        **tier_fields,
    )
    if slo is None or slo.is_empty():
        return metrics
    if slo.tbt_p99_s is not None and raw.tbt_tail_s is None:
        raise ValueError("an SLO with tbt_p99_s needs a replay that tracked token intervals")
    ok = requests_meeting(slo, trace, raw, raw.first_token_s - arrival)
    return Metrics(
        **{
            **metrics.__dict__,
            "slo_met": slo_met(metrics, slo),
            "slo_attainment": request_share(trace, ok),
        }
    )
